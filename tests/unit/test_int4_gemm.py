"""The int4 tensor-core GEMM (hymt_serve.engine.kernels.int4_gemm) without a GPU.

The kernel runs in Triton's interpreter (in a fresh process: :mod:`interpreter`) against the
fp32 product of the dequantized weight, over row counts on each of its tiles (odd ones, one
row, more than a tile), column counts that are not whole tiles, groups of 128 and 256 inputs
and a single group, splits that divide the blocks unevenly or leave one empty, zero points
other than GPTQ's 8, bf16 and fp16 inputs at a row stride of their own. What the interpreter
cannot run, and so what only tests/gpu/test_int4_gemm_gpu.py checks: the widening's inline
PTX (here the same values come from Triton's shifts and float arithmetic) and bf16 tiles in
``tl.dot`` (Triton 3.5.1's interpreter multiplies them wrongly: here they multiply in fp32).

Without the interpreter: which path each row count and ``HYMT_INT4_KERNEL`` setting takes,
the splits, and that a plan records a launch of every tile the engine's row classes use.
"""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest
import torch
from interpreter import run_interpreted

from hymt_serve.engine.kernels import ahead, int4_gemm, weight_only
from hymt_serve.engine.kernels.weight_forms import quantize_int4_groups

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed"
)

LAUNCHES = """
from hymt_serve.engine.kernels import int4_gemm
from hymt_serve.engine.kernels.weight_forms import quantize_int4_groups, reference

errors = []
for rows, cols, inputs, group, splits, tile, dtype in json.loads(sys.argv[1]):
    torch.manual_seed(rows * 1000 + cols)
    q, scale = quantize_int4_groups(torch.randn(cols, inputs) * 0.05, group)
    scale[1] = torch.randint(0, 16, scale[1].shape).half()  # zero points other than 8
    x = torch.randn(rows, inputs + 8, dtype=getattr(torch, dtype))[:, 8:]  # a row stride
    tile = int4_gemm.TILES[tile][1]
    out = int4_gemm.launch(x, q, scale, group, splits, tile, parts=splits > 1)
    got = out.sum(0) if splits > 1 else out.float()
    want = reference(x.float(), q, scale)
    shape = [splits, rows, cols] if splits > 1 else [rows, cols]
    kind = "float32" if splits > 1 else dtype
    errors.append({
        "error": ((got - want).norm() / want.norm()).item(),
        "shape_ok": list(out.shape) == shape and str(out.dtype) == "torch." + kind,
    })

# linear end to end: one row's parts, the rows' op (its sum over splits), widening above 256
torch.manual_seed(0)
q, scale = quantize_int4_groups(torch.randn(96, 256) * 0.05, 128)
linear = {}
for rows in (1, 3, 40, 300):
    x = torch.randn(rows, 256, dtype=torch.float16)
    out = int4_gemm.linear(x, q, scale, 128)
    want = reference(x.float(), q, scale).float()
    assert out.dtype == torch.float16 and out.shape == (rows, 96)
    linear[rows] = ((out.float() - want).norm() / want.norm()).item()
print(json.dumps({"launches": errors, "linear": linear}))
"""

# rows, columns, inputs, group, splits, tile (index into TILES), dtype
CASES = [
    (1, 64, 256, 128, 2, 0, "bfloat16"),  # one row, two splits
    (5, 96, 512, 256, 3, 0, "float16"),  # uneven splits (2 blocks, 2 blocks, none... of 4)
    (16, 200, 256, 256, 1, 0, "bfloat16"),  # a full tile of rows, columns not whole tiles
    (17, 128, 256, 128, 3, 1, "bfloat16"),  # wgmma's tile, the third split empty
    (64, 136, 384, 384, 1, 1, "float16"),  # one group over all inputs (group_size -1)
    (70, 64, 256, 128, 2, 2, "bfloat16"),  # the tall tile, rows not a whole tile
    (130, 72, 256, 256, 1, 2, "bfloat16"),  # more rows than one tile
]


@pytest.fixture(scope="module")
def interpreted() -> dict[str, object]:
    """Every interpreted case in one process (each process costs seconds of imports)."""
    result: dict[str, object] = run_interpreted(LAUNCHES, CASES)
    return result


@needs_triton
def test_the_kernel_matches_the_dequantized_product_on_every_tile(
    interpreted: dict[str, list[dict[str, object]]],
) -> None:
    """Each case against the fp32 product of the dequantized weight: within bf16's rounding
    of the widened weights (and of a one-split output) and no more."""
    for case, result in zip(CASES, interpreted["launches"], strict=True):
        assert result["shape_ok"], case
        bound = 2e-3 if case[-1] == "float16" else 1e-2
        assert float(result["error"]) < bound, (case, result)  # type: ignore[arg-type]


@needs_triton
def test_linear_serves_one_row_more_rows_and_long_prompts_through_its_ops(
    interpreted: dict[str, dict[str, float]],
) -> None:
    """The custom ops end to end: one row's partial products summed by the caller, more rows
    summed by the op (its splits picked with the rows), above 256 rows the weight widened."""
    errors = interpreted["linear"]
    assert set(errors) == {"1", "3", "40", "300"}
    assert all(error < 2e-3 for error in errors.values()), errors


@pytest.mark.parametrize(
    ("setting", "one_row", "rows"),
    [("gemm", True, True), ("gemm-rows", False, True), ("legacy", False, False)],
)
def test_the_setting_picks_the_path_per_row_count(
    setting: str, one_row: bool, rows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYMT_INT4_KERNEL", setting)
    monkeypatch.setattr(int4_gemm, "_int4_kernel", None)
    assert int4_gemm.applies(1) is one_row
    assert int4_gemm.applies(2) is rows and int4_gemm.applies(128) is rows


def test_an_unknown_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYMT_INT4_KERNEL", "fast")
    monkeypatch.setattr(int4_gemm, "_int4_kernel", None)
    with pytest.raises(ValueError, match="HYMT_INT4_KERNEL must be one of"):
        int4_gemm.applies(1)
    with pytest.raises(ValueError, match="got 'fast'"):
        int4_gemm.set_int4_kernel("fast")


def test_the_splits_fill_the_gpu_in_whole_blocks() -> None:
    """A 7B's projections (out, in) on an H100's 132 SMs: one row's 64-column tiles reach two
    programs an SM, the wgmma tiles about one wave; gate_up (448 tiles) needs no split; a
    small weight splits no further than its blocks."""
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096)}
    weights = {name: torch.empty(i // 8, o, dtype=torch.int32) for name, (o, i) in shapes.items()}
    one, many = int4_gemm.tile_for(1), int4_gemm.tile_for(128)
    assert [int4_gemm.splits_for(w, 1, one) for w in weights.values()] == [4, 8, 1]
    assert [int4_gemm.splits_for(w, 128, many) for w in weights.values()] == [4, 4, 1]
    assert int4_gemm.splits_for(torch.empty(16, 64, dtype=torch.int32), 1, one) == 1
    assert int4_gemm.tile_for(16).block_m == 16 and int4_gemm.tile_for(17).block_m == 64
    assert int4_gemm.tile_for(65).block_m == 128 and int4_gemm.tile_for(256).block_m == 128


@needs_triton
@pytest.mark.parametrize("setting", ["gemm", "gemm-rows", "legacy"])
def test_a_plan_over_the_row_classes_records_each_settings_kernels(
    setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the engine compiles ahead for an int4 weight under each setting (recorded, not
    run): the GEMM's three tiles; one row on the CUDA-core chain kernel with ``gemm-rows``;
    the earlier kernels only with ``legacy``. Long prompts widen the weight either way."""
    monkeypatch.setattr(weight_only, "kernel_available", lambda x: True)  # the kernels' path
    monkeypatch.setattr(weight_only, "bf16_pairs", lambda x: x.dtype == torch.bfloat16)
    monkeypatch.setattr(int4_gemm, "_int4_kernel", setting)
    q, scale = quantize_int4_groups(torch.randn(512, 1024) * 0.05, 128)

    def plan() -> None:
        for rows in weight_only.ROW_CLASSES:
            weight_only.linear(torch.zeros(rows, 1024, dtype=torch.bfloat16), q, scale)

    launches = ahead.record(plan)
    names = Counter(kernel.fn.__name__ for kernel, *_ in launches)
    tiles = {
        kwargs["BLOCK_M"] for kernel, _, _, kwargs in launches
        if kernel.fn.__name__ == "int4_gemm_kernel"
    }  # fmt: skip
    assert names["widen_int4_kernel"] == 1
    if setting == "legacy":
        assert not tiles and names["int4_chain_kernel"] == 1 and names["weight_only_kernel"]
        return
    assert tiles == {16, 64, 128} and not names["weight_only_kernel"]
    assert names["int4_chain_kernel"] == (setting == "gemm-rows")
