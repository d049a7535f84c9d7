"""Host time of index writes into CUDA tensors while the GPU is busy: which ones wait for the
whole queue. A program, not a test (GPU only); prints one line per form.

    python benchmarks/serving/mixed/index_writes.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def main() -> None:
    device = torch.device("cuda")
    presence = torch.zeros(129, 128256, dtype=torch.bool, device=device)  # the sampling mask
    generated = torch.zeros(129, dtype=torch.int64, device=device)
    index = torch.tensor([3, 5, 7], device=device)
    ones = torch.ones(3, dtype=torch.int64, device=device)
    big = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def timed(name: str, write: Callable[[], object]) -> None:
        torch.cuda.synchronize()
        for _ in range(40):  # about 60 ms of products queued
            big @ big
        started = time.perf_counter()
        write()
        host = time.perf_counter() - started
        torch.cuda.synchronize()
        print(f"{name}: host {host * 1e3:.2f} ms while the GPU is busy")

    timed("presence[index] = False", lambda: presence.__setitem__(index, False))
    timed("presence.index_fill_(0, index, False)", lambda: presence.index_fill_(0, index, False))
    timed("generated[index] = 1", lambda: generated.__setitem__(index, 1))
    timed("generated.index_fill_(0, index, 1)", lambda: generated.index_fill_(0, index, 1))
    timed("generated[index] = device tensor", lambda: generated.__setitem__(index, ones))


if __name__ == "__main__":
    main()
