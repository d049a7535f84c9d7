"""Programmatic dependent launch (PDL): on Hopper and later a kernel may start while the one
before it in the stream still runs, and waits (``griddepcontrol.wait``) only where it reads what
that kernel wrote. A decode step at one row is hundreds of short kernels in a CUDA graph; PDL
overlaps each one's launch and start (and the weight kernels' first weight loads) with the tail
of the kernel before.

Where it runs: the engine's own Triton kernels (weight-only projections, decode attention) take
a ``PDL`` constant that places the wait before their first read of the previous kernel's output
and signals their dependents at once; inductor's kernels get the same from its own option
(``triton.enable_pdl``), set while the engine compiles and captures its steps.

``HYMT_PDL=0`` turns it off (for triage: the kernels then launch as before).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch

ENV = "HYMT_PDL"


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: CUDA of compute capability 9.0 or later,
    unless ``HYMT_PDL=0``."""
    if device.type != "cuda" or os.environ.get(ENV, "1") == "0":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


@contextlib.contextmanager
def compiling(device: torch.device) -> Iterator[None]:
    """Inductor's kernels compiled inside this block launch with PDL where :func:`enabled`."""
    from torch._inductor import config

    if not enabled(device) or not hasattr(config.triton, "enable_pdl"):
        yield
        return
    with config.patch({"triton.enable_pdl": True}):
        yield
