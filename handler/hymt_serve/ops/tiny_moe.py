"""Build Hy-MT2-30B-A3B's form (``hy_v3``, a mixture of experts) with random weights: a tiny
model folder with that family's tokens, chat template and sampling for demos and tests, and the
full shape on a GPU for benchmarks. A set-up tool, not part of the serving path; the dense
family's counterpart is :mod:`hymt_serve.ops.tiny_model`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hymt_serve.core.types import TINY_MODEL_MARKER
from hymt_serve.ops.tiny_model import mute_unprintable_tokens, train_byte_bpe

# Hy-MT2-30B-A3B's tokens (its tokenizer's characters: full-width bars U+FF5C, U+2581 as the
# word separator). Its end of sequence (120025) is written two ways in its releases; ours is the
# newer one, and the engine stops on the ids config.json names whatever their text.
MOE_SPECIAL_TOKENS = (
    "<\uff5chy_begin\u2581of\u2581sentence\uff5c>",
    "<\uff5chy_end\u2581of\u2581sentence\uff5c>",
    "<\uff5chy_\u2581pad\u2581\uff5c>",
    "<\uff5chy_User\uff5c>",
    "<\uff5chy_Assistant\uff5c>",
    "<\uff5chy_EOT\uff5c>",
    "<\uff5chy_eos\uff5c>",
    "<\uff5chy_place\u2581holder\u2581no\u25818\uff5c>",
)
# Added tokens the real tokenizer does not mark special: the engine still never reads them in
# user text (codec.text_ids).
MOE_UNMARKED_TOKENS = ("<think>", "</think>", "<\uff5creasoning_mode\uff5c>")
MOE_BOS, MOE_PAD, MOE_EOS, MOE_EOD = (MOE_SPECIAL_TOKENS[i] for i in (0, 2, 6, 7))
# Its chat template as it renders: the system prompt (if any) after BOS, then the reasoning
# mode (no thinking for translation), then the turns; an answer opens with an empty think block.
MOE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}{% endif %}"
    "{% endfor %}"
    "<\uff5creasoning_mode\uff5c>reasoning_effort:{{ reasoning_effort | default('no_think') }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<\uff5chy_User\uff5c>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<\uff5chy_Assistant\uff5c><think></think>"
    "{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<\uff5chy_Assistant\uff5c><think></think>{% endif %}"
)
# Its recommended sampling (the Hy-MT2 card, 30B-A3B): no top-k, no repetition penalty.
MOE_SAMPLING = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}
TINY_MOE_SHAPE: dict[str, Any] = {
    "num_hidden_layers": 3,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 32,
    "router_scaling_factor": 2.826,
    "rope_parameters": {"rope_type": "default", "rope_theta": 11158840.0},
    "tie_word_embeddings": False,
}
# Hy-MT2-30B-A3B's shape (``hy_v3``: 30.06 B parameters, 3.3 B of them active per token, 60 GB
# in bf16): its first layer dense, the others 128 experts of width 768 (8 chosen per token) and
# one shared expert. For benchmarks with random weights, as SEVEN_B_SHAPE.
HY_MT2_30B_SHAPE: dict[str, Any] = {
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "intermediate_size": 6912,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 120832,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_shared_experts": 1,
    "moe_intermediate_size": 768,
    "router_scaling_factor": 2.826,
    "rope_parameters": {"rope_type": "default", "rope_theta": 11158840.0},
    "bos_token_id": 120000,
    "eos_token_id": 120025,
    "pad_token_id": 120002,
    "tie_word_embeddings": False,
}


def build_moe_tokenizer() -> Any:
    """A small byte-level BPE tokenizer with Hy-MT2-30B-A3B's tokens and chat template."""
    # tokenizers and transformers take seconds: hymt imports this module for every command
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_byte_bpe(MOE_SPECIAL_TOKENS)
    tokenizer.add_tokens([AddedToken(t, special=False) for t in MOE_UNMARKED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=MOE_BOS,
        eos_token=MOE_EOS,
        pad_token=MOE_PAD,
        chat_template=MOE_CHAT_TEMPLATE,
    )


def random_30b_a3b_model(device: str = "cuda", seed: int = 0, layers: int | None = None) -> Any:
    """Hy-MT2-30B-A3B's shape (``hy_v3``) with random bf16 weights, built on ``device``;
    ``layers``: fewer layers than the real 48 (probes of one layer's cost). The routers'
    weights are drawn wider than transformers' init (std 0.05, not 0.006) so that tokens
    choose varied experts, as a trained router's do, not ties that rounding decides."""
    import torch  # seconds: see build_moe_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(
        HY_MT2_30B_SHAPE, num_hidden_layers=layers or HY_MT2_30B_SHAPE["num_hidden_layers"]
    )
    config = AutoConfig.for_model(model_type="hy_v3", **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0.0, 0.05)
    return model


def build_tiny_moe_model(out_dir: Path, seed: int = 0) -> Path:
    """Write a tiny random ``hy_v3`` folder (Hy-MT2-30B-A3B's form: a dense first layer, then
    mixtures of 8 experts and a shared one) with a tokenizer of that family's tokens and chat
    template, and its recommended sampling in ``generation_config.json``."""
    import torch  # seconds: see build_moe_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    tokenizer = build_moe_tokenizer()
    ids = {name: int(tokenizer.convert_tokens_to_ids(name)) for name in MOE_SPECIAL_TOKENS}
    ends = [ids[MOE_EOS], ids[MOE_EOD]]
    config = AutoConfig.for_model(
        model_type="hy_v3",
        vocab_size=len(tokenizer),
        bos_token_id=ids[MOE_BOS],
        eos_token_id=ids[MOE_EOS],
        pad_token_id=ids[MOE_PAD],
        eod_token_id=ids[MOE_EOD],
        **TINY_MOE_SHAPE,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    mute_unprintable_tokens(model, tokenizer, keep=set(ends))
    model.generation_config = GenerationConfig(
        do_sample=True, eos_token_id=ends, pad_token_id=ids[MOE_PAD], **MOE_SAMPLING
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    about = {
        "random_weights": True,
        "tokenizer": "fallback (Hy-MT2-30B-A3B's tokens and template)",
        "note": "random weights: its translations are meaningless; serve a real model folder",
    }
    (out_dir / TINY_MODEL_MARKER).write_text(json.dumps(about, indent=2) + "\n")
    return out_dir


# What AngelSlim writes into config.json for a per-tensor, static FP8 export of hy_v3
# (tools/fp8_quant_with_vllm_activation.py; PTQSaveVllmHF with save_name "fp8" writes the same
# keys): weight_block_size absent means tensor-wise.
MOE_FP8_CONFIG = {
    "activation_scheme": "static",
    "ignored_layers": ["lm_head", "model.embed_tokens"],
    "quant_method": "fp8",
}
# transformers' module names -> the published checkpoint's (transformers maps these back)
ON_DISK = ((".mlp.gate.weight", ".mlp.router.gate.weight"),
           (".mlp.e_score_correction_bias", ".mlp.expert_bias"),
           (".mlp.shared_experts.", ".mlp.shared_mlp."))  # fmt: skip


def write_moe_fp8_checkpoint(source: Path, out: Path, prompts: list[list[int]]) -> Path:
    """Write ``source`` (a ``hy_v3`` folder) to ``out`` as AngelSlim's FP8 export of it: every
    projection (attention, the dense layer's MLP, each routed expert and the shared one, under
    the published per-expert names) ``float8_e4m3fn`` with an fp32 ``weight_scale`` (its
    absolute maximum / 448, shape ``[1]``) and an fp32 ``input_scale`` (the largest absolute
    input over ``prompts`` / 448: for the experts the mixture's input to gate and up, and to
    down the largest over every token's own SiLU(gate) * up); router, bias, norms, embeddings
    and LM head in bf16. Round to nearest, as AngelSlim's per-tensor export does."""
    import torch  # seconds: see build_moe_tokenizer
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    # torch again, through the engine's kernels (seconds): only when writing a checkpoint
    from hymt_serve.engine.kernels.quantized import FP8_MAX, quantize_tensor
    from hymt_serve.ops.quantize import _copy_folder

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    peaks = _input_peaks(model, prompts)
    tensors: dict[str, Any] = {}

    def put(name: str, weight: Any, peak: Any) -> None:
        tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"] = quantize_tensor(weight)
        tensors[f"{name}.input_scale"] = (peak / FP8_MAX).clamp(min=1e-12).reshape(1).float()

    for name, tensor in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if name.endswith("experts.gate_up_proj"):
            width = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                put(f"{module}.{e}.gate_proj", tensor[e, :width], peaks[module])
                put(f"{module}.{e}.up_proj", tensor[e, width:], peaks[module])
        elif name.endswith("experts.down_proj"):
            for e in range(tensor.shape[0]):
                put(f"{module}.{e}.down_proj", tensor[e], peaks[f"{module}.down"][e])
        elif leaf == "weight" and module in peaks:
            put(module, tensor, peaks[module])
        else:
            tensors[name] = tensor.to(torch.bfloat16)
    for old, new in ON_DISK:
        tensors = {name.replace(old, new): value.contiguous() for name, value in tensors.items()}
    _copy_folder(source, out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(dtype="bfloat16", quantization_config=dict(MOE_FP8_CONFIG))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _input_peaks(model: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """The largest absolute input of every projection (by module name) over ``prompts``;
    for each mixture's experts (``...mlp.experts``) their common input, and
    (``...mlp.experts.down``) each expert's largest down input over every token."""
    import torch  # seconds: see build_moe_tokenizer
    import torch.nn.functional as F

    seen: dict[str, Any] = {}

    def record(name: str, value: Any) -> None:
        seen[name] = torch.maximum(seen[name], value) if name in seen else value

    def hook(module: Any, inputs: tuple[Any, ...], name: str) -> None:
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
        record(name, x.abs().amax())
        if name.endswith(".mlp.experts"):
            width = module.gate_up_proj.shape[1] // 2
            both = torch.einsum("th,eoh->eto", x, module.gate_up_proj.detach())
            h = F.silu(both[..., :width]) * both[..., width:]
            record(f"{name}.down", h.abs().amax(dim=(1, 2)))

    handles = [
        module.register_forward_pre_hook(lambda m, i, name=name: hook(m, i, name))
        for name, module in model.named_modules()
        if name.endswith(".mlp.experts") or (isinstance(module, torch.nn.Linear) and "proj" in name)
    ]
    try:
        with torch.no_grad():
            for ids in prompts:
                model(torch.tensor([ids]))
    finally:
        for handle in handles:
            handle.remove()
    return seen
