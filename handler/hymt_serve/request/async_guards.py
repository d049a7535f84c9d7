"""Two per-request costs of TorchServe 0.12.0's async mode that the worker pays for nothing,
and what the handler does about them (installed by ``initialize`` in async mode).

- **The context is deep-copied for every request.** ``ts/async_service.py`` runs
  ``copy.deepcopy(self.context)`` before each call. That copies the manifest, the model config,
  and the metric cache with every metric object in it, a sizeable share of a short request's
  time in the worker. What a request changes on its copy is per request by construction:
  TorchServe sets ``request_ids``, ``request_processor`` and ``cl_socket`` on it, and
  ``request_ids`` on its metric cache. Everything else is read-only once the model is
  loaded; a metric object prints one line per update and keeps no per-request state. So
  :func:`cheap_context_copies` makes the copy shallow, giving only the metric cache a wrapper
  of its own. Every request still sees its own ids, headers and statuses.
- **A debug line is printed for every request.** ``print(f"{self._entry_point=}")`` is written
  to the worker's stdout, and the front end reads and logs it as a model log line.
  :func:`drop_entry_point_prints` filters that one line out of ``sys.stdout``. TorchServe's
  logging handler keeps its own reference to the stream, so metric and log lines are
  untouched.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, TextIO

ENTRY_POINT_PRINT = "self._entry_point="


def cheap_context_copies(context: Any) -> None:
    """Make ``copy.deepcopy(context)`` a shallow copy with a metric cache wrapper of its own.

    It changes ``context``'s class to a subclass with that ``__deepcopy__``; once per context.
    """
    base = type(context)
    if "__deepcopy__" in vars(base):
        return
    context.__class__ = type(base.__name__, (base,), {"__deepcopy__": _shallow_copy})


def _shallow_copy(self: Any, memo: dict[int, Any]) -> Any:
    clone = copy.copy(self)
    metrics = getattr(self, "metrics", None)
    if metrics is not None:  # TorchServe sets request_ids on the copy's metric cache
        clone.metrics = copy.copy(metrics)
    return clone


class _WithoutEntryPointPrints:
    """A text stream that forwards everything but TorchServe's entry-point print."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._drop_newline = False

    def write(self, text: str) -> int:
        if text.startswith(ENTRY_POINT_PRINT):
            self._drop_newline = True  # print() writes its end ("\n") separately
            return len(text)
        if self._drop_newline:
            self._drop_newline = False
            if text == "\n":
                return 1
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def drop_entry_point_prints() -> None:
    """Filter TorchServe's per-request ``self._entry_point=...`` line out of ``sys.stdout``."""
    if not isinstance(sys.stdout, _WithoutEntryPointPrints):
        sys.stdout = _WithoutEntryPointPrints(sys.stdout)
