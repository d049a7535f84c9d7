"""A compact ``hunyuan_v1_dense`` forward over the weight tensors of a loaded HF model.

Why not transformers' own modules: their decode step carries a mask builder, a cache object,
a rotary module that branches on data (Hunyuan's "dynamic" RoPE) and KV-head repetition, none of
which a static decode step needs and some of which cannot be compiled or captured. The math
below mirrors ``modeling_hunyuan_v1_dense`` line for line (RMSNorm in fp32 then cast, RoPE with
cos/sin cast to the model dtype, RoPE *before* the per-head QK norm, SiLU-gated MLP), so logits
match transformers' to rounding; the unit tests check that.

The decode step is three functions (``first``, ``middle``, ``last``) that take weights as
arguments, so one compiled version serves all layers; attention sits between them, outside
the compiled code (:mod:`hymt_serve.engine.kernels.attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hymt_serve.engine.checkpoints.fp8 import Fp8Scales
from hymt_serve.engine.kernels.quantized import (
    Int4Parts,
    linear,
)
from hymt_serve.engine.models.decoder import (
    compiled,
    layer_attention,
    logit_rows,
    pass_inputs,
    rms_norm,
    rope_tables,
    rotate,
)
from hymt_serve.engine.models.hunyuan_v1_dense_weights import (
    MODEL_TYPE,
    check_model,
    extract_weights,
)
from hymt_serve.engine.models.weights import (
    LAYER_TENSORS,
    LayerWeights,
    ModelShape,
    ModelWeights,
    embed_tokens,
)
from hymt_serve.engine.runners.inputs import PackedPrompts


def qkv_step(
    x: Tensor, lw: LayerWeights, cos: Tensor, sin: Tensor, shape: ModelShape
) -> tuple[Tensor, Tensor, Tensor]:
    """Tokens ``[N, hidden]`` -> q ``[N, H, D]``, k and v ``[N, KVH, D]`` (RoPE, then QK norm).

    q's and k's heads lie side by side in the fused projection's output, so RoPE and the norm
    run over them as one ``[N, H + KVH, D]`` tensor, each head scaled by its own kind's norm
    weight: the same values as two passes, and one kernel instead of two when compiled."""
    normed = rms_norm(x, lw.input_norm, shape.eps)
    qkv = linear(normed, lw.qkv, lw.qkv_scale, lw.qkv_input, fits_fp16=shape.norms_fit_fp16)
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    qk = qkv[:, : (heads + kv_heads) * dim].view(-1, heads + kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(-1, kv_heads, dim)
    norm = torch.cat([lw.q_norm.expand(heads, dim), lw.k_norm.expand(kv_heads, dim)])
    qk = rms_norm(rotate(qk, cos[:, None, :], sin[:, None, :]), norm, shape.eps)
    return qk[:, :heads], qk[:, heads:], v


def output_step(attn: Tensor, residual: Tensor, lw: LayerWeights, shape: ModelShape) -> Tensor:
    """Attention output ``[N, H*D]`` + residual -> the layer's output ``[N, hidden]``."""
    x = residual + linear(attn, lw.o, lw.o_scale, lw.o_input)
    normed = rms_norm(x, lw.post_norm, shape.eps)
    gate_up = linear(
        normed, lw.gate_up, lw.gate_up_scale, lw.gate_up_input, fits_fp16=shape.norms_fit_fp16
    )
    gate, up = gate_up.chunk(2, dim=-1)
    return x + linear(F.silu(gate) * up, lw.down, lw.down_scale, lw.down_input)


def logits_step(x: Tensor, norm: Tensor, head: tuple[Tensor, ...], shape: ModelShape) -> Tensor:
    """Hidden states ``[N, hidden]`` -> fp32 logits ``[N, vocab]`` (padding rows cut off);
    ``head`` is the LM head's weight, scale and input scale (see :func:`linear`)."""
    weight, scale, input_scale = head
    normed = rms_norm(x, norm, shape.eps)
    logits = linear(normed, weight, scale, input_scale, fits_fp16=shape.norms_fit_fp16)
    return logits[:, : shape.vocab].float()


@dataclass(frozen=True)
class StepFunctions:
    """The three pieces of a decode step; compiled or plain, same signatures."""

    first: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]
    middle: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]
    last: Callable[..., Tensor]


def make_step_functions(shape: ModelShape, compile_: bool) -> StepFunctions:
    """Build the decode-step pieces, compiled by inductor when ``compile_`` is set."""

    # Weights arrive as loose tensors (what inductor and CUDA graphs take) and are named again.
    def first(x: Tensor, cos: Tensor, sin: Tensor, *lw: Tensor) -> tuple[Tensor, ...]:
        q, k, v = qkv_step(x, LayerWeights(*lw), cos, sin, shape)
        return q, k, v, x

    def middle(
        attn: Tensor, residual: Tensor, cos: Tensor, sin: Tensor, *lws: Tensor
    ) -> tuple[Tensor, ...]:
        done, following = LayerWeights(*lws[:LAYER_TENSORS]), LayerWeights(*lws[LAYER_TENSORS:])
        x = output_step(attn.flatten(1), residual, done, shape)
        q, k, v = qkv_step(x, following, cos, sin, shape)
        return q, k, v, x

    def last(
        attn: Tensor, residual: Tensor, norm: Tensor, *head_lw: Tensor
    ) -> Tensor:  # head_lw: the LM head's three tensors, then the last layer's
        x = output_step(attn.flatten(1), residual, LayerWeights(*head_lw[3:]), shape)
        return logits_step(x, norm, head_lw[:3], shape)

    if not compile_:
        return StepFunctions(first, middle, last)  # type: ignore[arg-type]
    # Every engine of a process compiles these same functions again (other weight dtypes and
    # shapes; the weight-only kernel's row classes add graphs): dynamo's default of 8
    # versions per function ran out in a process that built six engines.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return StepFunctions(
        compiled(first, activations=3), compiled(middle, activations=4), compiled(last, 2)
    )


def forward_pass(
    weights: ModelWeights,
    shape: ModelShape,
    fns: StepFunctions,
    rope: tuple[Tensor, Tensor],
    caches: tuple[list[Tensor], list[Tensor]],
    decode: tuple[Tensor, Tensor, Tensor] | None = None,
    packed: PackedPrompts | None = None,
) -> Tensor:
    """One pass over the weights for decode rows and packed prompt tokens together.

    ``decode`` is (tokens, positions, slots), each ``[B]``: one new token per running row.
    ``packed`` holds prompt tokens end to end (whole prompts or chunks of them). Logits come
    out for each decode row, then after each prompt's last packed token: ``[B + R, V]``.

    The per-token work (norms, projections, RoPE, MLP) runs on all tokens at once through
    the step functions (compiled when the decode step is: their batch dimension is dynamic),
    so one read of the weights serves both kinds and no compute goes to padding between
    prompts. Attention is per kind: decode rows through the flash-decoding kernel; prompt
    tokens write their K/V into their slots, then read each prompt's keys back from its slot
    (on the GPU the prompt kernel reads the slot in place, by ``packed.blocks``; elsewhere
    the keys ``packed.key_*`` are gathered), so a prompt whose slot holds a reused prefix or
    earlier chunks packs only the tokens after them. The last layer's MLP and the LM head
    run for the rows that give logits only.
    """
    ids, cos, sin, mask = pass_inputs(rope, caches[0][0], decode, packed)
    x = embed_tokens(ids, weights)
    q, k, v, residual = fns.first(x, cos, sin, *weights.layers[0])
    for i in range(shape.layers):
        attn = layer_attention(
            q, k, v, caches[0][i], caches[1][i], decode, packed, mask, shape.scale
        )
        if i + 1 == shape.layers:
            break
        q, k, v, residual = fns.middle(
            attn, residual, cos, sin, *weights.layers[i], *weights.layers[i + 1]
        )
    select = logit_rows(decode, packed)
    if select is not None:
        attn, residual = attn[select], residual[select]
    return fns.last(attn, residual, weights.final_norm, *weights.head, *weights.layers[-1])


class HunyuanV1Dense:
    """The :class:`~hymt_serve.engine.models.base.Architecture` of ``hunyuan_v1_dense``."""

    model_type = MODEL_TYPE

    def check(self, model: nn.Module) -> ModelShape:
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
        return extract_weights(
            model, quantize=quantize, scales=scales, int4=int4, quantize_head=quantize_head
        )

    def rope_tables(self, weights: ModelWeights, length: int) -> tuple[Tensor, Tensor]:
        return rope_tables(weights.inv_freq, length, weights.dtype)

    def step_functions(self, shape: ModelShape, compile_: bool) -> StepFunctions:
        return make_step_functions(shape, compile_)

    def forward(
        self,
        weights: ModelWeights,
        shape: ModelShape,
        fns: StepFunctions,
        rope: tuple[Tensor, Tensor],
        caches: tuple[list[Tensor], list[Tensor]],
        decode: tuple[Tensor, Tensor, Tensor] | None = None,
        packed: PackedPrompts | None = None,
    ) -> Tensor:
        return forward_pass(weights, shape, fns, rope, caches, decode, packed)


ARCHITECTURE = HunyuanV1Dense()
