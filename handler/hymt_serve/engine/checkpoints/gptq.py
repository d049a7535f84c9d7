"""Tencent's GPTQ-Int4 checkpoints (HY-MT1.5-1.8B/7B-GPTQ-Int4, made with AngelSlim):
recognising them and dequantizing their projections, without a GPTQ package.

The format (AutoGPTQ's "gptq" checkpoint format, as AngelSlim's ``GPTQ.save`` writes it;
``quantization_config``: ``quant_method: gptq``, ``bits: 4``, ``group_size: 128``, ``sym: true``,
``desc_act: true``, ``static_groups: true``, ``checkpoint_format: gptq``): each projection keeps
``qweight`` (int32 ``[in / 8, out]``: eight 4-bit values along the input, lowest bits first),
``qzeros`` (int32 ``[groups, out / 8]``, packed the same way along the output, each stored as
its zero point minus one: the format's historical offset), ``scales`` (fp16 ``[groups, out]``)
and ``g_idx`` (int32 ``[in]``: the group of each input column; with static groups it is
``column // group_size`` even under ``desc_act``). ``weight[o, i] = scales[g_idx[i], o] *
(q[i, o] - (qzeros[g_idx[i], o] + 1))``. ``lm_head`` stays unquantized.

Loading dequantizes each projection into the model (what transformers' forward serves when
the fast engine is not used) and keeps it in the weight-only kernel's int4 form
(:mod:`hymt_serve.engine.kernels.weight_only`: the packed ``qweight`` as it is, fp16 scales and zero
points ``[2, groups, out]``), which the fast engine takes instead, releasing the dequantized
copy: its products read the packed words and widen them in registers on tensor cores at every
batch (:mod:`hymt_serve.engine.kernels.int4_gemm`). A projection whose ``g_idx`` is not
``column // group_size`` (act-order without static groups) keeps the dequantized path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.kernels.weight_only import unpack_int4

SUPPORTED = "GPTQ 4-bit, symmetric, group_size 128 or -1, checkpoint_format gptq (v1)"
PARTS = ("qweight", "qzeros", "scales", "g_idx")


def gptq_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The GPTQ settings of a config (None when it is not GPTQ); ConfigurationError for a GPTQ
    variant this loader cannot read."""
    quantization = config.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "gptq":
        return None
    got = {key: quantization.get(key) for key in ("bits", "sym", "checkpoint_format")}
    if got["bits"] != 4 or got["sym"] is False or got["checkpoint_format"] not in (None, "gptq"):
        raise ConfigurationError(f"GPTQ checkpoint with {got}; supported: {SUPPORTED}")
    return quantization


def unpack_columns(packed: Tensor) -> Tensor:
    """:func:`unpack_int4`'s packing along the columns: ``[rows, cols]`` -> ``[rows, cols * 8]``."""
    return unpack_int4(packed.T.contiguous()).T


def dequantize(qweight: Tensor, qzeros: Tensor, scales: Tensor, g_idx: Tensor) -> Tensor:
    """One projection's float32 weight ``[out, in]``."""
    q = unpack_int4(qweight)  # [in, out]
    zeros = unpack_columns(qzeros) + 1  # [groups, out]; stored minus one
    groups = g_idx.long()
    weight = scales.float()[groups] * (q - zeros[groups]).float()  # [in, out]
    return weight.T.contiguous()


def kernel_form(
    qweight: Tensor, qzeros: Tensor, scales: Tensor, g_idx: Tensor
) -> tuple[Tensor, Tensor] | None:
    """The projection as the weight-only kernel takes it (None when its groups are not
    consecutive runs of columns)."""
    groups = scales.shape[0]
    inputs = qweight.shape[0] * 8
    if inputs % groups:
        return None
    consecutive = torch.arange(inputs, device=g_idx.device) // (inputs // groups)
    if not torch.equal(g_idx.long(), consecutive):
        return None
    zeros = (unpack_columns(qzeros) + 1).to(torch.float16)  # stored minus one
    return qweight.contiguous(), torch.stack([scales.to(torch.float16), zeros])


def load_gptq_weights(
    model: nn.Module, model_path: Path
) -> tuple[int, dict[str, tuple[Tensor, Tensor]]]:
    """Dequantize every GPTQ projection of ``model_path`` into ``model``'s modules of the same
    name (their weights were left uninitialised by the load). Returns how many, and each one's
    int4 kernel form by module name (see :func:`kernel_form`). Raises ConfigurationError when
    a projection's parts are missing or do not fit its module."""
    parts: dict[str, dict[str, Tensor]] = {}
    for path in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                module, _, leaf = key.rpartition(".")
                if leaf in PARTS:
                    parts.setdefault(module, {})[leaf] = handle.get_tensor(key)
    modules = dict(model.named_modules())
    packed: dict[str, tuple[Tensor, Tensor]] = {}
    for name, found in parts.items():
        missing = [part for part in PARTS if part not in found]
        linear = modules.get(name)
        if missing or not isinstance(linear, nn.Linear):
            raise ConfigurationError(
                f"{name}: GPTQ parts {sorted(found)} (missing {missing}) for "
                f"{type(linear).__name__}; supported: {SUPPORTED}"
            )
        weight = dequantize(found["qweight"], found["qzeros"], found["scales"], found["g_idx"])
        if weight.shape != linear.weight.shape:
            raise ConfigurationError(
                f"{name}: GPTQ weight {tuple(weight.shape)} for a layer of "
                f"{tuple(linear.weight.shape)}"
            )
        with torch.no_grad():
            linear.weight.copy_(weight.to(linear.weight.dtype))
        form = kernel_form(found["qweight"], found["qzeros"], found["scales"], found["g_idx"])
        if form is not None:
            packed[name] = form
    if not parts:
        raise ConfigurationError(f"no GPTQ projection found in {model_path}")
    return len(parts), packed
