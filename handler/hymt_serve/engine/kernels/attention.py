"""Decode-step attention over a slot-indexed KV cache, GQA-aware, reading only live positions.

One decode step has one new query token per row. :func:`decode_attention` writes that token's
key and value into the cache at ``positions[b]`` of slot ``slots[b]`` and attends over positions
``0..positions[b]`` of that slot. The cache layout is ``[slots, kv_heads, max_len, head_dim]``.

On CUDA with bf16/fp16 it runs a Triton flash-decoding kernel: one program per (row, KV head,
split) serves all query heads of the group, so KV heads are never repeated; it reads K and V
once in the cache dtype with fp32 accumulation and stops at the row's length, so a large static
cache costs nothing past the live positions. The kernel reads positions and slots from device
tensors, which makes it capturable in a CUDA graph. Elsewhere a plain PyTorch version runs
(the CPU path, also the reference for tests).

Prompt tokens of a prefill or a mixed step attend through :func:`prompt_attention`, a Triton
kernel over the same cache that reads each prompt's slot in place (CUDA only; elsewhere the
model gathers the keys for SDPA).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hymt_serve.engine.runners.inputs import PROMPT_BLOCK

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU image has no Triton; the PyTorch path serves there
    triton = None
    tl = None

TRITON_KERNEL = "triton_gqa_flash_decode"
REFERENCE_KERNEL = "torch_reference"
PROMPT_KERNEL = "triton_slot_prompt"  # prompt tokens: :func:`prompt_attention`
GATHERED_KERNEL = "gathered_sdpa"  # prompt tokens elsewhere: model.packed_attention
_BLOCK_N = 64  # positions per tile of the prompt kernel
# The decode kernel's tiles: positions per tile, warps, pipeline stages; the fastest of a sweep
# over the sentence mix's shapes (batch 1-256, 60-100 live positions) and long caches.
_DECODE_TILES = {"BLOCK_N": 32, "num_warps": 2, "num_stages": 2}
_TARGET_PROGRAMS = 264  # two waves on 132 SMs
# Splits of the cache's positions: a few rows of a long cache fill the card only when each split
# holds this many positions; more splits cost a little at the sentence mix's short caches.
_MIN_POSITIONS_PER_SPLIT = 128
# A cache too short for that still splits this far (a tile of positions a split at least):
# one row of a short cache is faster in a few splits than in one.
_SHORT_CACHE_SPLITS = 4


def triton_available() -> bool:
    """Whether the Triton kernel can be used at all (Triton importable and CUDA present)."""
    return triton is not None and torch.cuda.is_available()


def kernel_name(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel :func:`decode_attention` uses for tensors of this device and dtype."""
    use_triton = device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
    return TRITON_KERNEL if use_triton and triton_available() else REFERENCE_KERNEL


def prompt_kernel_name(device: torch.device, dtype: torch.dtype) -> str:
    """How prompt tokens attend for tensors of this device and dtype: :func:`prompt_attention`
    where the decode kernel runs, else keys gathered from the slots for SDPA."""
    return PROMPT_KERNEL if kernel_name(device, dtype) == TRITON_KERNEL else GATHERED_KERNEL


def num_splits(batch: int, kv_heads: int, max_len: int) -> int:
    """Splits of the sequence per (row, KV head): enough programs to fill the GPU, never tiny
    (a long cache: _MIN_POSITIONS_PER_SPLIT positions a split; a short one: up to
    _SHORT_CACHE_SPLITS splits of at least one tile)."""
    wanted = math.ceil(_TARGET_PROGRAMS / (batch * kv_heads))
    tile = _DECODE_TILES["BLOCK_N"]
    most = min(max(_SHORT_CACHE_SPLITS, max_len // _MIN_POSITIONS_PER_SPLIT), max_len // tile)
    # A power of two: the combine kernel spans the splits with one tl.arange.
    return 1 << (max(1, min(wanted, most, 16)).bit_length() - 1)


def decode_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Store the new K/V and attend: q ``[B, H, D]``, k/v_new ``[B, KVH, D]`` -> ``[B, H, D]``."""
    if kernel_name(q.device, q.dtype) == TRITON_KERNEL:
        return _triton_decode_attention(q, k_new, v_new, k_cache, v_cache, slots, positions, scale)
    return reference_decode_attention(q, k_new, v_new, k_cache, v_cache, slots, positions, scale)


def reference_decode_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """PyTorch version of :func:`decode_attention` (syncs once to size the live window)."""
    k_cache[slots, :, positions] = k_new
    v_cache[slots, :, positions] = v_new
    batch, heads, dim = q.shape
    kv_heads = k_new.shape[1]
    live = int(positions.max()) + 1
    keys = k_cache[slots, :, :live].float()
    values = v_cache[slots, :, :live].float()
    grouped = q.float().view(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.einsum("bkgd,bktd->bkgt", grouped, keys) * scale
    visible = torch.arange(live, device=q.device)[None, :] <= positions[:, None]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgt,bktd->bkgd", scores.softmax(-1), values)
    return out.reshape(batch, heads, dim).to(q.dtype)


def _triton_decode_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    batch, heads, dim = q.shape
    kv_heads = k_new.shape[1]
    group = heads // kv_heads
    splits = num_splits(batch, kv_heads, k_cache.shape[2])
    out = torch.empty(batch, heads, dim, device=q.device, dtype=q.dtype)
    parts = max(splits, 2) if splits > 1 else 1  # unused when one split writes `out` directly
    acc = torch.empty(batch, heads, parts, dim, device=q.device, dtype=torch.float32)
    stats = torch.empty(batch, heads, parts, 2, device=q.device, dtype=torch.float32)
    grid = (batch, kv_heads, splits)
    _decode_kernel[grid](
        q, k_new, v_new, k_cache, v_cache, slots, positions, out, acc, stats,
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0),
        v_new.stride(1), *k_cache.stride()[:3], scale,
        HEADS=heads, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        DIM=dim, SPLITS=splits, **_DECODE_TILES,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(batch, heads)](acc, stats, out, SPLITS=splits, DIM=dim)
    return out


def prompt_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    blocks: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of packed prompt tokens over their own slots, whose keys and values
    (the tokens' own included) are in the cache already: q ``[N, H, D]``, ``positions [N]``,
    ``blocks [4, B]`` (:func:`~hymt_serve.engine.runners.inputs.prompt_blocks`) -> ``[N, H, D]``.

    One program per (block of up to 16 tokens of one prompt, KV head) holds the block's
    tokens times the group's query heads as the rows of one tile and reads the slot's keys
    once, up to the block's last position: a short prompt costs a few key tiles, a long
    prompt's chunk reads its slot once per block, and nothing is gathered or spent on other
    prompts' keys. The shapes depend on N and B only, so a CUDA graph serves any mix of
    prompts that fits them. Triton, CUDA only (:func:`kernel_name`)."""
    tokens, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    out = torch.empty(tokens, heads, dim, device=q.device, dtype=q.dtype)
    count = blocks.shape[1]
    _prompt_kernel[(count, kv_heads)](
        q, k_cache, v_cache, positions, blocks, out, q.stride(0), q.stride(1),
        *k_cache.stride()[:3], scale, count,
        HEADS=heads, GROUP=group, GROUP_P=triton.next_power_of_2(group),
        TOKENS=PROMPT_BLOCK, DIM=dim, BLOCK_N=_BLOCK_N,
    )  # fmt: skip
    return out


def _define_kernels() -> tuple[Any, Any, Any]:
    @triton.jit  # type: ignore[untyped-decorator]
    def decode_kernel(  # type: ignore[no-untyped-def]
        q_ptr, kn_ptr, vn_ptr, kc_ptr, vc_ptr, slots_ptr, pos_ptr, out_ptr, acc_ptr, stats_ptr,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh,
        stride_slot, stride_head, stride_pos, scale,
        HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
        DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        slot = tl.load(slots_ptr + row).to(tl.int64)
        pos = tl.load(pos_ptr + row).to(tl.int64)
        length = pos + 1
        per_split = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
        start = split * per_split
        end = tl.minimum(start + per_split, length)
        offs_d = tl.arange(0, DIM)
        offs_g = tl.arange(0, BLOCK_G)
        offs_n = tl.arange(0, BLOCK_N)
        k_new = tl.load(kn_ptr + row * stride_kb + kvh * stride_kh + offs_d)
        v_new = tl.load(vn_ptr + row * stride_vb + kvh * stride_vh + offs_d)
        base = slot * stride_slot + kvh * stride_head
        if (pos >= start) & (pos < end):
            tl.store(kc_ptr + base + pos * stride_pos + offs_d, k_new)
            tl.store(vc_ptr + base + pos * stride_pos + offs_d, v_new)
        head = kvh * GROUP + offs_g
        g_mask = offs_g < GROUP
        q_off = row * stride_qb + head[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptr + q_off, mask=g_mask[:, None], other=0.0)
        out_off = (row * HEADS + head)[:, None] * DIM + offs_d[None, :]
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, DIM], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs = n0 + offs_n
            valid = offs < end
            kv_off = base + offs[:, None] * stride_pos + offs_d[None, :]
            is_new = (offs == pos)[:, None]
            k = tl.load(kc_ptr + kv_off, mask=valid[:, None], other=0.0)
            # The store above may not be visible yet to every thread: use the new key directly.
            k = tl.where(is_new, k_new[None, :], k)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(vc_ptr + kv_off, mask=valid[:, None], other=0.0)
            v = tl.where(is_new, v_new[None, :], v)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if SPLITS == 1:
            out = acc / l_i[:, None]
            tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
        else:
            part = (row * HEADS + head) * SPLITS + split
            tl.store(acc_ptr + part[:, None] * DIM + offs_d[None, :], acc, mask=g_mask[:, None])
            tl.store(stats_ptr + part * 2, m_i, mask=g_mask)
            tl.store(stats_ptr + part * 2 + 1, l_i, mask=g_mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def combine_kernel(acc_ptr, stats_ptr, out_ptr, SPLITS: tl.constexpr, DIM: tl.constexpr):  # type: ignore[no-untyped-def]
        row_head = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        offs_s = tl.arange(0, SPLITS)
        offs_d = tl.arange(0, DIM)
        part = row_head * SPLITS + offs_s
        m = tl.load(stats_ptr + part * 2)
        l_sum = tl.load(stats_ptr + part * 2 + 1)
        weight = tl.where(l_sum > 0, tl.exp(m - tl.max(m, 0)), 0.0)
        acc = tl.load(acc_ptr + part[:, None] * DIM + offs_d[None, :])
        acc = tl.where((l_sum > 0)[:, None], acc, 0.0)
        out = tl.sum(acc * weight[:, None], 0) / tl.sum(l_sum * weight, 0)
        tl.store(out_ptr + row_head * DIM + offs_d, out.to(out_ptr.dtype.element_ty))

    # The block count only places the rows of ``blocks``: a runtime argument Triton does not
    # specialise, so one compile serves every prefill graph (as a constant it would compile
    # once per graph).
    @triton.jit(do_not_specialize=["n_blocks"])  # type: ignore[untyped-decorator]
    def prompt_kernel(  # type: ignore[no-untyped-def]
        q_ptr, kc_ptr, vc_ptr, pos_ptr, blocks_ptr, out_ptr, stride_qn, stride_qh,
        stride_slot, stride_head, stride_pos, scale, n_blocks,
        HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
        TOKENS: tl.constexpr, DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        block = tl.program_id(0)
        kvh = tl.program_id(1)
        first = tl.load(blocks_ptr + block)
        count = tl.load(blocks_ptr + n_blocks + block)
        slot = tl.load(blocks_ptr + 2 * n_blocks + block)
        last = tl.load(blocks_ptr + 3 * n_blocks + block)
        if count > 0:
            # rows of the tile: token t of the block, query head g of the group
            offs_r = tl.arange(0, TOKENS * GROUP_P)
            token = offs_r // GROUP_P
            g = offs_r % GROUP_P
            valid = (token < count) & (g < GROUP)
            index = first + token
            head = kvh * GROUP + g
            offs_d = tl.arange(0, DIM)
            offs_n = tl.arange(0, BLOCK_N)
            q_off = index[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :]
            q = tl.load(q_ptr + q_off, mask=valid[:, None], other=0.0)
            # rows past the block read position 0, which every row may see: no empty row
            q_pos = tl.load(pos_ptr + index, mask=valid, other=0)
            base = slot * stride_slot + kvh * stride_head
            m_i = tl.full([TOKENS * GROUP_P], float("-inf"), tl.float32)
            l_i = tl.zeros([TOKENS * GROUP_P], tl.float32)
            acc = tl.zeros([TOKENS * GROUP_P, DIM], tl.float32)
            for n0 in range(0, last + 1, BLOCK_N):
                offs = n0 + offs_n
                inside = (offs <= last)[:, None]
                kv_off = base + offs[:, None] * stride_pos + offs_d[None, :]
                k = tl.load(kc_ptr + kv_off, mask=inside, other=0.0)
                s = tl.dot(q, tl.trans(k)) * scale
                s = tl.where(offs[None, :] <= q_pos[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(vc_ptr + kv_off, mask=inside, other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            out = acc / l_i[:, None]
            out_off = (index * HEADS + head)[:, None] * DIM + offs_d[None, :]
            tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=valid[:, None])

    return decode_kernel, combine_kernel, prompt_kernel


if triton is not None:
    _decode_kernel, _combine_kernel, _prompt_kernel = _define_kernels()
