"""ready_time.py's bookkeeping (the timing itself needs a GPU): counting what Triton compiled
into a cache folder, and the table's rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def ready_time() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "ready_time", REPO / "benchmarks/decode/ready_time.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compiles_are_counted_per_kernel_with_inductor_s_together(tmp_path: Path) -> None:
    # Triton's cache: one folder per compiled kernel (its hash), the binary named after it
    for folder, name in [
        ("a1", "prompt_kernel"),
        ("b2", "prompt_kernel"),
        ("c3", "weight_only_kernel"),
        ("d4", "triton_poi_fused_add_0"),
        ("e5", "triton_red_fused_mean_1"),
    ]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{name}.cubin").write_bytes(b"")
        (tmp_path / folder / f"{name}.json").write_text("{}")  # metadata: not a compile
    (tmp_path / "f6").mkdir()
    (tmp_path / "f6" / "cuda_utils.so").write_bytes(b"")  # the launcher: not a kernel
    counts = ready_time().triton_compiles(tmp_path)
    assert counts == {
        "inductor_kernels": 2,
        "our_kernels": {"prompt_kernel": 2, "weight_only_kernel": 1},
    }


def test_the_table_has_every_column_for_failed_and_measured_forms() -> None:
    module = ready_time()
    rows = [
        {"form": "none", "weight_gb": 15.0, "load_s": 3.0, "build_s": 34.0, "ready_s": 37.0,
         "inductor_kernels": 33, "our_kernels": {"prompt_kernel": 1}},
        {"form": "int4", "error": "Traceback ..."},
    ]  # fmt: skip
    table = module.markdown({"gpu": "GPU", "date": "today", "command": "python", "rows": rows})
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in lines}) == 1, lines
    assert "| 33; prompt_kernel 1 |" in lines[2]
