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


def test_rounds_are_compared_with_bf16_of_their_own_round_and_summarised_by_medians() -> None:
    module = ready_time()

    def row(round_: int, form: str, ready_s: float) -> dict[str, object]:
        return {"round": round_, "form": form, "weight_gb": 1.0, "load_s": 1.0,
                "build_s": ready_s - 1.0, "ready_s": ready_s}  # fmt: skip

    rows = [
        row(0, "none", 20.0), row(0, "int4+head", 30.0),  # 1.50
        row(1, "int4+head", 33.0), row(1, "none", 30.0),  # 1.10
        row(2, "none", 25.0), row(2, "int4+head", 25.0),  # 1.00
        {"round": 2, "form": "int8", "error": "Traceback ..."},
    ]  # fmt: skip
    table = module.markdown({"gpu": "GPU", "date": "today", "command": "python", "rows": rows})
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert "| 1 | int4+head | 1.0 | 1.0 | 32.0 | 33.0 | 1.10 |" in lines[4]
    summary = next(line for line in lines if line.startswith("| int4+head | 3 |"))
    assert summary == "| int4+head | 3 | 30.00 | 1.10 | 1.50, 1.10, 1.00 |"
    assert "| none | 3 | 25.00 | 1.00 |" in table
    assert not any(line.startswith("| int8 | ") for line in lines)  # failed: no summary


def test_the_warm_cache_table_sets_each_form_s_cold_and_warm_start_side_by_side() -> None:
    module = ready_time()
    warm_cache = {"reused": True, "fx_graph_hits": 12, "fx_graph_misses": 0}
    rows = [
        {"round": 0, "form": "none", "weight_gb": 15.0, "load_s": 3.0, "build_s": 34.0,
         "ready_s": 37.0, "inductor_kernels": 33, "our_kernels": {}},
        {"cache": "cold", "form": "none", "ready_s": 40.0, "compile_cache": {"reused": False}},
        {"cache": "warm", "form": "none", "ready_s": 10.0, "warmup_compile_s": 2.5,
         "capture_s": 4.0, "compile_cache": warm_cache},
        {"cache": "cold", "form": "fp8", "error": "Traceback ..."},
        {"cache": "warm", "form": "fp8", "ready_s": 12.0},
    ]  # fmt: skip
    table = module.markdown({"gpu": "H100", "date": "d", "command": "c", "rows": rows})
    assert "| none | 40.0 | 10.0 | 0.25 | True | 12 / 0 | 2.5 | 4.0 |" in table
    assert "| fp8 | failed: see ready.json | | | | | | |" in table
    assert table.count("| 0 | none |") == 1  # the cache rows stay out of the per-form table
