"""``hy_v3`` (Hy-MT2-30B-A3B, a mixture of experts) as loaded: whether a transformers
``HYV3ForCausalLM`` can run on the fast runner (its shape), and its weights collected in the
forward's order. :mod:`.hy_v3` is the forward over them.

Layers are dense (the first, in the published model) or mixtures of experts. A dense layer's
tensors are a :class:`~hymt_serve.engine.models.weights.LayerWeights`; a mixture's are a
:class:`MoeLayerWeights`: the same attention, a router, and every expert's projections stacked
``[experts, out, in]`` as transformers holds them. The shared expert, when it has the experts'
width (the published model's), is stacked as one more expert, so one grouped product serves
both (:mod:`hymt_serve.engine.kernels.experts`).

FP8 (``quantize`` "fp8", or an FP8 checkpoint's scales): the attention projections and the
dense layer's MLP become e4m3 with one scale each, as the dense family's
(:func:`~hymt_serve.engine.kernels.quantized.linear`); the expert stacks become e4m3 with a
scale per expert and output row (:mod:`hymt_serve.engine.kernels.experts_fp8`), a
checkpoint's taken as they are (its loader read them, :mod:`hymt_serve.engine.checkpoints.
fp8_moe`), a bf16 model's quantized here. The router, the expert bias, norms, embeddings and
the LM head stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from hymt_serve.engine.checkpoints.fp8 import Fp8Scales
from hymt_serve.engine.kernels.experts_fp8 import quantize_rows
from hymt_serve.engine.kernels.quantized import checkpoint_group, quantize_tensor, unit_scale
from hymt_serve.engine.models.base import UnsupportedModelError, check_plain
from hymt_serve.engine.models.weights import (
    LayerWeights,
    ModelShape,
    ModelWeights,
    fuse_linears,
    pad_rows,
)

MODEL_TYPE = "hy_v3"


@dataclass(frozen=True)
class MoeShape(ModelShape):
    """A ``hy_v3`` model's dimensions: the decoder's, and its mixtures'."""

    experts: int = 0  # routed experts (the shared one not counted)
    top_k: int = 0
    routed_scale: float = 1.0  # the chosen experts' weights sum to this
    sparse: tuple[bool, ...] = ()  # per layer: a mixture (True) or a dense MLP
    shared_stacked: bool = True  # the shared expert is expert ``experts`` of the stack


class MoeLayerWeights(NamedTuple):
    """A mixture-of-experts layer's tensors. Projections as in ``LayerWeights`` (a weight, its
    scale and its input's scale, both empty for plain weights); the router in fp32; the
    experts' stacks ``[E, 2 x width, hidden]`` (gate rows, then up) and ``[E, hidden, width]``,
    with their fp32 row scales ``[E, rows]`` when e4m3 (else empty); the shared expert's fused
    gate/up and down when it is not stacked (else empty), with scales as a projection's."""

    input_norm: Tensor
    qkv: Tensor
    q_norm: Tensor
    k_norm: Tensor
    o: Tensor
    post_norm: Tensor
    qkv_scale: Tensor
    o_scale: Tensor
    qkv_input: Tensor
    o_input: Tensor
    router: Tensor  # fp32 [experts, hidden]
    expert_bias: Tensor  # fp32 [experts], added to the scores to choose only
    experts_gate_up: Tensor
    experts_down: Tensor
    shared_gate_up: Tensor
    shared_down: Tensor
    experts_gate_up_scale: Tensor
    experts_down_scale: Tensor
    shared_gate_up_scale: Tensor
    shared_gate_up_input: Tensor
    shared_down_scale: Tensor
    shared_down_input: Tensor


def check_model(model: nn.Module) -> MoeShape:
    """The model's shape, or :class:`UnsupportedModelError` naming the first obstacle."""
    hf: Any = model
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != MODEL_TYPE:
        raise UnsupportedModelError(f"model_type must be {MODEL_TYPE}, got {config!r:.80}")
    check_plain(model)
    if config.hidden_act != "silu" or config.attention_bias or config.mlp_bias:  # type: ignore[union-attr]
        raise UnsupportedModelError("only hidden_act=silu without biases is supported")
    rotary = hf.model.rotary_emb
    if rotary.rope_type != "default" or getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise UnsupportedModelError(f"RoPE {config.rope_parameters} is not the default kind")  # type: ignore[union-attr]
    kinds = tuple(config.mlp_layer_types)  # type: ignore[union-attr]
    if set(kinds) - {"dense", "sparse"}:
        raise UnsupportedModelError(f"mlp_layer_types must be dense or sparse, got {set(kinds)}")
    # The published config.json says first_k_dense_replace (transformers reads mlp_layer_types,
    # defaulting to one dense layer first): a checkpoint whose two disagree is not the model
    # transformers built, so its layers would hold the wrong weights.
    dense_first = getattr(config, "first_k_dense_replace", None)
    if dense_first is not None and kinds != ("dense",) * dense_first + ("sparse",) * (
        len(kinds) - dense_first
    ):
        raise UnsupportedModelError(
            f"first_k_dense_replace {dense_first} disagrees with mlp_layer_types {kinds}"
        )
    shared = config.num_shared_experts or 0  # type: ignore[union-attr]
    return MoeShape(
        layers=config.num_hidden_layers,  # type: ignore[union-attr]
        heads=config.num_attention_heads,  # type: ignore[union-attr]
        kv_heads=config.num_key_value_heads,  # type: ignore[union-attr]
        head_dim=hf.model.layers[0].self_attn.head_dim,
        eps=float(config.rms_norm_eps),  # type: ignore[union-attr]
        vocab=config.vocab_size,  # type: ignore[union-attr]
        experts=config.num_experts,  # type: ignore[union-attr]
        top_k=config.num_experts_per_tok,  # type: ignore[union-attr]
        routed_scale=float(config.router_scaling_factor),  # type: ignore[union-attr]
        sparse=tuple(kind == "sparse" for kind in kinds[: config.num_hidden_layers]),  # type: ignore[union-attr]
        shared_stacked=shared == 1,
    )


def extract_weights(
    model: nn.Module,
    *,
    quantize: str = "none",
    scales: Fp8Scales | None = None,
    quantize_head: bool = False,
) -> ModelWeights:
    """Collect a ``HYV3ForCausalLM``'s weights (q/k/v and gate/up fused, the shared expert
    stacked after the routed ones), rebinding the model's own parameters to views of the
    fused tensors so the weights are held once. ``quantize`` "fp8" or an FP8 checkpoint's
    ``scales`` make them e4m3 (see the module's docstring; the model's own copies are
    released: it then serves the fast engine only). Other quantizations and a quantized
    LM head are refused with :class:`UnsupportedModelError`."""
    if quantize not in ("none", "fp8") or quantize_head:
        what = "a quantized LM head" if quantize_head else f"quantize {quantize!r}"
        raise UnsupportedModelError(f"hy_v3 runs on the fast engine in bf16 or fp8; {what} is not")
    hf: Any = model
    core = hf.model
    layers: list[LayerWeights | MoeLayerWeights] = []
    for index, layer in enumerate(core.layers):
        attn, mlp = layer.self_attn, layer.mlp
        names = {id(m): f"model.layers.{index}.{n}" for n, m in layer.named_modules()}

        def group(name: str, linears: list[nn.Linear], names: dict[int, str] = names) -> Parts:
            return _group(name, linears, [names[id(m)] for m in linears], quantize, scales)

        common = {
            "input_norm": layer.input_layernorm.weight.detach(),
            "q_norm": attn.q_norm.weight.detach(),
            "k_norm": attn.k_norm.weight.detach(),
            "post_norm": layer.post_attention_layernorm.weight.detach(),
            **group("qkv", [attn.q_proj, attn.k_proj, attn.v_proj]),
            **group("o", [attn.o_proj]),
        }
        if not hasattr(mlp, "experts"):
            mlp_parts = {
                **group("gate_up", [mlp.gate_proj, mlp.up_proj]),
                **group("down", [mlp.down_proj]),
            }
            layers.append(LayerWeights(**common, **mlp_parts))
            continue
        layers.append(
            MoeLayerWeights(
                **common, **_mixture(mlp, f"model.layers.{index}.mlp", group, quantize, scales)
            )
        )
    lm_head = pad_rows(hf.lm_head.weight, 64)
    if getattr(hf.config, "enable_lm_head_fp32", False):
        # The published config asks for the head in fp32 (as SGLang runs it; transformers
        # ignores the key): the fp32 copy replaces the model's own.
        lm_head = lm_head.float()
        hf.lm_head.weight.data = hf.lm_head.weight.new_empty(0)
    if quantize == "fp8" or scales is not None:
        unit_scale(lm_head.device)  # made before the step functions are compiled
    empty = lm_head.new_empty(0, dtype=torch.float32)
    return ModelWeights(
        embed=core.embed_tokens.weight.detach(),
        layers=tuple(layers),  # type: ignore[arg-type]
        final_norm=core.norm.weight.detach(),
        lm_head=lm_head,
        inv_freq=core.rotary_emb.inv_freq.detach().float(),
        embed_scale=empty,
        lm_head_scale=empty,
        lm_head_input=empty,
    )


Parts = dict[str, Tensor]
# An FP8 checkpoint's stacks as its loader hands them over (Fp8Scales.experts), in this order.
STACK_NAMES = ("experts_gate_up", "experts_gate_up_scale", "experts_down", "experts_down_scale")


def _group(
    name: str, linears: list[nn.Linear], modules: list[str], quantize: str, scales: Fp8Scales | None
) -> Parts:
    """One fused group of projections: plain, quantized to e4m3 with one scale (the dense
    family's form), or an FP8 checkpoint's own e4m3 values and scales."""
    if scales is not None:
        return checkpoint_group(name, linears, modules, scales)
    fused = fuse_linears(linears) if len(linears) > 1 else linears[0].weight.detach()
    empty = fused.new_empty(0, dtype=torch.float32)
    if quantize != "fp8":
        return {name: fused, f"{name}_scale": empty, f"{name}_input": empty}
    weight, scale = quantize_tensor(fused)
    for linear in linears:  # the bf16 copy goes: the engine keeps the e4m3 one
        linear.weight.data = fused.new_empty(0)
    return {name: weight, f"{name}_scale": scale, f"{name}_input": empty}


def _mixture(mlp: Any, prefix: str, group: Any, quantize: str, scales: Fp8Scales | None) -> Parts:
    """A mixture's router, bias, expert stacks (with row scales when e4m3) and shared
    expert (a projection pair when it is not stacked)."""
    if scales is not None:  # the checkpoint's e4m3 stacks, read by its loader
        stacks = scales.experts[prefix]
        parts: Parts = dict(zip(STACK_NAMES, stacks, strict=True))
        shared_stacked = stacks[0].shape[0] > mlp.experts.num_experts
    else:
        parts = _experts(mlp)
        shared_stacked = parts.pop("shared_stacked") is not None
        if quantize == "fp8":
            parts = _quantize_stacks(mlp, parts)
    shared = mlp.shared_experts
    empty = parts["experts_gate_up"].new_empty(0, dtype=torch.float32)
    if shared_stacked:
        parts.update(
            {f"shared_{n}{s}": empty for n in ("gate_up", "down") for s in ("", "_scale", "_input")}
        )
    else:
        gate_up = group("gate_up", [shared.gate_proj, shared.up_proj])
        down = group("down", [shared.down_proj])
        parts.update({f"shared_{k}": v for k, v in {**gate_up, **down}.items()})
    if "experts_gate_up_scale" not in parts:
        parts.update(experts_gate_up_scale=empty, experts_down_scale=empty)
    return {
        "router": mlp.gate.weight.detach().float(),
        "expert_bias": mlp.e_score_correction_bias.detach().float(),
        **parts,
    }


def _experts(mlp: Any) -> Parts:
    """The experts' stacks as the model holds them, the shared expert stacked after them when
    it has their width (its weights and the routed experts' become views of the stacks);
    ``shared_stacked`` says whether it was (None when not)."""
    experts, shared = mlp.experts, mlp.shared_experts
    gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    if shared.gate_proj.weight.shape[0] * 2 != gate_up.shape[1]:
        return {"experts_gate_up": gate_up, "experts_down": down, "shared_stacked": None}
    shared_gate_up = torch.cat([shared.gate_proj.weight.detach(), shared.up_proj.weight.detach()])
    stacked_gate_up = torch.cat([gate_up, shared_gate_up[None]])
    stacked_down = torch.cat([down, shared.down_proj.weight.detach()[None]])
    count, width = gate_up.shape[0], gate_up.shape[1] // 2
    experts.gate_up_proj.data = stacked_gate_up[:count]
    experts.down_proj.data = stacked_down[:count]
    shared.gate_proj.weight.data = stacked_gate_up[count, :width]
    shared.up_proj.weight.data = stacked_gate_up[count, width:]
    shared.down_proj.weight.data = stacked_down[count]
    return {
        "experts_gate_up": stacked_gate_up,
        "experts_down": stacked_down,
        "shared_stacked": stacked_down,
    }


def _quantize_stacks(mlp: Any, parts: Parts) -> Parts:
    """The stacks as e4m3 with row scales; the model's bf16 copies (views of the stacks,
    the shared expert's too when stacked) are released."""
    gate_up, gate_up_scale = quantize_rows(parts["experts_gate_up"])
    down, down_scale = quantize_rows(parts["experts_down"])
    released = [mlp.experts.gate_up_proj, mlp.experts.down_proj]
    if parts["experts_gate_up"].shape[0] > mlp.experts.gate_up_proj.shape[0]:  # shared stacked
        shared = mlp.shared_experts
        released += [shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight]
    for tensor in released:
        tensor.data = tensor.new_empty(0)
    return {
        "experts_gate_up": gate_up,
        "experts_gate_up_scale": gate_up_scale,
        "experts_down": down,
        "experts_down_scale": down_scale,
    }
