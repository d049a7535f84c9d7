"""A test-only TorchServe handler: ours, plus injected faults.

Two keys of the ``handler:`` section that production does not know turn them on (0 = off):
``test_oom_max_new_tokens``: a prefill holding a row that asks exactly this many tokens runs
out of device memory; ``test_hang_max_new_tokens``: one holding such a row never finishes (a
wedged worker). The integration tests build their archives with this file as the handler; the
engine process gets the check through :attr:`Settings.before_prefill` (it pickles by name).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationRow

logger = logging.getLogger(__name__)
OOM_KEY, HANG_KEY = "test_oom_max_new_tokens", "test_hang_max_new_tokens"
HANG_SECONDS = 3600.0  # far past any response timeout


def inject(oom: int, hang: int, rows: Sequence[GenerationRow]) -> None:
    """Raise a device out-of-memory error, or hang, when a row asks ``oom`` or ``hang``
    tokens."""
    import torch

    asked = {row.max_new_tokens for row in rows}
    if oom and oom in asked:
        raise torch.OutOfMemoryError(f"injected by {OOM_KEY}={oom}")
    if hang and hang in asked:
        logger.warning("hanging: %s is set (tests only)", HANG_KEY)
        time.sleep(HANG_SECONDS)


def with_faults(settings: Settings, oom: int = 0, hang: int = 0) -> Settings:
    """``settings`` whose engine runs :func:`inject` before each prefill."""
    return replace(settings, before_prefill=partial(inject, oom, hang))


class FaultyHandler(HunyuanMTHandler):
    """The production handler, with the faults its ``handler:`` section asks for."""

    def settings_for(self, context: Any) -> Settings:
        section = dict(context.model_yaml_config.get("handler") or {})
        oom, hang = section.pop(OOM_KEY, 0), section.pop(HANG_KEY, 0)
        context.model_yaml_config = {**context.model_yaml_config, "handler": section}
        return with_faults(super().settings_for(context), oom, hang)
