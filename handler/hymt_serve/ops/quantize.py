"""Quantized checkpoints in the formats Tencent publishes, written from a bf16 model folder:
``hymt quantize-fp8`` (the -fp8 models: AngelSlim's export, see
:mod:`hymt_serve.engine.checkpoints.fp8`) and :func:`write_gptq_checkpoint` (the GPTQ-Int4
models' layout, :mod:`hymt_serve.engine.checkpoints.gptq`; round-to-nearest, not GPTQ's
error-compensating search: a writer of the format for tests, not a rival quantizer).

Our own quantizer, following that format: every decoder projection's weight becomes
``float8_e4m3fn`` with ``weight_scale`` = its absolute maximum / 448 (float32, ``[1]``), and its
``input_scale`` (bf16, ``[1]``) is the largest absolute input it saw over calibration prompts
(the model card's prompt around sample sentences in several languages) / 448: the static
per-tensor scheme of the published checkpoints. Embeddings, norms and the LM head stay bf16;
config.json gets the ``quantization_config`` AngelSlim writes (``ignored_layers`` spelling, or
``ignore``), and ``hf_quant_config.json`` sits beside it. Tokenizer and other files are copied.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForCausalLM

from hymt_serve.core.settings import Settings
from hymt_serve.engine.checkpoints.fp8 import PROJECTIONS
from hymt_serve.engine.codec import TokenCodec
from hymt_serve.engine.kernels.quantized import FP8_MAX, quantize_tensor
from hymt_serve.engine.kernels.weight_only import pack_int4, quantize_int4_groups
from hymt_serve.request.languages import LANGUAGES
from hymt_serve.request.prompts import build_prompt

IGNORED = ["lm_head", "model.embed_tokens"]
# Sentences for calibration: the scales must cover the inputs translation prompts make.
CALIBRATION = (
    ("The weather is nice today, so we are going for a walk in the park.", "zh"),
    ("Please restart the server before you install the new version.", "de"),
    ("今天的会议改到下午三点，请大家准时参加。", "en"),
    ("La réunion de demain est annulée à cause de la grève.", "ja"),
    ("Der Zug hatte zwanzig Minuten Verspätung, aber wir kamen pünktlich an.", "en"),
    ("このアプリは音声を自動的に文字に変換します。", "ko"),
    ("Он открыл окно, и в комнату ворвался холодный воздух.", "es"),
    ("¿Dónde está la estación de tren más cercana?", "ar"),
)


def quantization_config(ignore_key: str = "ignored_layers") -> dict[str, Any]:
    """The ``quantization_config`` block of the published FP8 checkpoints."""
    args = {"num_bits": 8, "strategy": "tensor", "dynamic": False, "type": "float"}
    return {
        "config_groups": {
            "group_0": {
                "weights": dict(args),
                "input_activations": dict(args),
                "output_activations": None,
                "targets": ["Linear"],
            }
        },
        "kv_cache_scheme": None,
        "format": "naive-quantized",
        ignore_key: list(IGNORED),
        "quantization_status": "compressed",
        "quant_method": "compressed-tensors",
    }


def write_fp8_checkpoint(
    source: Path,
    out: Path,
    *,
    device: str = "cpu",
    ignore_key: str = "ignored_layers",
    prompts: Sequence[Sequence[int]] | None = None,
) -> Path:
    """Write ``source`` (a bf16 model folder) to ``out`` as an FP8 checkpoint; ``prompts``
    (token ids) calibrate the input scales (default: the built-in sentences, templated)."""
    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    model.to(device).eval()
    input_max = _calibrate(model, prompts if prompts is not None else _prompts(source))
    tensors: dict[str, torch.Tensor] = {}
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, tensor in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if tied and name == "lm_head.weight":
            continue  # stored once, as the embeddings (as save_pretrained does)
        if leaf == "weight" and module.endswith(PROJECTIONS):
            weight, scale = quantize_tensor(tensor)  # what the engine does with a bf16 folder
            tensors[name] = weight.cpu()
            tensors[f"{module}.weight_scale"] = scale.cpu()
            input_scale = (input_max[module] / FP8_MAX).clamp(min=1e-12)
            tensors[f"{module}.input_scale"] = input_scale.reshape(1).to(torch.bfloat16).cpu()
        else:
            tensors[name] = tensor.to(torch.bfloat16).contiguous().cpu()
    _copy_folder(source, out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(dtype="bfloat16", quantization_config=quantization_config(ignore_key))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    hf_quant = {
        "quantization": {
            "exclude_modules": list(IGNORED),
            "kv_cache_quant_algo": None,
            "quant_algo": "FP8",
        }
    }
    (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4))
    return out


def _calibrate(model: Any, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """The largest absolute input each projection saw over ``prompts``."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.endswith(PROJECTIONS):

            def record(mod: nn.Module, inputs: tuple[torch.Tensor, ...], name: str = name) -> None:
                peak = inputs[0].detach().abs().amax().float()
                seen[name] = torch.maximum(seen[name], peak) if name in seen else peak

            hooks.append(module.register_forward_pre_hook(record))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for ids in prompts:
                model(torch.tensor([list(ids)], device=device))
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _prompts(source: Path) -> list[list[int]]:
    """The built-in sentences as served: the model card's prompt, then the chat template."""
    codec = TokenCodec.load(Settings.from_mapping({"model_path": str(source)}, environ={}))
    return [
        codec.encode(build_prompt(text, None, LANGUAGES[target])[0]) for text, target in CALIBRATION
    ]


GPTQ_GROUP = 128


def gptq_quantization_config() -> dict[str, Any]:
    """The ``quantization_config`` AngelSlim's ``GPTQ.save`` writes for HY-MT1.5-GPTQ-Int4."""
    return {
        "bits": 4,
        "checkpoint_format": "gptq",
        "desc_act": True,
        "group_size": GPTQ_GROUP,
        "quant_method": "gptq",
        "static_groups": True,
        "sym": True,
        "true_sequential": True,
    }


def gptq_pack(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """One projection ``[out, in]`` as GPTQ's parts: symmetric 4-bit per (group of 128 input
    columns, output row), round to nearest; zero point 8, stored minus one."""
    qweight, scale = quantize_int4_groups(weight, GPTQ_GROUP)
    groups = scale.shape[1]
    zeros = scale[1].to(torch.int32) - 1  # the format's historical offset
    return {
        "qweight": qweight,
        "qzeros": pack_int4(zeros.T.contiguous()).T.contiguous(),
        "scales": scale[0].contiguous(),
        "g_idx": torch.arange(weight.shape[1], dtype=torch.int32) // (weight.shape[1] // groups),
    }


def write_gptq_checkpoint(source: Path, out: Path) -> Path:
    """Write ``source`` (a model folder) to ``out`` in the GPTQ-Int4 layout: every decoder
    projection as ``qweight``/``qzeros``/``scales``/``g_idx``, the rest bf16."""
    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    tensors: dict[str, torch.Tensor] = {}
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, tensor in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if tied and name == "lm_head.weight":
            continue
        if leaf == "weight" and module.endswith(PROJECTIONS):
            for part, value in gptq_pack(tensor).items():
                tensors[f"{module}.{part}"] = value.contiguous()
        else:
            tensors[name] = tensor.to(torch.bfloat16).contiguous()
    _copy_folder(source, out)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(dtype="bfloat16", quantization_config=gptq_quantization_config())
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _copy_folder(source: Path, out: Path) -> None:
    """Every file of ``source`` but its weights and config.json (tokenizer, chat template,
    generation config, markers)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        weights = path.suffix == ".safetensors" or path.name.endswith(".safetensors.index.json")
        if path.is_file() and path.name != "config.json" and not weights:
            shutil.copy2(path, out / path.name)
