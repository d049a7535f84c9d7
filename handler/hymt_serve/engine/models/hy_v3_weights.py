"""``hy_v3`` (Hy-MT2-30B-A3B, a mixture of experts) as loaded: whether a transformers
``HYV3ForCausalLM`` can run on the fast runner (its shape), and its weights collected in the
forward's order. :mod:`.hy_v3` is the forward over them.

Layers are dense (the first, in the published model) or mixtures of experts. A dense layer's
tensors are a :class:`~hymt_serve.engine.models.weights.LayerWeights`; a mixture's are a
:class:`MoeLayerWeights`: the same attention, a router, and every expert's projections stacked
``[experts, out, in]`` as transformers holds them. The shared expert, when it has the experts'
width (the published model's), is stacked as one more expert, so one grouped product serves
both (:mod:`hymt_serve.engine.kernels.experts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

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
    experts' stacks ``[E, 2 x width, hidden]`` (gate rows, then up) and ``[E, hidden, width]``;
    the shared expert's fused gate/up and down when it is not stacked (else empty)."""

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
    model: nn.Module, *, quantize: str = "none", quantize_head: bool = False
) -> ModelWeights:
    """Collect a ``HYV3ForCausalLM``'s weights (q/k/v and gate/up fused, the shared expert
    stacked after the routed ones), rebinding the model's own parameters to views of the
    fused tensors so the weights are held once. Plain (bf16/fp16/fp32) weights only."""
    if quantize != "none" or quantize_head:
        raise UnsupportedModelError(
            f"hy_v3 runs on the fast engine with plain weights; quantize {quantize!r} is not "
            "supported for it"
        )
    hf: Any = model
    core = hf.model
    layers: list[LayerWeights | MoeLayerWeights] = []
    for layer in core.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        empty = qkv.new_empty(0, dtype=torch.float32)
        common = {
            "input_norm": layer.input_layernorm.weight.detach(),
            "qkv": qkv,
            "q_norm": attn.q_norm.weight.detach(),
            "k_norm": attn.k_norm.weight.detach(),
            "o": attn.o_proj.weight.detach(),
            "post_norm": layer.post_attention_layernorm.weight.detach(),
            "qkv_scale": empty,
            "o_scale": empty,
            "qkv_input": empty,
            "o_input": empty,
        }
        if not hasattr(mlp, "experts"):
            gate_up = fuse_linears([mlp.gate_proj, mlp.up_proj])
            layers.append(
                LayerWeights(
                    **common,
                    gate_up=gate_up,
                    down=mlp.down_proj.weight.detach(),
                    gate_up_scale=empty,
                    down_scale=empty,
                    gate_up_input=empty,
                    down_input=empty,
                )
            )
            continue
        layers.append(MoeLayerWeights(**common, **_experts(mlp, empty)))
    lm_head = pad_rows(hf.lm_head.weight, 64)
    if getattr(hf.config, "enable_lm_head_fp32", False):
        # The published config asks for the head in fp32 (as SGLang runs it; transformers
        # ignores the key): the fp32 copy replaces the model's own.
        lm_head = lm_head.float()
        hf.lm_head.weight.data = hf.lm_head.weight.new_empty(0)
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


def _experts(mlp: Any, empty: Tensor) -> dict[str, Tensor]:
    """A mixture's router, bias, expert stacks and shared expert (stacked when it has the
    experts' width: its weights become views of the stacks, the routed experts' too)."""
    experts, shared = mlp.experts, mlp.shared_experts
    gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    parts = {
        "router": mlp.gate.weight.detach().float(),
        "expert_bias": mlp.e_score_correction_bias.detach().float(),
    }
    if shared.gate_proj.weight.shape[0] * 2 != gate_up.shape[1]:
        return {
            **parts,
            "experts_gate_up": gate_up,
            "experts_down": down,
            "shared_gate_up": fuse_linears([shared.gate_proj, shared.up_proj]),
            "shared_down": shared.down_proj.weight.detach(),
        }
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
        **parts,
        "experts_gate_up": stacked_gate_up,
        "experts_down": stacked_down,
        "shared_gate_up": empty,
        "shared_down": empty,
    }
