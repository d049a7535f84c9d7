"""``hunyuan_v1_dense`` as loaded: whether a transformers model can run on the fast runner (its
shape, its RoPE, whether its norms fit fp16), and its weights collected in the step's order,
fused and quantized as the settings ask. :mod:`.hunyuan_v1_dense` is the forward over them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from hymt_serve.engine.checkpoints.fp8 import Fp8Scales
from hymt_serve.engine.kernels.quantized import (
    FP8,
    QUANTIZERS,
    Int4Parts,
    checkpoint_group,
    int4_group,
    unit_scale,
)
from hymt_serve.engine.models.base import UnsupportedModelError, check_plain
from hymt_serve.engine.models.weights import (
    LayerWeights,
    ModelShape,
    ModelWeights,
    fuse_linears,
    pad_rows,
)

MODEL_TYPE = "hunyuan_v1_dense"


def check_model(model: nn.Module) -> ModelShape:
    """The model's shape, or :class:`UnsupportedModelError` naming the first obstacle."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != MODEL_TYPE:
        raise UnsupportedModelError(f"model_type must be {MODEL_TYPE}, got {config!r:.80}")
    check_plain(model)
    if config.hidden_act != "silu" or config.attention_bias:  # type: ignore[union-attr]
        raise UnsupportedModelError("only hidden_act=silu without attention bias is supported")
    _check_rope(model)
    return ModelShape(
        layers=config.num_hidden_layers,  # type: ignore[union-attr]
        heads=config.num_attention_heads,  # type: ignore[union-attr]
        kv_heads=config.num_key_value_heads,  # type: ignore[union-attr]
        head_dim=model.model.layers[0].self_attn.head_dim,  # type: ignore[union-attr,index]
        eps=float(config.rms_norm_eps),  # type: ignore[union-attr]
        vocab=config.vocab_size,  # type: ignore[union-attr]
        norms_fit_fp16=norms_fit_fp16(model),
    )


FP16_NORM_INPUTS = True  # off: int8 products never take fp16 inputs (to compare)


def norms_fit_fp16(model: nn.Module) -> bool:
    """Whether every norm that feeds a projection (each layer's two, the final one) has an
    output that fits fp16. RMSNorm divides by the root mean square, so no element of its
    normalised input exceeds sqrt(hidden) in size (one element holding all of the sum), and
    the output is at most sqrt(hidden) * max |g|; 1 % of headroom covers the bf16 rounding of
    the product. With 4,096 hidden units that is any norm weight under about 1,013."""
    if not FP16_NORM_INPUTS:
        return False
    core: Any = model.model
    norms: list[torch.Tensor] = [core.norm.weight]
    for layer in core.layers:
        norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    largest = max(float(w.detach().abs().max()) for w in norms)
    return bool(largest * norms[0].numel() ** 0.5 * 1.01 < torch.finfo(torch.float16).max)


def _check_rope(model: nn.Module) -> None:
    hf: Any = model
    rotary = hf.model.rotary_emb
    params = hf.config.rope_parameters or {}
    fixed = rotary.rope_type == "default" or (rotary.rope_type == "dynamic" and params.get("alpha"))
    if not fixed or getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise UnsupportedModelError(f"RoPE {params} changes with position; only fixed bases run")


# The LM head is quantized like the projections: e4m3 tensor-wise, or int8 with row scales;
# beside int4 projections in int8 (a 4-bit head moves the logits much further).
HEAD_FORMS = {FP8: "fp8", torch.int8: "int8", torch.int32: "int8"}


def extract_weights(
    model: nn.Module,
    *,
    quantize: str = "none",
    scales: Fp8Scales | None = None,
    int4: Int4Parts | None = None,
    quantize_head: bool = False,
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
    dequantized copies are released. ``quantize_head`` makes the LM head fp8 or int8 like
    the projections, int8 beside int4 ones (and the embedding, when tied to it, reads the
    same quantized table); ValueError for plain projections."""
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
    tied = hf.lm_head.weight is core.embed_tokens.weight
    lm_head = pad_rows(hf.lm_head.weight, 64)
    embed = core.embed_tokens.weight.detach()
    empty = lm_head.new_empty(0, dtype=torch.float32)
    head_scale = embed_scale = empty
    if quantize_head:
        form = HEAD_FORMS.get(layers[0].qkv.dtype)
        if form is None:
            got = layers[0].qkv.dtype
            raise ValueError(
                f"the LM head is quantized like fp8, int8 or int4 projections, not {got}"
            )
        lm_head, head_scale = QUANTIZERS[form](lm_head)
        hf.lm_head.weight.data = hf.lm_head.weight.new_empty(0)  # the dense copy goes
        if tied:  # one table for both: the embedding reads the quantized rows
            embed, embed_scale = lm_head[: embed.shape[0]], head_scale
    if FP8 in (layers[0].qkv.dtype, lm_head.dtype):
        unit_scale(lm_head.device)  # made before the step functions are compiled
    return ModelWeights(
        embed=embed,
        layers=tuple(layers),
        final_norm=core.norm.weight.detach(),
        lm_head=lm_head,
        inv_freq=core.rotary_emb.inv_freq.detach().float(),
        embed_scale=embed_scale,
        lm_head_scale=head_scale,
        lm_head_input=empty,
    )
