"""A mixture-of-experts layer's experts for a few tokens, pair by pair, in two Triton kernels.

Same contract as :func:`hymt_serve.engine.kernels.experts.grouped_experts`. At a decode step's
few tokens that path spends most of its time launching: a sort of the pairs, their counts and
offsets, a gather of the rows, two grouped GEMMs each with a prepare kernel, the SiLU product,
the weighting and the scatter back, some 20 launches a layer. With a few dozen (token, expert)
pairs nothing needs sorting: each pair reads its own expert's rows.

- :func:`gate_up_kernel`, one program per (pair, block of ``width``): the block's gate rows
  and the matching up rows of the pair's expert against its token's row, a product of one
  row on CUDA cores (fp32 sums), written as SiLU(gate) * up in the input's dtype to
  ``h [pairs, width]`` (the grouped path rounds its product to that dtype too).
- :func:`down_kernel`, one program per (token, block of ``hidden``): all of the token's k
  pairs at once, each its expert's block of ``down`` rows against ``h[pair]``, times the
  pair's weight, summed in fp32 and written to ``out [T, hidden]``. No atomics: the sum's
  order is fixed, so a token's output does not depend on its batch.

FP8 experts (e4m3 weights, one fp32 scale per expert and output row, see
:mod:`hymt_serve.engine.kernels.experts_fp8`) run in the same kernels, weight-only: each row's
sum over its e4m3 weights (read as one byte each, half of bf16's traffic) and the bf16 inputs is
multiplied by the row's scale once, after the reduction (a row's scale is common to all its
inputs, so this is the dequantized product exactly up to fp32 rounding).

The pairs vary fastest in the first grid and the tokens in the second, so programs that read
the same expert's rows (the shared expert, stacked as one more, is every token's) run side by
side and the repeats come from L2. Every shape is static and nothing is read back to the
host, so a CUDA graph captures both launches.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU image has no Triton; grouped_experts serves there
    triton = None
    tl = None

# Up to this many (token, expert) pairs the pair kernels run. Each pair reads its expert's
# rows whatever the others chose: HBM still serves each chosen expert about once (the repeats
# run side by side and come from L2), but L2 serves every pair. At Hy-MT2-30B-A3B's routing
# (8 of 128 plus the shared expert) 128 pairs are 14 tokens touching about 77 experts, some
# 0.72 GB of HBM a layer, while the pairs read 1.2 GB through L2: about where L2's bandwidth
# (roughly twice HBM's) stops hiding the repeats. Past it the grouped GEMMs, reading each
# expert once on tensor cores, should win. An estimate from those bytes, not a timing: timing
# both paths at each token count settles it.
MAX_PAIRS = 128


class Tiles(NamedTuple):
    """The kernels' tiles: rows of ``width`` (each of gate and up) and inputs per block of
    :func:`gate_up_kernel`; rows of ``hidden`` and inputs per block of :func:`down_kernel`;
    warps of each."""

    gate_rows: int
    gate_k: int
    gate_warps: int
    down_rows: int
    down_k: int
    down_warps: int


# Chosen for loads in flight, not timed: gate/up at one token is 9 pairs x 96 blocks of 8
# rows, some 6 programs an SM each with 16 rows x 256 inputs (8 KiB) loading; down at one
# token is 1,024 programs, each with its 9 pairs x 2 rows x 128 inputs (4.5 KiB) loading.
# Both load 16 bytes a thread and spill nothing on sm_90 (72 and 96 registers).
TILES = Tiles(gate_rows=8, gate_k=256, gate_warps=4, down_rows=2, down_k=128, down_warps=4)


def pair_experts_applies(x: Tensor, chosen: Tensor) -> bool:
    """Whether :func:`pair_experts` serves these tokens: CUDA with Triton, half precision, and
    at most ``MAX_PAIRS`` pairs (a static shape: a captured bucket decides once)."""
    return (
        triton is not None
        and x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and chosen.numel() <= MAX_PAIRS
    )


def pair_experts(
    x: Tensor,
    chosen: Tensor,
    weights: Tensor,
    gate_up: Tensor,
    down: Tensor,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The weighted sum over each token's chosen experts, fp32 ``[T, hidden]``: as
    :func:`~hymt_serve.engine.kernels.experts.grouped_experts` (``x [T, hidden]``;
    ``chosen``/``weights [T, k]``; ``gate_up [E, 2 x width, hidden]``, gate rows then up
    rows; ``down [E, hidden, width]``), pair by pair. ``scales``: for e4m3 stacks, their
    fp32 row scales ``[E, 2 x width]`` and ``[E, hidden]``."""
    return launch(x, chosen, weights, gate_up, down, TILES, scales)


def launch(
    x: Tensor,
    chosen: Tensor,
    weights: Tensor,
    gate_up: Tensor,
    down: Tensor,
    tiles: Tiles,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """:func:`pair_experts` on the given tiles."""
    tokens, k = chosen.shape
    hidden = x.shape[1]
    width = down.shape[2]
    assert gate_up.shape[1:] == (2 * width, hidden) and down.shape[1] == hidden
    # The weights' rows are read as contiguous runs of inputs.
    assert gate_up.stride(2) == 1 and down.stride(2) == 1 and x.stride(1) == 1
    chosen = chosen.contiguous()
    weights = weights.contiguous()
    pairs = tokens * k
    h = torch.empty(pairs, width, device=x.device, dtype=x.dtype)
    out = torch.empty(tokens, hidden, device=x.device, dtype=torch.float32)
    # Plain stacks pass their own tensors as the (unread) scale pointers.
    gate_up_scale, down_scale = scales if scales is not None else (gate_up, down)
    if scales is not None:
        assert gate_up_scale.shape == gate_up.shape[:2] and down_scale.shape == down.shape[:2]
        assert gate_up_scale.is_contiguous() and down_scale.is_contiguous()
    grid = (pairs, triton.cdiv(width, tiles.gate_rows))
    _kernels()[0][grid](
        x, chosen, gate_up, gate_up_scale, h, x.stride(0), gate_up.stride(0),
        gate_up.stride(1), k, width, hidden, BLOCK_W=tiles.gate_rows, BLOCK_K=tiles.gate_k,
        EVEN_K=hidden % tiles.gate_k == 0, SCALED=scales is not None,
        num_warps=tiles.gate_warps,
    )  # fmt: skip
    grid = (tokens, triton.cdiv(hidden, tiles.down_rows))
    _kernels()[1][grid](
        h, chosen, weights, down, down_scale, out, down.stride(0), down.stride(1), k, width,
        hidden, PAIRS=triton.next_power_of_2(k), BLOCK_H=tiles.down_rows,
        BLOCK_K=tiles.down_k, SCALED=scales is not None, num_warps=tiles.down_warps,
    )  # fmt: skip
    return out


def reference(
    x: Tensor,
    chosen: Tensor,
    weights: Tensor,
    gate_up: Tensor,
    down: Tensor,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The same sum in fp32, pair by pair in plain PyTorch (the tests' yardstick)."""
    width = down.shape[2]
    xf = x.float()
    w_gate_up, w_down = gate_up[chosen].float(), down[chosen].float()  # [T, k, rows, inputs]
    if scales is not None:
        w_gate_up = w_gate_up * scales[0][chosen][..., None]
        w_down = w_down * scales[1][chosen][..., None]
    both = torch.einsum("th,tkoh->tko", xf, w_gate_up)
    h = torch.nn.functional.silu(both[..., :width]) * both[..., width:]
    out = torch.einsum("tkw,tkow->tko", h, w_down)
    return (out * weights.float()[..., None]).sum(dim=1)


def _kernels() -> tuple[Any, Any]:
    return gate_up_kernel, down_kernel


# The kernels exist where Triton does (module level: jitted code finds its helpers by name).
if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def gate_up_kernel(  # type: ignore[no-untyped-def]
        x_ptr, chosen_ptr, w_ptr, scale_ptr, h_ptr, stride_x, stride_e, stride_row, K_PAIRS,
        WIDTH, HIDDEN, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
        SCALED: tl.constexpr,
    ):  # fmt: skip
        # h[pair, block] = SiLU(x[token] . gate rows) * (x[token] . up rows) of the pair's
        # expert. Rows past WIDTH read the last row again (loads without a row mask stay
        # wide) and are not stored. The sums stay [rows, inputs] wide until the end: one
        # reduction across threads per program.
        pair = tl.program_id(0)
        rows = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        row_ok = rows < WIDTH
        rows = tl.minimum(rows, WIDTH - 1)
        expert = tl.load(chosen_ptr + pair).to(tl.int64)
        x_row = x_ptr + (pair // K_PAIRS).to(tl.int64) * stride_x
        gate = w_ptr + expert * stride_e + rows[:, None] * stride_row
        up = gate + WIDTH * stride_row
        acc_gate = tl.zeros((BLOCK_W, BLOCK_K), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_W, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                xs = tl.load(x_row + ks).to(tl.float32)
                g = tl.load(gate + ks[None, :])
                u = tl.load(up + ks[None, :])
            else:
                k_ok = ks < HIDDEN
                xs = tl.load(x_row + ks, mask=k_ok, other=0.0).to(tl.float32)
                g = tl.load(gate + ks[None, :], mask=k_ok[None, :], other=0.0)
                u = tl.load(up + ks[None, :], mask=k_ok[None, :], other=0.0)
            acc_gate += g.to(tl.float32) * xs[None, :]
            acc_up += u.to(tl.float32) * xs[None, :]
        g_sum = tl.sum(acc_gate, axis=1)
        u_sum = tl.sum(acc_up, axis=1)
        if SCALED:  # e4m3 rows: each row's scale (scales are [E, 2 x WIDTH], contiguous)
            row_scale = scale_ptr + expert * 2 * WIDTH + rows
            g_sum *= tl.load(row_scale)
            u_sum *= tl.load(row_scale + WIDTH)
        h = g_sum * tl.sigmoid(g_sum) * u_sum
        target = h_ptr + pair.to(tl.int64) * WIDTH + rows
        tl.store(target, h.to(h_ptr.dtype.element_ty), mask=row_ok)

    @triton.jit  # type: ignore[untyped-decorator]
    def down_kernel(  # type: ignore[no-untyped-def]
        h_ptr, chosen_ptr, weights_ptr, w_ptr, scale_ptr, out_ptr, stride_e, stride_row,
        K_PAIRS, WIDTH, HIDDEN, PAIRS: tl.constexpr, BLOCK_H: tl.constexpr,
        BLOCK_K: tl.constexpr, SCALED: tl.constexpr,
    ):  # fmt: skip
        # out[token, block] = sum over the token's pairs j of weight_j * (down rows of
        # expert_j . h[pair_j]), in fp32. The tile's rows are (pair j, row) for all the
        # token's pairs at once (PAIRS: k rounded up to a power of two; the rows of pairs
        # past k neither load nor count): one program keeps k experts' loads in flight, where
        # a loop over the pairs would wait on each in turn. Rows past HIDDEN read the last
        # row again and are not stored.
        token = tl.program_id(0).to(tl.int64)
        r = tl.arange(0, PAIRS * BLOCK_H)
        j = r // BLOCK_H
        rows = tl.program_id(1) * BLOCK_H + r % BLOCK_H
        rows = tl.minimum(rows, HIDDEN - 1)
        pair_ok = j < K_PAIRS
        pair = token * K_PAIRS + tl.minimum(j, K_PAIRS - 1)
        expert = tl.load(chosen_ptr + pair).to(tl.int64)
        w_rows = w_ptr + expert * stride_e + rows * stride_row
        h_rows = h_ptr + pair * WIDTH
        acc = tl.zeros((PAIRS * BLOCK_H, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, WIDTH, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            # (WIDTH is specialised as a multiple of 16: the mask keeps 16-byte loads)
            ok = pair_ok[:, None] & (ks < WIDTH)[None, :]
            w = tl.load(w_rows[:, None] + ks[None, :], mask=ok, other=0.0)
            hs = tl.load(h_rows[:, None] + ks[None, :], mask=ok, other=0.0)
            acc += w.to(tl.float32) * hs.to(tl.float32)
        weight = tl.load(weights_ptr + pair, mask=pair_ok, other=0.0).to(tl.float32)
        if SCALED:  # e4m3 rows: the pair's weight times each row's scale ([E, HIDDEN])
            weight *= tl.load(scale_ptr + expert * HIDDEN + rows, mask=pair_ok, other=0.0)
        by_pair = tl.reshape(tl.sum(acc, axis=1) * weight, (PAIRS, BLOCK_H))
        out = tl.sum(by_pair, axis=0)
        block = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        tl.store(out_ptr + token * HIDDEN + block, out, mask=block < HIDDEN)
