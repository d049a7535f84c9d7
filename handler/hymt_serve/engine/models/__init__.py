"""Model architectures the fast runner can run: one module per architecture behind
:class:`~hymt_serve.engine.models.base.Architecture`, registered here by ``model_type``."""

from __future__ import annotations

from typing import Any

from torch import nn

from hymt_serve.engine.models import hunyuan_v1_dense, hy_v3
from hymt_serve.engine.models.base import Architecture, UnsupportedModelError

ARCHITECTURES: dict[str, Architecture] = {
    hunyuan_v1_dense.ARCHITECTURE.model_type: hunyuan_v1_dense.ARCHITECTURE,
    hy_v3.ARCHITECTURE.model_type: hy_v3.ARCHITECTURE,
}


def architecture_for(model: nn.Module) -> Architecture:
    """The registered architecture of ``model.config.model_type``; UnsupportedModelError if none."""
    config: Any = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(f"model_type must be {known}, got {model_type!r}")
    return ARCHITECTURES[model_type]
