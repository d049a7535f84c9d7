"""Hy-MT2-30B-A3B's FP8 checkpoint (``hy_v3``) read with its experts kept in e4m3.

The checkpoint (AngelSlim's export, :mod:`.fp8`'s format) stores each expert apart, under the
names the bf16 release uses: ``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``
(``float8_e4m3fn``) with its ``weight_scale`` (fp32, one value) and ``input_scale`` (static
scheme); the shared expert under ``mlp.shared_mlp.``, the router under
``mlp.router.gate.weight`` and its bias under ``mlp.expert_bias`` (transformers renames those
three, :data:`RENAMES`), attention and the dense first layer's MLP as the dense family's.
Router, bias, norms, embeddings and the LM head are not quantized.

transformers would read every expert into the model's dtype and fuse them (60 GB for this
model in bf16). Here the model is built without weights, every other tensor is read into it
(FP8 projections into the model's dtype, exactly: every e4m3 value is a bf16 value, as the
dense family's loader does), and the experts go straight from the files into e4m3 stacks on
the device, ``[E, 2 x width, hidden]`` (gate rows, then up) and ``[E, hidden, width]``, the
shared expert stacked last when it has the experts' width, each expert's tensor-wise scales
spread over its rows (:func:`~hymt_serve.engine.kernels.experts_fp8.tensor_scales_to_rows`).
The model's own expert tensors are left empty: it serves the fast engine only. The experts'
static input scales are not read: their products are weight-only at small batches and scale
each token by its own maximum at large ones (:mod:`hymt_serve.engine.kernels.experts_fp8`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.checkpoints.fp8 import SUPPORTED, Fp8Scales, fp8_scheme, ignored_modules
from hymt_serve.engine.kernels.experts_fp8 import FP8, tensor_scales_to_rows

# The published names transformers maps to its modules' (its conversion_mapping for hy_v3).
RENAMES = (
    (".mlp.router.gate.", ".mlp.gate."),
    (".mlp.expert_bias", ".mlp.e_score_correction_bias"),
    (".mlp.shared_mlp.", ".mlp.shared_experts."),
)
EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.(\w+)$")
SHARED = re.compile(r"^(model\.layers\.\d+\.mlp)\.shared_experts\.(gate|up|down)_proj\.(\w+)$")
PARTS = {"gate": 0, "up": 1, "down": 2}
KV_CACHE_SCALE = re.compile(r"\.(k|v)_(cache\.)?scale$")  # an FP8 cache's option: unused


class ExpertStacks:
    """One mixture's e4m3 stacks being filled from the files, with each expert's three
    tensor-wise scales (NaN until read)."""

    def __init__(self, experts: int, hidden: int, width: int, device: torch.device) -> None:
        self.gate_up = torch.empty(experts, 2 * width, hidden, dtype=FP8, device=device)
        self.down = torch.empty(experts, hidden, width, dtype=FP8, device=device)
        self.scales = torch.full((experts, 3), float("nan"))
        self.filled = torch.zeros(experts, 3, dtype=torch.bool)
        self.width = width

    def put(self, expert: int, part: str, leaf: str, tensor: Tensor, name: str) -> None:
        index = PARTS[part]
        if leaf == "weight_scale":
            if tensor.numel() != 1:
                raise ConfigurationError(f"{name} has {tensor.numel()} values; {SUPPORTED}")
            self.scales[expert, index] = tensor.float().reshape(())
        elif leaf == "weight":
            if tensor.dtype != FP8:
                raise ConfigurationError(f"{name} is {tensor.dtype}, not e4m3; {SUPPORTED}")
            target = self.down[expert] if part == "down" else self.gate_up[expert]
            rows = (
                slice(None)
                if part == "down"
                else slice(index * self.width, (index + 1) * self.width)
            )
            target[rows].copy_(tensor)
            self.filled[expert, index] = True
        elif leaf != "input_scale":
            raise ConfigurationError(f"unknown expert tensor {name}")

    def finish(self, prefix: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if not bool(self.filled.all()) or bool(self.scales.isnan().any()):
            raise ConfigurationError(
                f"{prefix}: an expert's e4m3 weight or weight_scale is missing"
            )
        device = self.gate_up.device
        gate_up_scale = tensor_scales_to_rows(self.scales[:, :2], self.width).to(device)
        down_scale = tensor_scales_to_rows(self.scales[:, 2:], self.down.shape[1]).to(device)
        return self.gate_up, gate_up_scale, self.down, down_scale


def load_hy_v3_fp8(
    model_path: Path, config: Any, raw: dict[str, Any], device: torch.device, dtype: torch.dtype
) -> tuple[Any, Fp8Scales]:
    """The ``hy_v3`` model of ``model_path`` (``config``: its config without
    ``quantization_config``; ``raw``: config.json as read) on ``device``, and the
    checkpoint's scales with the expert stacks. Raises ConfigurationError for a tensor this
    format does not have, or one missing."""
    static = bool(fp8_scheme(raw))
    # accelerate's empty-weights context keeps buffers real (RoPE's frequencies are computed)
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    stacked_shared = (config.num_shared_experts or 0) == 1
    stacks = {
        f"model.layers.{i}.mlp": ExpertStacks(
            config.num_experts + stacked_shared,
            config.hidden_size,
            config.moe_intermediate_size,
            device,
        )
        for i, layer in enumerate(model.model.layers)
        if hasattr(layer.mlp, "experts")
    }
    weight: dict[str, Tensor] = {}
    inputs: dict[str, Tensor] = {}
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    for path in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                name = rename(key)
                if KV_CACHE_SCALE.search(name):
                    continue
                tensor = handle.get_tensor(key)
                if place_expert(name, tensor, stacks, config.num_experts, stacked_shared):
                    continue
                module, _, leaf = name.rpartition(".")
                if leaf in ("weight_scale", "input_scale"):
                    (weight if leaf == "weight_scale" else inputs)[module] = scale_of(tensor, name)
                elif name in targets:
                    assign(model, name, tensor.to(device=device, dtype=dtype))
                else:
                    raise ConfigurationError(f"unexpected tensor {key} in {path.name}")
    experts = {prefix: stack.finish(prefix) for prefix, stack in stacks.items()}
    release_experts(model, device, dtype, stacked_shared)
    check_complete(model, weight, inputs if static else None, ignored_modules(raw))
    model.to(device)  # the buffers (made on the host)
    method = str(raw["quantization_config"].get("quant_method"))
    return model, Fp8Scales(weight, inputs if static else {}, static, method, experts)


def rename(key: str) -> str:
    for old, new in RENAMES:
        key = key.replace(old, new)
    return key


def place_expert(
    name: str, tensor: Tensor, stacks: dict[str, ExpertStacks], experts: int, shared: bool
) -> bool:
    """Put a routed expert's tensor (or the stacked shared expert's) in its stack; False for
    any other tensor."""
    found = EXPERT.match(name)
    if found:
        prefix, index, part, leaf = found.groups()
        stacks[prefix].put(int(index), part, leaf, tensor, name)
        return True
    found = SHARED.match(name) if shared else None
    if found:
        prefix, part, leaf = found.groups()
        stacks[prefix].put(experts, part, leaf, tensor, name)
        return True
    return False


def scale_of(tensor: Tensor, name: str) -> Tensor:
    if tensor.numel() != 1:
        raise ConfigurationError(f"{name} has {tensor.numel()} values, not one; {SUPPORTED}")
    return tensor.float().reshape(1)


def assign(model: nn.Module, name: str, value: Tensor) -> None:
    """Set parameter or buffer ``name`` of ``model`` to ``value``."""
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[leaf] = value


def release_experts(model: Any, device: torch.device, dtype: torch.dtype, shared: bool) -> None:
    """The model's own expert tensors (and the shared expert's, when stacked) as empty ones."""
    for layer in model.model.layers:
        mlp = layer.mlp
        if not hasattr(mlp, "experts"):
            continue
        linears = [mlp.shared_experts.gate_proj, mlp.shared_experts.up_proj] if shared else []
        linears += [mlp.shared_experts.down_proj] if shared else []
        for module, leaf in [(mlp.experts, "gate_up_proj"), (mlp.experts, "down_proj")] + [
            (linear, "weight") for linear in linears
        ]:
            empty = torch.empty(0, device=device, dtype=dtype)
            module._parameters[leaf] = nn.Parameter(empty, requires_grad=False)


def check_complete(
    model: nn.Module,
    weight: dict[str, Tensor],
    inputs: dict[str, Tensor] | None,
    ignored: list[str],
) -> None:
    """Every parameter read, and every projection's scales with it (static inputs too)."""
    missing = [name for name, param in model.named_parameters() if param.is_meta]
    if missing:
        raise ConfigurationError(f"the checkpoint lacks {missing[:3]} ({len(missing)} in all)")
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module.weight.numel() == 0:
            continue
        if any(name == i or name.startswith(f"{i}.") for i in ignored) or name.endswith("gate"):
            continue
        if name not in weight or (inputs is not None and name not in inputs):
            raise ConfigurationError(f"{name} has no weight_scale/input_scale; {SUPPORTED}")
