"""The weight-only kernel (int8, int4) on the GPU: against the dequantized reference, inside a
compiled function with a dynamic batch, and 7B-shaped models quantized at load against their
bf16 selves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from runner_helpers import against_unquantized
from test_fast_engine_gpu import PROMPTS

from hymt_serve.engine.kernels import weight_only
from hymt_serve.engine.kernels.quantized import QUANTIZERS
from hymt_serve.engine.models.decoder import rms_norm
from hymt_serve.ops.tiny_model import random_7b_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
]


@pytest.mark.parametrize("form", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 64, 300])
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 4096), (4096, 14336), (200, 384)])
def test_the_kernel_matches_the_dequantized_reference(
    form: str, rows: int, shape: tuple[int, int]
) -> None:
    torch.manual_seed(rows)
    weight = torch.randn(*shape, device="cuda") * 0.02
    q, scale = QUANTIZERS[form](weight)
    x = torch.randn(rows, shape[1], device="cuda", dtype=torch.bfloat16)
    ours = weight_only.linear(x, q, scale)
    reference = weight_only.reference(x.float(), q, scale)
    assert ours.dtype == torch.bfloat16 and ours.shape == (rows, shape[0])
    error = (ours.float() - reference).norm() / reference.norm()
    assert error < 1e-2  # bf16 output rounding and the accumulation order


@pytest.mark.parametrize(
    "config",
    [
        weight_only.Config(1, 128, 32, 1, 1, 2112),  # one warp, a stream of 4 words
        weight_only.Config(1, 128, 512, 8, 1, 256),  # eight streams of 8 words, two chains
        weight_only.Config(1, 256, 256, 4, 1, 132),  # 8 words a stream, two chains
    ],
)
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336), (200, 384)])
def test_int4_s_chain_kernel_matches_the_reference_on_each_tile(
    config: weight_only.Config, shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """int4_chain_kernel on tiles of one and more warps (streams), rows of a strided input,
    and a weight smaller than one block (384 inputs against 512: masked streams): within the
    bound of the product through linear, and not further from the reference than the
    [words, columns] tile it replaced by more than the chains' bf16 rounding allows."""
    torch.manual_seed(shape[0])
    q, scale = QUANTIZERS["int4"](torch.randn(*shape, device="cuda") * 0.02)
    x = torch.randn(3, shape[1] + 2, device="cuda", dtype=torch.bfloat16)[:, 2:]
    group = shape[1] // scale.shape[1]
    splits = weight_only.splits_for(q, config)
    parts = weight_only.launch_chain(x, q, scale, group, splits, config)
    assert parts.shape == (splits, 3, shape[0]) and parts.dtype == torch.float32
    reference = weight_only.reference(x.float(), q, scale)
    error = ((parts.sum(0) - reference).norm() / reference.norm()).item()
    monkeypatch.setattr(weight_only, "INT4_BF16_ROW", "words")
    words_config = weight_only.INT4_WORDS_ROW_CONFIG
    words = weight_only.launch(
        x[:1].contiguous(), q, scale, weight_only.INT4, group,
        weight_only.splits_for(q, words_config), words_config,
    )  # fmt: skip
    words_error = ((words.sum(0) - reference[:1]).norm() / reference[:1].norm()).item()
    assert error < 1e-2 and error < 4 * words_error, (error, words_error)


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_int8_with_fp16_inputs_matches_the_reference(rows: int) -> None:
    """fp16 inputs (an fp16 model) at every row class: the widening by int8_as_fp16."""
    torch.manual_seed(rows)
    q, scale = QUANTIZERS["int8"](torch.randn(4096, 4096, device="cuda") * 0.02)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.float16)
    ours = weight_only.linear(x, q, scale)
    reference = weight_only.reference(x.float(), q, scale)
    assert ours.dtype == torch.float16
    assert (ours.float() - reference).norm() / reference.norm() < 1e-2


@pytest.mark.parametrize(
    "config",
    [
        weight_only.Config(1, 64, 256, 4, 1, 528),
        weight_only.Config(1, 128, 128, 8, 1, 264),
        weight_only.Config(1, 128, 256, 2, 1, 1056),
    ],
)
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336), (200, 388)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_s_one_row_on_cuda_cores_sums_the_int8_products_exactly(
    config: weight_only.Config, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    """int8_row (int8_word_fma's widening in PTX) on tiles of 2-8 warps, a row at an offset
    of 2 inputs, and a weight of 388 inputs (97 words: masked blocks and uneven splits): its
    partial sums add up to the fp32 product of the int8 values, to fp32 accumulation."""
    torch.manual_seed(shape[0])
    q, _ = QUANTIZERS["int8"](torch.randn(*shape, device="cuda") * 0.02)
    x = torch.randn(1, shape[1] + 2, device="cuda", dtype=dtype)[:, 2:]
    splits = weight_only.splits_for(q, config)
    parts = weight_only.launch(x, q, q, weight_only.INT8, 0, splits, config)
    assert parts.shape == (splits, 1, shape[0]) and parts.dtype == torch.float32
    want = x.float() @ q.float().T
    assert ((parts.sum(0) - want).norm() / want.norm()).item() < 1e-5


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("shape", [(6144, 4096), (28672, 4096), (128256, 4096)])
def test_int8_takes_a_norms_bf16_output_as_fp16_with_the_same_sums(
    rows: int, shape: tuple[int, int]
) -> None:
    """fits_fp16 (a norm's output, ModelShape.norms_fit_fp16): one row takes the same values
    as fp16 on the same tiles, so the same sums to fp32 rounding (only inputs under 2^-14 lose
    bits); more rows stay bf16."""
    torch.manual_seed(rows)
    q, scale = QUANTIZERS["int8"](torch.randn(*shape, device="cuda") * 0.02)
    hidden = torch.randn(rows, shape[1], device="cuda", dtype=torch.bfloat16) * 30
    x = rms_norm(hidden, torch.rand(shape[1], device="cuda", dtype=torch.bfloat16) * 4, 1e-5)
    as_fp16 = weight_only.linear(x, q, scale, fits_fp16=True)
    as_bf16 = weight_only.linear(x, q, scale)
    reference = weight_only.reference(x.float(), q, scale)
    assert as_fp16.dtype == torch.bfloat16 and as_fp16.shape == (rows, shape[0])
    assert (as_fp16.float() - reference).norm() / reference.norm() < 1e-2
    assert (as_fp16.float() - as_bf16.float()).norm() / as_bf16.float().norm() < 1e-3
    if rows > 1:
        assert torch.equal(as_fp16, as_bf16)


@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336), (128256, 4096), (200, 384)])
def test_one_row_of_a_plain_product_matches_cublas(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int]
) -> None:
    monkeypatch.setattr(weight_only, "_plain_row_kernel", "triton")  # whatever loaded before
    torch.manual_seed(0)
    weight = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, shape[1], device="cuda", dtype=torch.bfloat16)
    assert weight_only.plain_row_applies(x, weight)
    ours = weight_only.plain_row(x, weight)
    reference = F.linear(x.float(), weight.float())
    assert ours.dtype == torch.bfloat16 and ours.shape == (1, shape[0])
    assert ((ours.float() - reference).norm() / reference.norm()) < 1e-2
    assert not weight_only.plain_row_applies(x.expand(2, -1), weight)  # more rows: cuBLAS


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_the_kernel_runs_inside_a_compiled_function_with_a_dynamic_batch(form: str) -> None:
    torch.manual_seed(0)
    torch._dynamo.reset()  # one compiled function per form
    q, scale = QUANTIZERS[form](torch.randn(1024, 512, device="cuda") * 0.02)

    def project(x: torch.Tensor) -> torch.Tensor:
        return F.silu(weight_only.linear(x, q, scale)) + 1

    compiled = torch.compile(project, fullgraph=True)
    for rows in (1, 5, 9, 40, 130):
        x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
        if rows > 1:
            torch._dynamo.maybe_mark_dynamic(x, 0)
        expected = project(x)
        assert torch.allclose(compiled(x).float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("form", "bound"), [("int8", 0.85), ("int4", 0.4)])
def test_a_7b_model_in_weight_only_form_stays_close_to_bf16(form: str, bound: float) -> None:
    """As for FP8 (test_fp8_gpu): random weights make a chaotic network, so the bound catches
    a projection gone wrong (a wrong scale, group or packing gives a cosine near 0), not a
    trained model's quality. int4 rounds to 16 levels per group of 128: it moves further
    (measured 2026-12-01: int4 0.48 on average, 0.41 at the least)."""
    forced = torch.tensor([[5, 77, 301, 9]] * len(PROMPTS), device="cuda")
    _, quantized, cosine = against_unquantized(
        random_7b_model("cuda"), PROMPTS, forced, form, max_batch_size=8, max_seq_len=128
    )
    info = quantized.describe()
    assert info["projection_kernel"].startswith("Triton weight-only kernel")
    assert info["cuda_graphs"] is True
    assert info["weight_bytes"] < (8.5e9 if form == "int8" else 5e9)  # bf16: 15.0 GB
    print(f"{form} vs bf16 logits cosine", cosine.tolist())
    assert cosine.mean() >= bound and cosine.min() >= bound - 0.05


def test_the_kernels_compiled_ahead_serve_every_row_count_with_no_compile_of_their_own() -> None:
    """hymt_serve.engine.kernels.ahead: the launches a plan records over the row classes compile in
    threads, and then products of any row count (of either form, one row's fp16 inputs
    included) launch what they compiled: Triton compiles nothing more, and nothing twice."""
    from hymt_serve.engine.kernels import ahead, weight_only_pairs
    from hymt_serve.engine.kernels import weight_only_triton as kernels

    torch.manual_seed(0)
    weights = [QUANTIZERS[f](torch.randn(384, 1024, device="cuda") / 50) for f in ("int8", "int4")]

    def plan() -> None:
        for q, scale in weights:
            for rows in weight_only.ROW_CLASSES:
                x = torch.empty(rows, 1024, device="cuda", dtype=torch.bfloat16)
                weight_only.linear(x, q, scale, fits_fp16=True)

    ours = (
        kernels.weight_only_kernel, kernels.one_row_kernel, kernels.widen_int4_kernel,
        kernels.sum_splits_kernel, weight_only_pairs.int4_chain_kernel,
    )  # fmt: skip
    for kernel in ours:
        kernel.device_caches.clear()  # (Triton's disk cache still serves: compiles are quick)

    def compiled() -> int:
        return sum(len(kernel.device_caches[torch.cuda.current_device()][0]) for kernel in ours)

    with ahead.compile_ahead(plan, torch.device("cuda")) as planned:
        assert planned >= 10
        for rows in (1, 5, 16, 20, 50, 100, 300):
            x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
            for q, scale in weights:
                out = weight_only.linear(x, q, scale, fits_fp16=True)
                reference = weight_only.reference(x.float(), q, scale)
                assert (out.float() - reference).norm() / reference.norm() < 1e-2
            if rows == 1:
                first = compiled()  # the first launch waited for the threads
        assert compiled() == first == planned
