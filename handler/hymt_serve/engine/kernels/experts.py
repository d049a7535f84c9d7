"""A mixture-of-experts layer's routing and its experts, for the fast engine.

Routing (``hy_v3``, as transformers' ``HYV3TopKRouter``): fp32 logits of the normed hidden
state, sigmoid scores, a per-expert bias added only to choose the top k, the chosen scores
renormalised to sum to one and scaled.

The experts run as grouped products: every (token, chosen expert) pair is sorted by expert,
and one ``torch._grouped_mm`` per projection multiplies each expert's rows by its own weights
(CUTLASS grouped GEMM on the GPU; a reference loop inside PyTorch elsewhere), one launch for
all experts whatever the batch, with static shapes so a CUDA graph captures it. A shared
expert of the experts' width rides along as one more expert that every token chooses with
weight one. The pairs' outputs are weighted and summed per token in fp32 (transformers adds the
routed and shared outputs in fp32 too), in a fixed order: no atomics, so a greedy row's tokens
do not depend on its batch's timing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def route(
    x: Tensor, router: Tensor, bias: Tensor, top_k: int, scale: float
) -> tuple[Tensor, Tensor]:
    """Tokens ``[T, hidden]`` -> the chosen experts ``[T, top_k]`` (int64) and their fp32
    weights: sigmoid of fp32 logits (``router``: fp32 ``[experts, hidden]``), chosen by score
    plus ``bias``, weighted by score renormalised over the chosen and times ``scale``."""
    scores = torch.sigmoid(F.linear(x.float(), router))
    _, chosen = torch.topk(scores + bias, top_k, dim=-1, sorted=False)
    weights = scores.gather(1, chosen)
    return chosen, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scale


def with_shared(chosen: Tensor, weights: Tensor, shared: int) -> tuple[Tensor, Tensor]:
    """Every token also chooses expert ``shared`` (the shared expert), with weight one."""
    column = torch.full_like(chosen[:, :1], shared)
    return torch.cat([chosen, column], 1), torch.cat([weights, torch.ones_like(weights[:, :1])], 1)


def grouped_experts(
    x: Tensor, chosen: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor
) -> Tensor:
    """The weighted sum over each token's chosen experts, fp32 ``[T, hidden]``.

    ``x [T, hidden]``; ``chosen``/``weights [T, k]``; ``gate_up [E, 2 x width, hidden]`` (gate
    rows, then up rows) and ``down [E, hidden, width]``, transformers' layout. Each expert is
    SiLU(x gate^T) * (x up^T) down^T."""
    tokens, k = chosen.shape
    experts = gate_up.shape[0]
    flat = chosen.flatten()
    order = torch.argsort(flat, stable=True)  # the pairs, by expert
    counts = torch.zeros(experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = x[order // k]
    hidden = torch._grouped_mm(rows, gate_up.transpose(1, 2), offs=ends)
    gate, up = hidden.chunk(2, dim=-1)
    out = torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=ends)
    weighted = out.float() * weights.flatten()[order, None]
    by_pair = torch.empty_like(weighted)
    by_pair[order] = weighted
    return by_pair.view(tokens, k, -1).sum(dim=1)
