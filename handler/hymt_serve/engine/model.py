"""A compact ``hunyuan_v1_dense`` forward over the weight tensors of a loaded HF model.

Why not transformers' own modules: their decode step carries a mask builder, a cache object,
a rotary module that branches on data (Hunyuan's "dynamic" RoPE) and KV-head repetition, none of
which a static decode step needs and some of which cannot be compiled or captured. The math
below mirrors ``modeling_hunyuan_v1_dense`` line for line (RMSNorm in fp32 then cast, RoPE with
cos/sin cast to the model dtype, RoPE *before* the per-head QK norm, SiLU-gated MLP), so logits
match transformers' to rounding; the unit tests check that.

The decode step is three functions (``first``, ``middle``, ``last``) that take weights as
arguments, so one compiled version serves all layers; attention sits between them, outside
the compiled code (:mod:`hymt_serve.engine.attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hymt_serve.engine import weight_only
from hymt_serve.engine.attention import decode_attention
from hymt_serve.engine.fp8_checkpoint import Fp8Scales
from hymt_serve.engine.inputs import PackedPrompts
from hymt_serve.engine.quantized import (
    FP8,
    QUANTIZERS,
    Int4Parts,
    checkpoint_group,
    int4_group,
    linear,
)


class LayerWeights(NamedTuple):
    """One decoder layer's tensors, in the order the step functions take them as arguments.

    A projection is a bf16/fp16/fp32 weight ``[out, in]`` (its two scales empty); an FP8
    (e4m3) weight with its fp32 scale ``[1]`` and the input's scale: one fp32 value (static,
    from calibration) or empty (dynamic: from each input at run time); an int8 weight with
    fp32 scales ``[out]``; or int4 (int32 ``[in / 8, out]``) with fp16 scales and zero
    points ``[2, groups, out]``. See :func:`linear`."""

    input_norm: Tensor
    qkv: Tensor  # q, k and v projections fused
    q_norm: Tensor
    k_norm: Tensor
    o: Tensor
    post_norm: Tensor
    gate_up: Tensor  # gate and up projections fused
    down: Tensor
    qkv_scale: Tensor
    o_scale: Tensor
    gate_up_scale: Tensor
    down_scale: Tensor
    qkv_input: Tensor
    o_input: Tensor
    gate_up_input: Tensor
    down_input: Tensor


LAYER_TENSORS = len(LayerWeights._fields)


@dataclass(frozen=True)
class ModelShape:
    """The dimensions the forward needs."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    vocab: int

    @property
    def scale(self) -> float:
        return float(self.head_dim**-0.5)


@dataclass(frozen=True)
class ModelWeights:
    """The model's own tensors (q/k/v and gate/up fused, see :func:`fuse_linears`)."""

    embed: Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor
    lm_head: Tensor
    inv_freq: Tensor

    def describe(self) -> dict[str, object]:
        """Which weights and kernels the projections use, and the weights' size."""
        projection = self.layers[0].qkv
        tensors = [self.embed, self.final_norm, *(t for lw in self.layers for t in lw)]
        if self.lm_head.data_ptr() != self.embed.data_ptr():
            tensors.append(self.lm_head)
        facts: dict[str, object] = {
            "weight_bytes": sum(t.numel() * t.element_size() for t in tensors)
        }
        on_gpu = projection.is_cuda and weight_only.has_triton()
        kernel = "Triton weight-only kernel" if on_gpu else "dequantized reference"
        if projection.dtype == torch.int8:
            facts["projections"] = "int8 weight-only, a scale per output row"
            facts["projection_kernel"] = kernel
        if projection.dtype == torch.int32:
            group = weight_only.in_features(projection) // self.layers[0].qkv_scale.shape[1]
            facts["projections"] = f"int4 weight-only, a scale and zero point per {group} inputs"
            facts["projection_kernel"] = kernel
        if projection.dtype == FP8:
            static = self.layers[0].qkv_input.numel() > 0
            facts["projections"] = (
                f"fp8 e4m3, tensor-wise scales, {'static' if static else 'dynamic'} input scales"
            )
            facts["projection_kernel"] = (
                "torch._scaled_mm (tensor-wise)" if projection.is_cuda else "dequantized reference"
            )
        return facts


def fuse_linears(linears: list[nn.Linear]) -> Tensor:
    """Concatenate the weights and rebind each module's weight to a view of the result.

    One matrix product instead of several, with no second copy of the weights: the HF model
    keeps working on the same memory.
    """
    fused = torch.cat([module.weight.detach() for module in linears])
    start = 0
    for module in linears:
        rows = module.weight.shape[0]
        module.weight.data = fused[start : start + rows]
        start += rows
    return fused


def pad_rows(param: nn.Parameter, multiple: int) -> Tensor:
    """Pad a ``[vocab, hidden]`` weight with zero rows to a multiple of ``multiple``.

    An odd vocabulary (128167) makes cuBLAS fall back to an unaligned GEMM for the LM head
    (measured 1.16 ms instead of about 0.3 ms at batch 64 on an H200). The parameter is rebound
    to a view of the padded tensor, so tied embeddings stay tied and no second copy remains.
    """
    weight = param.detach()
    pad = -weight.shape[0] % multiple
    if pad == 0:
        return weight
    padded = torch.cat([weight, weight.new_zeros(pad, weight.shape[1])])
    param.data = padded[: weight.shape[0]]
    return padded


def extract_weights(
    model: nn.Module,
    *,
    quantize: str = "none",
    scales: Fp8Scales | None = None,
    int4: Int4Parts | None = None,
) -> ModelWeights:
    """Collect (and fuse) the weights of a ``HunYuanDenseV1ForCausalLM``; with ``quantize``
    "fp8" its projections become e4m3 with one scale each (inputs scaled at run time), with
    "int8" int8 with a scale per output row (weight-only); either way the model's
    own projection weights are released (it then serves the fast engine only). Fused
    projections (q/k/v, gate/up) share one scale. With an FP8 checkpoint's ``scales`` the
    model's projection weights hold e4m3 values already: they are taken as they are, those
    of a fused group brought to its largest scale (as vLLM does), inputs scaled by the
    group's largest static input scale. With a GPTQ checkpoint's ``int4`` parts (by module
    name, in the weight-only kernel's form) the projections take those; the model's
    dequantized copies are released."""
    hf: Any = model
    core = hf.model
    layers: list[LayerWeights] = []
    for index, layer in enumerate(core.layers):
        attn, mlp = layer.self_attn, layer.mlp
        groups = {
            "qkv": [attn.q_proj, attn.k_proj, attn.v_proj],
            "o": [attn.o_proj],
            "gate_up": [mlp.gate_proj, mlp.up_proj],
            "down": [mlp.down_proj],
        }
        names = {id(m): f"model.layers.{index}.{n}" for n, m in layer.named_modules()}
        projections: dict[str, Tensor] = {}
        for name, linears in groups.items():
            modules = [names[id(m)] for m in linears]
            if scales is not None:
                projections.update(checkpoint_group(name, linears, modules, scales))
                continue
            if int4 is not None and all(module in int4 for module in modules):
                projections.update(int4_group(name, linears, [int4[m] for m in modules]))
                continue
            fused = fuse_linears(linears) if len(linears) > 1 else linears[0].weight.detach()
            empty = fused.new_empty(0, dtype=torch.float32)
            if quantize != "none":
                projections[name], projections[f"{name}_scale"] = QUANTIZERS[quantize](fused)
                for module in linears:  # the dense copy goes: the model keeps the quantized one
                    module.weight.data = fused.new_empty(0)
            else:
                projections[name], projections[f"{name}_scale"] = fused, empty
            projections[f"{name}_input"] = empty
        norms = (layer.input_layernorm, attn.query_layernorm, attn.key_layernorm)
        layers.append(
            LayerWeights(
                input_norm=norms[0].weight.detach(),
                q_norm=norms[1].weight.detach(),
                k_norm=norms[2].weight.detach(),
                post_norm=layer.post_attention_layernorm.weight.detach(),
                **projections,
            )
        )
    lm_head = pad_rows(hf.lm_head.weight, 64)
    return ModelWeights(
        embed=core.embed_tokens.weight.detach(),
        layers=tuple(layers),
        final_norm=core.norm.weight.detach(),
        lm_head=lm_head,
        inv_freq=core.rotary_emb.inv_freq.detach().float(),
    )


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


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def qkv_step(
    x: Tensor, lw: LayerWeights, cos: Tensor, sin: Tensor, shape: ModelShape
) -> tuple[Tensor, Tensor, Tensor]:
    """Tokens ``[N, hidden]`` -> q ``[N, H, D]``, k and v ``[N, KVH, D]`` (RoPE, then QK norm)."""
    qkv = linear(rms_norm(x, lw.input_norm, shape.eps), lw.qkv, lw.qkv_scale, lw.qkv_input)
    q_size, kv_size = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    q, k, v = torch.split(qkv, [q_size, kv_size, kv_size], dim=-1)
    q = q.view(-1, shape.heads, shape.head_dim)
    k = k.view(-1, shape.kv_heads, shape.head_dim)
    cos, sin = cos[:, None, :], sin[:, None, :]
    q = rms_norm(_rotate(q, cos, sin), lw.q_norm, shape.eps)
    k = rms_norm(_rotate(k, cos, sin), lw.k_norm, shape.eps)
    return q, k, v.reshape(-1, shape.kv_heads, shape.head_dim)


def output_step(attn: Tensor, residual: Tensor, lw: LayerWeights, eps: float) -> Tensor:
    """Attention output ``[N, H*D]`` + residual -> the layer's output ``[N, hidden]``."""
    x = residual + linear(attn, lw.o, lw.o_scale, lw.o_input)
    normed = rms_norm(x, lw.post_norm, eps)
    gate, up = linear(normed, lw.gate_up, lw.gate_up_scale, lw.gate_up_input).chunk(2, dim=-1)
    return x + linear(F.silu(gate) * up, lw.down, lw.down_scale, lw.down_input)


def logits_step(x: Tensor, final_norm: Tensor, lm_head: Tensor, shape: ModelShape) -> Tensor:
    """Hidden states ``[N, hidden]`` -> fp32 logits ``[N, vocab]`` (padding rows cut off)."""
    return F.linear(rms_norm(x, final_norm, shape.eps), lm_head)[:, : shape.vocab].float()


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
        x = output_step(attn.flatten(1), residual, done, shape.eps)
        q, k, v = qkv_step(x, following, cos, sin, shape)
        return q, k, v, x

    def last(attn: Tensor, residual: Tensor, norm: Tensor, head: Tensor, *lw: Tensor) -> Tensor:
        x = output_step(attn.flatten(1), residual, LayerWeights(*lw), shape.eps)
        return logits_step(x, norm, head, shape)

    if not compile_:
        return StepFunctions(first, middle, last)  # type: ignore[arg-type]
    # Every engine of a process compiles these same functions again (other weight dtypes and
    # shapes; the weight-only kernel's row classes add graphs): dynamo's default of 8
    # versions per function ran out in a process that built six engines.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return StepFunctions(
        _compiled(first, activations=3), _compiled(middle, activations=4), _compiled(last, 2)
    )


def _compiled(fn: Callable[..., Any], activations: int) -> Callable[..., Any]:
    """Inductor over ``fn``, one graph for batch 1 and one shared by every larger bucket.

    The first ``activations`` arguments have the batch as dimension 0; marking it dynamic
    (batch 1 is always specialised) makes all buckets above 1 share a single compilation; every
    other dimension stays static. No inductor CUDA graphs: the runner captures the whole step.
    """
    compiled = torch.compile(fn, fullgraph=True, dynamic=None)

    def call(*args: Tensor) -> Any:
        for tensor in args[:activations]:
            if tensor.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return compiled(*args)

    return call


def decode_forward(
    weights: ModelWeights,
    shape: ModelShape,
    fns: StepFunctions,
    rope: tuple[Tensor, Tensor],
    caches: tuple[list[Tensor], list[Tensor]],
    batch: tuple[Tensor, Tensor, Tensor],
) -> Tensor:
    """One decode step; ``batch`` is (tokens, positions, slots), each ``[B]``; logits ``[B, V]``."""
    tokens, positions, slots = batch
    cos, sin = rope[0][positions], rope[1][positions]
    x = F.embedding(tokens, weights.embed)
    q, k, v, residual = fns.first(x, cos, sin, *weights.layers[0])
    for i in range(shape.layers):
        attn = decode_attention(q, k, v, caches[0][i], caches[1][i], slots, positions, shape.scale)
        if i + 1 == shape.layers:
            break
        q, k, v, residual = fns.middle(
            attn, residual, cos, sin, *weights.layers[i], *weights.layers[i + 1]
        )
    return fns.last(attn, residual, weights.final_norm, weights.lm_head, *weights.layers[-1])


def packed_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Causal attention within each packed prompt: q ``[N, H, D]``, k/v ``[N, KVH, D]``,
    ``mask [N, N]`` (True where a query may see a key) -> ``[N, H, D]``. Its shapes depend on
    N only, so one CUDA graph serves any mix of prompts that fills N tokens."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
    return out[0].transpose(0, 1)


def prefill_forward(
    weights: ModelWeights,
    shape: ModelShape,
    fns: StepFunctions,
    rope: tuple[Tensor, Tensor],
    caches: tuple[list[Tensor], list[Tensor]],
    batch: PackedPrompts,
) -> Tensor:
    """Packed prompts -> logits after each prompt's last token ``[R, V]``.

    The per-token work (norms, projections, RoPE, MLP) runs on the packed tokens through the
    decode step's own functions (compiled when the decode step is: their batch dimension is
    dynamic), so a layer is a handful of kernels and no compute goes to padding between
    prompts. K/V go straight from the packed tokens into the slots' caches. The last layer's
    MLP and the LM head run for the last tokens only.
    """
    cos, sin = rope[0][batch.positions], rope[1][batch.positions]
    same = batch.sequence[:, None] == batch.sequence[None, :]
    mask = same & (batch.positions[None, :] <= batch.positions[:, None])
    x = F.embedding(batch.ids, weights.embed)
    q, k, v, residual = fns.first(x, cos, sin, *weights.layers[0])
    for i in range(shape.layers):
        caches[0][i][batch.token_slots, :, batch.positions] = k
        caches[1][i][batch.token_slots, :, batch.positions] = v
        attn = packed_attention(q, k, v, mask)
        if i + 1 == shape.layers:
            break
        q, k, v, residual = fns.middle(
            attn, residual, cos, sin, *weights.layers[i], *weights.layers[i + 1]
        )
    return fns.last(
        attn[batch.last],
        residual[batch.last],
        weights.final_norm,
        weights.lm_head,
        *weights.layers[-1],
    )
