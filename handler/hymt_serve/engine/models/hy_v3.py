"""A compact ``hy_v3`` forward (Hy-MT2-30B-A3B) over the weight tensors of a loaded HF model.

The math mirrors transformers' ``modeling_hy_v3``: RMSNorm in fp32 then cast; q/k per-head
RMSNorm *before* NeoX RoPE (the dense family rotates first); a SiLU-gated MLP in dense layers;
in mixture layers fp32 router logits, sigmoid scores, a bias that only chooses, the chosen
weights renormalised and scaled, and the routed and shared experts summed in fp32 before the
residual. The unit tests check logits and greedy tokens against transformers'.

The per-token pieces are step functions that take weights as arguments (compiled by inductor
on the GPU, one compiled version for all layers); attention and the experts' grouped
products run between them (:mod:`hymt_serve.engine.kernels.attention`,
:mod:`hymt_serve.engine.kernels.experts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hymt_serve.engine.checkpoints.fp8 import Fp8Scales
from hymt_serve.engine.kernels.experts import grouped_experts, route, with_shared
from hymt_serve.engine.kernels.experts_fp8 import FP8, grouped_fp8_experts
from hymt_serve.engine.kernels.experts_triton import pair_experts, pair_experts_applies
from hymt_serve.engine.kernels.quantized import Int4Parts, linear
from hymt_serve.engine.models.base import UnsupportedModelError
from hymt_serve.engine.models.decoder import (
    compiled,
    layer_attention,
    logit_rows,
    pass_inputs,
    rms_norm,
    rope_tables,
    rotate,
)
from hymt_serve.engine.models.hy_v3_weights import (
    MODEL_TYPE,
    MoeLayerWeights,
    MoeShape,
    check_model,
    extract_weights,
)
from hymt_serve.engine.models.weights import LayerWeights, ModelShape, ModelWeights, embed_tokens
from hymt_serve.engine.runners.inputs import PackedPrompts

Layer = LayerWeights | MoeLayerWeights


def attention_in(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    attn: tuple[Tensor, ...],
    shape: ModelShape,
) -> tuple[Tensor, Tensor, Tensor]:
    """Tokens ``[N, hidden]`` -> q ``[N, H, D]``, k and v ``[N, KVH, D]`` (QK norm, then RoPE).

    q's and k's heads sit side by side in the fused projection's output: the norm and RoPE run
    over them as one ``[N, H + KVH, D]`` tensor, each head scaled by its own kind's weight.
    ``attn``: the layer's tensors of :func:`_attention_tensors`."""
    input_norm, qkv_w, qkv_scale, qkv_input, q_norm, k_norm = attn
    qkv = linear(rms_norm(x, input_norm, shape.eps), qkv_w, qkv_scale, qkv_input)
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    qk = qkv[:, : (heads + kv_heads) * dim].view(-1, heads + kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(-1, kv_heads, dim)
    norm = torch.cat([q_norm.expand(heads, dim), k_norm.expand(kv_heads, dim)])
    qk = rotate(rms_norm(qk, norm, shape.eps), cos[:, None, :], sin[:, None, :])
    return qk[:, :heads], qk[:, heads:], v


def dense_mlp(
    x: Tensor,
    gate_up: Tensor,
    down: Tensor,
    gate_up_scale: Tensor,
    gate_up_input: Tensor,
    down_scale: Tensor,
    down_input: Tensor,
) -> Tensor:
    """SiLU(x gate^T) * (x up^T) down^T (``gate_up``: gate rows, then up), each projection
    plain or e4m3 with its scales (:func:`~hymt_serve.engine.kernels.quantized.linear`)."""
    gate, up = linear(x, gate_up, gate_up_scale, gate_up_input).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, down, down_scale, down_input)


def _plain(weight: Tensor) -> tuple[Tensor, Tensor]:
    empty = weight.new_empty(0, dtype=torch.float32)
    return empty, empty


@dataclass(frozen=True)
class StepFunctions:
    """The per-token pieces of a pass; compiled or plain, same signatures.

    ``first``: the first layer's q, k, v. ``post``: attention output plus residual, and the
    post-attention norm's output. ``route``: a mixture's chosen experts and weights.
    ``dense``: a dense layer's MLP. ``next``: the MLP's output added to the residual, then the
    next layer's q, k, v. ``last``: the same addition, the final norm and the LM head."""

    first: Callable[..., tuple[Tensor, Tensor, Tensor]]
    post: Callable[..., tuple[Tensor, Tensor]]
    route: Callable[..., tuple[Tensor, Tensor]]
    dense: Callable[..., Tensor]
    next: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]
    last: Callable[..., Tensor]


def make_step_functions(shape: MoeShape, compile_: bool) -> StepFunctions:
    """Build the pass's pieces, compiled by inductor when ``compile_`` is set."""

    def first(x: Tensor, cos: Tensor, sin: Tensor, *attn: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return attention_in(x, cos, sin, attn, shape)

    def post(
        attn: Tensor, residual: Tensor, o: Tensor, o_scale: Tensor, o_input: Tensor, norm: Tensor
    ) -> tuple[Tensor, Tensor]:
        x = residual + linear(attn.flatten(1), o, o_scale, o_input)
        return x, rms_norm(x, norm, shape.eps)

    def route_(x: Tensor, router: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        return route(x, router, bias, shape.top_k, shape.routed_scale)

    def next_(
        mlp: Tensor, residual: Tensor, cos: Tensor, sin: Tensor, *attn: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x = residual + mlp.to(residual.dtype)
        q, k, v = attention_in(x, cos, sin, attn, shape)
        return q, k, v, x

    def last(mlp: Tensor, residual: Tensor, norm: Tensor, head: Tensor) -> Tensor:
        x = rms_norm(residual + mlp.to(residual.dtype), norm, shape.eps)
        return linear(x.to(head.dtype), head, *_plain(head))[:, : shape.vocab].float()

    fns = StepFunctions(first, post, route_, dense_mlp, next_, last)
    if not compile_:
        return fns
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return StepFunctions(
        compiled(first, activations=3),
        compiled(post, activations=2),
        compiled(route_, activations=1),
        compiled(dense_mlp, activations=1),
        compiled(next_, activations=2),
        compiled(last, activations=2),
    )


def _attention_tensors(lw: Layer) -> tuple[Tensor, ...]:
    """A layer's tensors for :func:`attention_in`, in its argument order."""
    return (lw.input_norm, lw.qkv, lw.qkv_scale, lw.qkv_input, lw.q_norm, lw.k_norm)


def mlp_output(x: Tensor, lw: Layer, shape: MoeShape, fns: StepFunctions) -> Tensor:
    """A layer's MLP on its normed input: dense, or the mixture's experts (fp32 sum)."""
    if isinstance(lw, LayerWeights):
        return fns.dense(
            x, lw.gate_up, lw.down, lw.gate_up_scale, lw.gate_up_input, lw.down_scale,
            lw.down_input,
        )  # fmt: skip
    chosen, weights = fns.route(x, lw.router, lw.expert_bias)
    if shape.shared_stacked:
        chosen, weights = with_shared(chosen, weights, shape.experts)
    out = run_experts(x, chosen, weights, lw)
    if not shape.shared_stacked:
        shared = fns.dense(
            x, lw.shared_gate_up, lw.shared_down, lw.shared_gate_up_scale,
            lw.shared_gate_up_input, lw.shared_down_scale, lw.shared_down_input,
        )  # fmt: skip
        out = out + shared.float()
    return out


def run_experts(x: Tensor, chosen: Tensor, weights: Tensor, lw: MoeLayerWeights) -> Tensor:
    """The chosen experts' weighted sum: few pairs (decode of a small batch) each pair's GEMV
    without sorting, else grouped GEMMs; e4m3 stacks with their row scales."""
    stacks = (lw.experts_gate_up, lw.experts_down)
    scales = (lw.experts_gate_up_scale, lw.experts_down_scale)
    fp8 = lw.experts_gate_up.dtype == FP8
    if pair_experts_applies(x, chosen):
        return pair_experts(x, chosen, weights, *stacks, scales if fp8 else None)
    if fp8:
        return grouped_fp8_experts(x, chosen, weights, stacks, scales)
    return grouped_experts(x, chosen, weights, *stacks)


def forward_pass(
    weights: ModelWeights,
    shape: MoeShape,
    fns: StepFunctions,
    rope: tuple[Tensor, Tensor],
    caches: tuple[list[Tensor], list[Tensor]],
    decode: tuple[Tensor, Tensor, Tensor] | None = None,
    packed: PackedPrompts | None = None,
) -> Tensor:
    """One pass for decode rows and packed prompt tokens together, as the dense forward
    (:func:`hymt_serve.engine.models.hunyuan_v1_dense.forward_pass`): logits ``[B + R, V]``
    for each decode row, then after each prompt's last packed token."""
    ids, cos, sin, mask = pass_inputs(rope, caches[0][0], decode, packed)
    layers: tuple[Layer, ...] = weights.layers
    residual = embed_tokens(ids, weights)
    q, k, v = fns.first(residual, cos, sin, *_attention_tensors(layers[0]))
    for i, lw in enumerate(layers):
        attn = layer_attention(
            q, k, v, caches[0][i], caches[1][i], decode, packed, mask, shape.scale
        )
        if i + 1 == len(layers):
            select = logit_rows(decode, packed)
            if select is not None:  # the last layer's MLP and the head: logit rows only
                attn, residual = attn[select], residual[select]
        residual, normed = fns.post(attn, residual, lw.o, lw.o_scale, lw.o_input, lw.post_norm)
        mlp = mlp_output(normed, lw, shape, fns)
        if i + 1 == len(layers):
            return fns.last(mlp, residual, weights.final_norm, weights.lm_head)
        q, k, v, residual = fns.next(mlp, residual, cos, sin, *_attention_tensors(layers[i + 1]))
    raise AssertionError("a model has at least one layer")


class HyV3:
    """The :class:`~hymt_serve.engine.models.base.Architecture` of ``hy_v3``."""

    model_type = MODEL_TYPE

    def check(self, model: nn.Module) -> MoeShape:
        return check_model(model)

    def extract_weights(
        self,
        model: nn.Module,
        *,
        quantize: str,
        scales: Fp8Scales | None,
        int4: Int4Parts | None,
        quantize_head: bool,
    ) -> ModelWeights:
        if int4 is not None:
            raise UnsupportedModelError("hy_v3 GPTQ checkpoints are not supported yet")
        return extract_weights(model, quantize=quantize, scales=scales, quantize_head=quantize_head)

    def rope_tables(self, weights: ModelWeights, length: int) -> tuple[Tensor, Tensor]:
        return rope_tables(weights.inv_freq, length, weights.dtype)

    def step_functions(self, shape: ModelShape, compile_: bool) -> Any:
        assert isinstance(shape, MoeShape)
        return make_step_functions(shape, compile_)

    def forward(
        self,
        weights: ModelWeights,
        shape: ModelShape,
        fns: Any,
        rope: tuple[Tensor, Tensor],
        caches: tuple[list[Tensor], list[Tensor]],
        decode: tuple[Tensor, Tensor, Tensor] | None = None,
        packed: PackedPrompts | None = None,
    ) -> Tensor:
        assert isinstance(shape, MoeShape)
        return forward_pass(weights, shape, fns, rope, caches, decode, packed)


ARCHITECTURE = HyV3()
