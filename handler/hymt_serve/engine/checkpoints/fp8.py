"""Tencent's FP8 checkpoints (Hunyuan-MT-7B-fp8, Hunyuan-MT-Chimera-7B-fp8, HY-MT1.5-*-FP8):
recognising their format and reading their scales, without the compressed-tensors package.

The format, as Tencent's AngelSlim writes it (``angelslim/compressor/quant/core/save.py``) and
compressed-tensors reads it (``quant_method: compressed-tensors``, ``format: naive-quantized``):
every decoder projection (``q/k/v/o_proj``, ``gate/up/down_proj``) is stored as ``weight`` in
``float8_e4m3fn`` with a ``weight_scale`` (one float32 value, shape ``[1]``) and, for the static
scheme the cards describe, an ``input_scale`` (one value, in the model's dtype); embeddings,
norms and ``lm_head`` stay bf16 and are listed as not quantized under ``ignored_layers``
(AngelSlim's spelling, what the published configs hold) or ``ignore`` (compressed-tensors' own).
``weight ~= weight_fp8 * weight_scale``, and an input is quantized as
``clamp(x / input_scale, -448, 448)``.

Loading: transformers reads the checkpoint with its ``quantization_config`` removed, which puts
each FP8 weight into the model's dtype exactly (every e4m3 value is a bf16 value); the fast
engine turns those back into e4m3 with the scales read here (the architecture's
``extract_weights``, e.g.
:func:`hymt_serve.engine.models.hunyuan_v1_dense_weights.extract_weights`).
The same tensors also come under ``quant_method: fp8`` (AngelSlim's ``save_name: fp8``, the
form its Hy3 / ``hy_v3`` configs and its vLLM-calibrated export write, and vLLM's and
transformers' own FP8 format): ``{"quant_method": "fp8", "activation_scheme": "static" |
"dynamic", "ignored_layers": [...]}``, tensor-wise when ``weight_block_size`` is absent or
null; a ``kv_cache_scheme`` there is an FP8 cache's option, left unused (the cache stays in
the model's dtype). Block-wise scales (``weight_block_size`` set, ``weight_scale_inv``
tensors) are refused by name: no published Hunyuan checkpoint is known to use them.
Anything else under ``quantization_config`` is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import safe_open
from torch import Tensor

from hymt_serve.core.errors import ConfigurationError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SUPPORTED = (
    "compressed-tensors or quant_method fp8 FP8 (e4m3, tensor-wise weights, static or dynamic "
    "tensor-wise inputs)"
)


@dataclass(frozen=True)
class Fp8Scales:
    """A checkpoint's scales by module name (``model.layers.0.self_attn.q_proj``): each
    weight's, and each input's where the scheme is static (fp32 ``[1]`` tensors)."""

    weight: dict[str, Tensor]
    input: dict[str, Tensor]
    static: bool
    method: str = "compressed-tensors"  # the config's quant_method
    # A mixture's expert stacks as read (hy_v3, :mod:`.fp8_moe`), by the mixture's module name
    # (``model.layers.3.mlp``): e4m3 gate/up, its fp32 row scales, e4m3 down, its row scales.
    experts: dict[str, tuple[Tensor, Tensor, Tensor, Tensor]] = field(default_factory=dict)

    def describe(self) -> str:
        inputs = "static input scales" if self.static else "dynamic input scales, per token"
        return f"FP8 checkpoint ({self.method}, tensor-wise, {inputs})"


def fp8_scheme(config: dict[str, Any]) -> bool | None:
    """None for a config without ``quantization_config``; for Tencent's FP8 format whether its
    input scales are static; ConfigurationError for any other quantization."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method == "fp8":
        return _fp8_method(quantization)
    if method != "compressed-tensors":
        raise ConfigurationError(
            f"this checkpoint is quantized with {method!r}; supported: {SUPPORTED}"
        )
    groups = quantization.get("config_groups") or {}
    if len(groups) != 1:
        raise ConfigurationError(
            f"{len(groups)} quantization config groups; supported: {SUPPORTED}"
        )
    (group,) = groups.values()
    weights, inputs = group.get("weights") or {}, group.get("input_activations")
    _check_args(weights, "weights", dynamic_allowed=False)
    if inputs is not None:
        _check_args(inputs, "input_activations", dynamic_allowed=True)
    if quantization.get("format") not in ("naive-quantized", "float-quantized"):
        raise ConfigurationError(
            f"compressed-tensors format {quantization.get('format')!r}; supported: {SUPPORTED}"
        )
    if quantization.get("kv_cache_scheme"):
        raise ConfigurationError(f"a quantized KV cache is not supported; supported: {SUPPORTED}")
    return inputs is not None and not inputs.get("dynamic", False)


def _fp8_method(quantization: dict[str, Any]) -> bool:
    """``quant_method: fp8``: whether its input scales are static; ConfigurationError for
    block-wise weights or an unknown activation scheme."""
    if quantization.get("weight_block_size") is not None:
        raise ConfigurationError(
            f"block-wise FP8 (weight_block_size {quantization['weight_block_size']}) is not "
            f"supported; supported: {SUPPORTED}"
        )
    scheme = quantization.get("activation_scheme", "dynamic")
    if scheme not in ("static", "dynamic"):
        raise ConfigurationError(f"activation_scheme {scheme!r}; supported: {SUPPORTED}")
    # A kv_cache_scheme (AngelSlim writes "static" with kv_cache_scales.safetensors when it
    # calibrated the cache too) is an option of the server's: the engine's cache stays in the
    # model's dtype, which needs no scales, and the scales are not read.
    return bool(scheme == "static")


def _check_args(args: dict[str, Any], name: str, *, dynamic_allowed: bool) -> None:
    wanted = {"num_bits": 8, "type": "float", "strategy": "tensor"}
    got = {key: args.get(key) for key in wanted}
    dynamic = args.get("dynamic", False)
    if got != wanted or (dynamic and not dynamic_allowed) or args.get("symmetric", True) is False:
        raise ConfigurationError(
            f"quantization {name} {got | {'dynamic': dynamic}}; supported: {SUPPORTED}"
        )


def ignored_modules(config: dict[str, Any]) -> list[str]:
    """The modules left unquantized, under either spelling of the key."""
    quantization = config.get("quantization_config") or {}
    return list(quantization.get("ignore") or quantization.get("ignored_layers") or [])


def read_scales(model_path: Path, config: dict[str, Any], static: bool) -> Fp8Scales:
    """Every projection's scales from the checkpoint's safetensors files. Raises
    ConfigurationError for a projection without its FP8 weight or scales."""
    weight: dict[str, Tensor] = {}
    inputs: dict[str, Tensor] = {}
    dtypes: dict[str, str] = {}  # safetensors' names: "F8_E4M3", "BF16", ...
    for path in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                module, _, leaf = key.rpartition(".")
                if not module.endswith(PROJECTIONS):
                    continue
                if leaf == "weight":
                    dtypes[module] = str(handle.get_slice(key).get_dtype())
                elif leaf == "weight_scale":
                    weight[module] = handle.get_tensor(key).float().reshape(1)
                elif leaf == "input_scale":
                    inputs[module] = handle.get_tensor(key).float().reshape(1)
    ignored = ignored_modules(config)
    expected = [m for m in dtypes if not any(m == i or m.startswith(f"{i}.") for i in ignored)]
    for module in expected:
        if dtypes[module] != "F8_E4M3" or module not in weight:
            raise ConfigurationError(
                f"{module} is not stored as an FP8 weight with its weight_scale "
                f"(found {dtypes[module]}); supported: {SUPPORTED}"
            )
        if static and module not in inputs:
            raise ConfigurationError(f"{module} has no input_scale, which its scheme needs")
    if not expected:
        raise ConfigurationError(f"no quantized projection found in {model_path}")
    method = str((config.get("quantization_config") or {}).get("quant_method"))
    return Fp8Scales(weight, inputs if static else {}, static, method)


def read_config(model_path: Path) -> dict[str, Any]:
    """config.json as a dict ({} when it cannot be read: the loader reports that)."""
    try:
        loaded = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}
