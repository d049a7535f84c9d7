"""The weight-only products (int8, int4; one row of a plain bf16/fp16 product):
packing, quantizing, the reference the GPU kernel is held to, the kernels' own code run by
Triton's interpreter, and an int4 model against its unquantized self (the measure of
test_fp8_engine)."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
from interpreter import run_interpreted
from runner_helpers import FORCED, against_unquantized
from test_fast_engine import PROMPTS, tiny_model

from hymt_serve.engine.kernels import weight_only
from hymt_serve.engine.kernels.quantized import quantize_int8_rows


def test_int4_packing_round_trips_every_nibble() -> None:
    torch.manual_seed(0)
    values = torch.randint(0, 16, (64, 24), dtype=torch.int32)
    values[7::8] = 15  # the top nibble set: the int32 is negative
    packed = weight_only.pack_int4(values)
    assert packed.shape == (8, 24) and packed.dtype == torch.int32
    assert (packed < 0).any()
    torch.testing.assert_close(weight_only.unpack_int4(packed), values)
    word = int(packed[1, 3]) & 0xFFFFFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == values[8:16, 3].tolist()


def test_int4_groups_quantize_within_half_a_step() -> None:
    torch.manual_seed(1)
    weight = torch.randn(48, 256) * torch.logspace(-3, 1, 48)[:, None]
    q, scale = weight_only.quantize_int4_groups(weight)
    assert q.shape == (32, 48) and scale.shape == (2, 2, 48) and scale.dtype == torch.float16
    assert (scale[1] == 8).all()
    back = weight_only.dequantize(q, scale)
    step = scale[0].float().repeat_interleave(128, dim=0).T  # [out, in]
    assert ((back - weight).abs() <= step * 0.51).all()  # +7.5 steps clamps to +7


def test_an_input_dimension_short_of_a_group_makes_one_group() -> None:
    q, scale = weight_only.quantize_int4_groups(torch.randn(16, 64))
    assert q.shape == (8, 16) and scale.shape == (2, 1, 16)
    with pytest.raises(ValueError, match="divisible by 8"):
        weight_only.quantize_int4_groups(torch.randn(16, 60))


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_the_products_are_the_dequantized_weight_s(form: str) -> None:
    torch.manual_seed(2)
    x, weight = torch.randn(5, 256), torch.randn(40, 256)
    q, scale = (
        quantize_int8_rows(weight) if form == "int8" else weight_only.quantize_int4_groups(weight)
    )
    expected = x.double() @ weight_only.dequantize(q, scale).double().T
    torch.testing.assert_close(
        weight_only.linear(x, q, scale).double(), expected, rtol=1e-5, atol=1e-5
    )


def test_an_int4_model_stays_close_to_the_unquantized_one() -> None:
    """16 levels per group move a model further than int8's 255 per row (test_int8_engine:
    0.99 on average; here 0.93, at least 0.89, measured 2026-12-01); a wrong group, zero
    point or packing gives a cosine near 0."""
    dense, int4, cosine = against_unquantized(tiny_model(), PROMPTS, FORCED, "int4")
    assert int4.weights.layers[0].gate_up.dtype == torch.int32
    described = int4.describe()
    assert described["projections"] == "int4 weight-only, a scale and zero point per 64 inputs"
    assert described["projection_kernel"] == "dequantized reference"
    assert described["weight_bytes"] < dense.describe()["weight_bytes"]
    assert cosine.mean() >= 0.9 and cosine.min() >= 0.85, cosine


# The kernels' Triton code, run by Triton's interpreter on the CPU (fp16: the interpreter
# computes in NumPy, which has no bf16). The GPU tests run the same code compiled.
KERNEL_CHECK = textwrap.dedent(
    """
    from hymt_serve.engine.kernels import weight_only as wo
    from hymt_serve.engine.kernels.quantized import quantize_int8_rows

    torch.manual_seed(0)
    errors = []
    for form in ("int8", "int4"):
        for rows, cols, inputs in ((1, 200, 256), (5, 64, 384), (17, 96, 256), (70, 130, 512)):
            weight = torch.randn(cols, inputs)
            if form == "int8":
                q, scale = quantize_int8_rows(weight)
            else:
                q, scale = wo.quantize_int4_groups(weight)
            kind = wo.kind_of(q)
            group = inputs // scale.shape[1] if form == "int4" else 0
            x = torch.randn(rows, inputs).half()
            expected = torch.nn.functional.linear(x.float(), wo.dequantize(q, scale))
            configs = [wo.config_for(kind, rows), wo.Config(1, 32, 128, 4, 3, 264)]
            for config in configs[: 2 if rows < 6 else 1]:
                for splits in (1, 2, 3):
                    parts = wo.launch(x, q, scale, kind, group, splits, config)
                    out = parts.sum(0) * (scale if form == "int8" else 1)
                    error = ((out - expected).abs().max() / expected.abs().max()).item()
                    errors.append([form, rows, cols, inputs, config.block_m, splits, error])
    for rows, cols, inputs in ((17, 96, 256), (70, 130, 512)):  # int4 above 16 rows: deep
        q, scale = wo.quantize_int4_groups(torch.randn(cols, inputs))
        x = torch.randn(rows, inputs).half()
        expected = torch.nn.functional.linear(x.float(), wo.dequantize(q, scale))
        for block_k, splits in ((64, 1), (128, 3)):
            config = wo.Config(32, 32, block_k, 4, 1, 8)
            parts = wo.launch(x, q, scale, wo.INT4, 128, splits, config)
            error = ((parts.sum(0) - expected).abs().max() / expected.abs().max()).item()
            errors.append(["int4-deep", rows, cols, inputs, block_k, splits, error])
    print(json.dumps(errors))
    """
)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_the_kernels_compute_the_reference_product_in_triton_s_interpreter() -> None:
    """Both kernels (tiled and one-row), both forms, split inputs, edges that are not whole
    tiles (200 columns, 17 rows, an input split into 3 uneven parts)."""
    results = run_interpreted(KERNEL_CHECK, timeout=600)
    # forms x (small cases x configs x splits + larger cases x splits), then int4 deep: 4
    assert len(results) == 2 * (2 * 3 * 2 + 2 * 3) + 4
    worst = max(results, key=lambda r: r[-1])
    assert worst[-1] < 1e-5, worst  # fp32 accumulation of fp16 inputs


# int8's one row on CUDA cores (int8_row) loads a weight's row as words of 4 inputs and the
# input row 4 inputs at a time: a row at an odd offset is copied, a weight whose rows are not
# whole words takes the tiled kernel; whole tiles and blocks (64 by 256, one split) load
# without masks (EVEN).
INT8_ROW_CHECK = textwrap.dedent(
    """
    from hymt_serve.engine.kernels import weight_only as wo
    from hymt_serve.engine.kernels.quantized import quantize_int8_rows

    torch.manual_seed(0)
    found = []
    for cols, inputs, offset in ((64, 256, 0), (72, 256, 0), (72, 256, 1), (72, 390, 0)):
        q, scale = quantize_int8_rows(torch.randn(cols, inputs))
        x = torch.randn(1, inputs + offset).half()[:, offset:]
        want = x.float() @ q.float().T
        for splits in (1, 3):
            parts = wo.launch(x, q, scale, wo.INT8, 0, splits, wo.Config(1, 32, 64, 2, 1, 64))
            error = ((parts.sum(0) - want).abs().max() / want.abs().max()).item()
            found.append([cols, inputs, offset, splits, error])
    print(json.dumps(found))
    """
)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_int8_s_one_row_on_cuda_cores_copies_or_falls_back_where_words_do_not_fit() -> None:
    results = run_interpreted(INT8_ROW_CHECK, timeout=600)
    assert len(results) == 8
    worst = max(results, key=lambda r: r[-1])
    assert worst[-1] < 1e-5, worst  # fp32 accumulation of fp16 inputs


# The kernels inside a compiled function with a dynamic batch, as the engine's step functions
# run them, counting the graphs dynamo builds for 1, 2-16 and more rows (int4's larger batches:
# the tiled kernel and the sum over its splits up to 16 rows, the widening kernel above).
COMPILED_GRAPHS = textwrap.dedent(
    """
    import torch.nn.functional as F
    from hymt_serve.engine.kernels import weight_only as wo
    from hymt_serve.engine.kernels.quantized import QUANTIZERS

    wo.kernel_available = lambda x: True  # the interpreter runs the kernels on CPU tensors
    found = {}
    for form in ("int8", "int4"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        q, scale = QUANTIZERS[form](torch.randn(96, 256) * 0.02)
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        def project(x):
            return F.silu(wo.linear(x, q, scale)) + 1

        compiled = torch.compile(project, backend=backend, fullgraph=True)
        worst = 0.0
        for rows in (1, 2, 5, 16, 17, 40):
            x = torch.randn(rows, 256).half()
            if rows > 1:
                torch._dynamo.maybe_mark_dynamic(x, 0)
            got = compiled(x).float()
            want = F.silu(wo.reference(x.float(), q, scale)) + 1
            worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
        found[form] = [len(graphs), worst]
    print(json.dumps(found))
    """
)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_int8_and_int4_compile_the_graphs_bf16_does_with_a_dynamic_batch() -> None:
    """int8's split of the input does not depend on the rows, and int4 picks its path for
    more than one row inside its op, so one graph serves every batch above 1 (as for bf16)."""
    found = run_interpreted(COMPILED_GRAPHS, timeout=600)
    assert found["int8"][0] == 2 and found["int4"][0] == 2, found
    assert max(found["int8"][1], found["int4"][1]) < 5e-3, found  # fp16 output rounding


# One row of a plain product (a batch-1 decode step's projections) in the tiled kernel, run by
# the interpreter: the kernel alone over uneven splits, then through the engine's ``linear``
# inside a compiled function with a dynamic batch (one row: the kernel; more: F.linear).
PLAIN_ROW = textwrap.dedent(
    """
    import torch.nn.functional as F
    from hymt_serve.engine.kernels import weight_only as wo
    from hymt_serve.engine.kernels.quantized import linear

    wo.kernel_available = lambda x: True  # the interpreter runs the kernels on CPU tensors
    torch.manual_seed(0)
    empty = torch.empty(0)
    errors, ops = [], []
    for cols, inputs in ((200, 256), (70, 384)):
        weight = (torch.randn(cols, inputs) * 0.05).half()
        x = torch.randn(1, inputs).half()
        want = F.linear(x.float(), weight.float())
        for splits in (1, 3):
            parts = wo.launch(x, weight, weight, wo.PLAIN, 0, splits, wo.PLAIN_ROW_CONFIG)
            errors.append(((parts.sum(0) - want).abs().max() / want.abs().max()).item())
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        ops.append(sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
        return gm.forward

    def project(x):
        return F.silu(linear(x, weight, empty, empty)) + 1

    compiled = torch.compile(project, backend=backend, fullgraph=True)
    for rows in (1, 2, 5, 17):
        x = torch.randn(rows, inputs).half()
        if rows > 1:
            torch._dynamo.maybe_mark_dynamic(x, 0)
        got = compiled(x).float()
        want = F.silu(F.linear(x.float(), weight.float())) + 1
        errors.append(((got - want).abs().max() / want.abs().max()).item())
    wo.set_plain_row_kernel("cublas")
    off = wo.plain_row_applies(torch.randn(1, inputs).half(), weight)
    print(json.dumps({"errors": errors, "graphs": len(graphs), "ops": ops, "off": off}))
    """
)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_one_row_of_a_plain_product_runs_in_the_tiled_kernel() -> None:
    found = run_interpreted(PLAIN_ROW, timeout=600)
    assert max(found["errors"][:4]) < 1e-5, found  # the kernel: fp32 sums of fp16 products
    assert max(found["errors"][4:]) < 5e-3, found  # compiled, fp16 output rounding
    assert found["graphs"] == 2, found  # batch 1, and one for every larger batch
    one_row, more = found["ops"]
    assert any("hymt.weight_only" in op for op in one_row), one_row
    assert not any("hymt" in op for op in more), more
    assert found["off"] is False


def test_the_plain_row_kernel_setting_names_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_only, "_plain_row_kernel", "triton")
    with pytest.raises(ValueError, match="one_row_kernel must be one of"):
        weight_only.set_plain_row_kernel("cutlass")
    assert weight_only.plain_row_kernel() == "triton"
    weight_only.set_plain_row_kernel("cublas")
    assert weight_only.plain_row_kernel() == "cublas"


def test_int8_takes_its_split_from_the_row_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """One row of an int8 product is split by the one-row tiles, more rows by the few-rows
    tiles, so a tile sweep's one-row config governs the batch-1 step."""
    one_row = weight_only.Config(16, 64, 128, 4, 3, 4096)
    few_rows = weight_only.Config(16, 64, 256, 4, 3, 64)
    monkeypatch.setitem(weight_only.ONE_ROW_CONFIGS, weight_only.INT8, one_row)
    monkeypatch.setitem(weight_only.FEW_ROWS_CONFIGS, weight_only.INT8, few_rows)
    monkeypatch.setattr(weight_only, "kernel_available", lambda x: True)
    splits_seen = []

    def launch(x, weight, scale, kind, group, splits, config):  # type: ignore[no-untyped-def]
        splits_seen.append(splits)
        full = x.float() @ weight.float().T
        return torch.stack([full / splits] * splits)  # split parts that sum to the product

    monkeypatch.setattr(weight_only, "launch", launch)
    torch.manual_seed(0)
    q, scale = quantize_int8_rows(torch.randn(128, 1024) * 0.02)
    for rows in (1, 3):
        x = torch.randn(rows, 1024).half()
        got = weight_only.linear(x, q, scale).float()
        want = weight_only.reference(x.float(), q, scale)
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    expected = [weight_only.splits_for(q, one_row), weight_only.splits_for(q, few_rows)]
    assert splits_seen == expected and expected[0] != expected[1], splits_seen


def test_int4_s_one_row_takes_the_tiles_of_its_inputs_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bf16 inputs take int4's bf16-pair arithmetic on the one-row tiles, fp16 inputs the fp32
    arithmetic on the tiles measured fastest for it: each one row is split by its own."""
    monkeypatch.setattr(weight_only, "kernel_available", lambda x: True)
    seen = []

    def launch(x, weight, scale, kind, group, splits, config):  # type: ignore[no-untyped-def]
        seen.append((x.dtype, splits, config))
        return torch.stack([x.float() @ weight_only.dequantize(weight, scale).T / splits] * splits)

    monkeypatch.setattr(weight_only, "launch", launch)
    torch.manual_seed(0)
    q, scale = weight_only.quantize_int4_groups(torch.randn(4096, 4096) * 0.02)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(1, 4096).to(dtype)
        got = weight_only.linear(x, q, scale).float()
        torch.testing.assert_close(
            got, weight_only.reference(x.float(), q, scale), rtol=2e-2, atol=2e-2
        )
    bf16 = weight_only.ONE_ROW_CONFIGS[weight_only.INT4]
    fp16 = weight_only.FP16_ONE_ROW_CONFIGS[weight_only.INT4]
    expected = [
        (torch.bfloat16, weight_only.splits_for(q, bf16), bf16),
        (torch.float16, weight_only.splits_for(q, fp16), fp16),
    ]
    assert seen == expected and bf16 != fp16, seen


def test_int4_s_words_tile_takes_its_own_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The [words, columns] tile, picked for A/B runs, brings the tiles it was measured on;
    the chain kernel (the engine's) its own; fp16 inputs keep theirs either way."""
    int4 = weight_only.INT4
    chain = weight_only.config_for(int4, 1, torch.bfloat16)
    assert chain == weight_only.ONE_ROW_CONFIGS[int4]
    monkeypatch.setattr(weight_only, "INT4_BF16_ROW", "words")
    assert weight_only.config_for(int4, 1, torch.bfloat16) == weight_only.INT4_WORDS_ROW_CONFIG
    assert chain != weight_only.INT4_WORDS_ROW_CONFIG
    fp16 = weight_only.FP16_ONE_ROW_CONFIGS[int4]
    assert weight_only.config_for(int4, 1, torch.float16) == fp16


def test_int4_s_shape_tiles_reach_the_chain_kernel_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape's entry in INT4_ROW_SHAPE_CONFIGS is int4's one row with bf16 inputs (the
    chain kernel); other shapes, fp16 inputs, the words tile and more rows keep their tiles."""
    int4, shape = weight_only.INT4, (28672, 4096)
    own = weight_only.Config(1, 128, 64, 1, 1, 1792)
    monkeypatch.setitem(weight_only.INT4_ROW_SHAPE_CONFIGS, shape, own)
    assert weight_only.config_for(int4, 1, torch.bfloat16, shape) == own
    chain = weight_only.ONE_ROW_CONFIGS[int4]
    assert weight_only.config_for(int4, 1, torch.bfloat16, (4096, 4096)) == chain
    fp16 = weight_only.FP16_ONE_ROW_CONFIGS[int4]
    assert weight_only.config_for(int4, 1, torch.float16, shape) == fp16
    assert (
        weight_only.config_for(int4, 2, torch.bfloat16, shape) == weight_only.FEW_ROWS_CONFIGS[int4]
    )
    monkeypatch.setattr(weight_only, "INT4_BF16_ROW", "words")
    assert (
        weight_only.config_for(int4, 1, torch.bfloat16, shape) == weight_only.INT4_WORDS_ROW_CONFIG
    )


def test_int8_s_one_row_takes_the_tiles_measured_for_its_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 7B's attention-output and gate_up shapes take their own one-row tiles (and so their
    own split); other shapes and more rows the tiles of their row class."""
    monkeypatch.setattr(weight_only, "kernel_available", lambda x: True)
    seen = []

    def launch(x, weight, scale, kind, group, splits, config):  # type: ignore[no-untyped-def]
        seen.append((weight.shape, x.shape[0], splits, config))
        return torch.stack([x.float() @ weight.float().T / splits] * splits)

    monkeypatch.setattr(weight_only, "launch", launch)
    torch.manual_seed(0)
    for shape in ((4096, 4096), (28672, 4096), (6144, 4096)):
        q, scale = quantize_int8_rows(torch.randn(*shape) * 0.02)
        for rows in (1, 2):
            x = torch.randn(rows, shape[1]).half()
            got = weight_only.linear(x, q, scale).float()
            want = weight_only.reference(x.float(), q, scale)
            torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    own = weight_only.INT8_ROW_SHAPE_CONFIGS
    one_row = weight_only.ONE_ROW_CONFIGS[weight_only.INT8]
    few = weight_only.FEW_ROWS_CONFIGS[weight_only.INT8]
    expected = []
    for shape in ((4096, 4096), (28672, 4096), (6144, 4096)):
        config = own.get(shape, one_row)
        dummy = torch.empty(shape, dtype=torch.int8)
        expected += [(torch.Size(shape), 1, weight_only.splits_for(dummy, config), config)]
        expected += [(torch.Size(shape), 2, weight_only.splits_for(dummy, few), few)]
    assert seen == expected, seen
    assert own[(4096, 4096)] != one_row and (6144, 4096) not in own
