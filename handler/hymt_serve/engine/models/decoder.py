"""The pieces every decoder architecture of the fast engine shares: RoPE tables and rotation,
HF's RMSNorm, a layer's attention over the KV cache for decode rows and packed prompt tokens,
what a pass's inputs become (ids, cos/sin, the CPU's prompt mask) and which rows give logits,
and inductor's options for the step functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hymt_serve.engine.kernels.attention import (
    PROMPT_KERNEL,
    decode_attention,
    prompt_attention,
    prompt_kernel_name,
)
from hymt_serve.engine.runners.inputs import PackedPrompts


def rope_tables(inv_freq: Tensor, length: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin ``[length, head_dim]`` computed in fp32 then cast, as transformers does."""
    positions = torch.arange(length, device=inv_freq.device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's RMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


# Reductions over fewer elements than this inductor writes out as sums inside the kernel that
# reads them: the weight-only products' partial sums over their splits (int8 splits a 7B's
# attention output and down projection 8 ways, int4's one row its gate_up; bf16 at most 4).
# With inductor's own threshold (8) those sums run as kernels of their own, a sixth of a
# quantized batch-1 step's kernels. With 32 int4's one row sums gate_up's 16 splits inside the
# SiLU kernel too.
SPLIT_SUMS_READ = 32


def compiled(fn: Callable[..., Any], activations: int) -> Callable[..., Any]:
    """Inductor over ``fn``, one graph for batch 1 and one shared by every larger bucket.

    The first ``activations`` arguments have the batch as dimension 0; marking it dynamic
    (batch 1 is always specialised) makes all buckets above 1 share a single compilation; every
    other dimension stays static. No inductor CUDA graphs: the runner captures the whole step.
    """
    options: dict[str, str | int | bool | Callable[..., Any]] = {
        "unroll_reductions_threshold": SPLIT_SUMS_READ
    }
    compiled = torch.compile(fn, fullgraph=True, dynamic=None, options=options)

    def call(*args: Tensor) -> Any:
        for tensor in args[:activations]:
            if tensor.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return compiled(*args)

    return call


def joined(first: Tensor | None, second: Tensor | None) -> Tensor:
    parts = [t for t in (first, second) if t is not None]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def layer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    decode: tuple[Tensor, Tensor, Tensor] | None,
    packed: PackedPrompts | None,
    mask: Tensor | None,
    scale: float,
) -> Tensor:
    """One layer's attention for a forward pass: the decode rows come first."""
    rows = 0 if decode is None else decode[0].shape[0]
    step = None
    if decode is not None:
        _, positions, slots = decode
        step = decode_attention(
            q[:rows], k[:rows], v[:rows], k_cache, v_cache, slots, positions, scale
        )
    if packed is None:
        assert step is not None
        return step
    k_cache[packed.token_slots, :, packed.positions] = k[rows:]
    v_cache[packed.token_slots, :, packed.positions] = v[rows:]
    if mask is None:  # the prompt kernel reads the slots as they are
        prompts = prompt_attention(
            q[rows:], k_cache, v_cache, packed.positions, packed.blocks, scale
        )
        return joined(step, prompts)
    keys = k_cache[packed.key_slots, :, packed.key_positions]
    values = v_cache[packed.key_slots, :, packed.key_positions]
    return joined(step, packed_attention(q[rows:], keys, values, mask))


def prompt_kernel_used(cache: Tensor) -> bool:
    """Whether prompt tokens attend through :func:`prompt_attention` (CUDA, Triton, half
    precision), else through :func:`packed_attention` over keys gathered from the slots."""
    return prompt_kernel_name(cache.device, cache.dtype) == PROMPT_KERNEL


def packed_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Causal attention within each packed prompt: q ``[N, H, D]``, k/v ``[K, KVH, D]``,
    ``mask [N, K]`` (True where a query may see a key) -> ``[N, H, D]``. Its shapes depend on
    N and K only, so one CUDA graph serves any mix of prompts that fits them. The CPU's path
    (and the reference for the prompt kernel): on the GPU, :func:`prompt_attention` reads the
    slots without the gather and the mask, several times faster.

    The query heads that share a key head go one after another along the query axis
    (``[KVH, G x N, D]``), so the keys and values are read as they are instead of copied once
    per query head (``repeat_interleave``, a noticeable share of a mixed step's time)."""
    tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    q = q.view(tokens, kv_heads, group, dim).permute(1, 2, 0, 3).reshape(kv_heads, -1, dim)
    k, v = (t.transpose(0, 1)[None] for t in (k, v))
    out = F.scaled_dot_product_attention(q[None], k, v, attn_mask=mask.repeat(group, 1)[None, None])
    return out[0].view(kv_heads, group, tokens, dim).permute(2, 0, 1, 3).reshape(tokens, heads, dim)


def pass_inputs(
    rope: tuple[Tensor, Tensor],
    cache: Tensor,
    decode: tuple[Tensor, Tensor, Tensor] | None,
    packed: PackedPrompts | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """A pass's token ids (decode rows first, then packed prompt tokens), their cos and sin,
    and the prompt tokens' attention mask where the prompt kernel does not run (else None)."""
    ids = joined(decode[0] if decode else None, packed.ids if packed else None)
    positions = joined(decode[1] if decode else None, packed.positions if packed else None)
    mask = None
    if packed is not None and not prompt_kernel_used(cache):
        same = packed.sequence[:, None] == packed.key_sequence[None, :]
        mask = same & (packed.key_positions[None, :] <= packed.positions[:, None])
    return ids, rope[0][positions], rope[1][positions], mask


def logit_rows(
    decode: tuple[Tensor, Tensor, Tensor] | None, packed: PackedPrompts | None
) -> Tensor | None:
    """The pass's rows that give logits: every decode row, then each prompt's last packed
    token; None when every row does (decode only)."""
    if packed is None:
        return None
    rows = 0 if decode is None else decode[0].shape[0]
    select = packed.last + rows
    if rows:
        select = torch.cat([torch.arange(rows, device=select.device), select])
    return select
