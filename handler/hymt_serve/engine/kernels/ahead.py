"""Our weight-only Triton kernels compiled ahead, in threads, while the engine's steps compile.

An int4 or int8 engine compiles the weight-only kernels once per tile config, row class and
dtype (an int4 + int8-head engine: 12 of them, bf16 2); one after the other, inside the
warm-up's first launches, they add much of a quantized engine's ready time. Here the launches
the steps will make are found first, by running the products once on empty inputs of each row
class with every launch recorded instead of run (:func:`compile_ahead`'s ``plan``). The
recorded kernels then compile in a pool of threads while the main thread traces the steps and
inductor compiles them; our first real launch waits for the pool. Triton compiles outside the
GIL for much of the time, so the threads overlap even on few cores.

A recorded kernel that does not compile ahead (a failure, or a key Triton specialises
differently than :func:`spec_key` guesses) compiles at its first launch: compiling ahead
changes when kernels compile, never what runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

THREADS = 8  # compile threads at most (one core stays for the main thread)

Launch = tuple[Any, Any, tuple[Any, ...], dict[str, Any]]  # kernel, grid, arguments, keywords
_recording: list[Launch] | None = None
_pending: list[Future[Any]] = []
waited_s = 0.0  # how long launches waited for the threads, since compiling ahead last began


def run(kernel: Any, grid: Any, *args: Any, **kwargs: Any) -> None:
    """Launch ``kernel[grid](*args, **kwargs)``: the only way our weight-only kernels launch.
    While a plan records, only noted; while kernels compile ahead, after waiting for them."""
    if _recording is not None:
        _recording.append((kernel, grid, args, kwargs))
        return
    if _pending:
        wait_ahead()
    kernel[grid](*args, **kwargs)


def wait_ahead() -> None:
    """Wait for the kernels compiling ahead (a failed one compiles again at its launch)."""
    global waited_s
    futures = list(_pending)
    _pending.clear()
    start = time.perf_counter()
    wait(futures)
    waited_s += time.perf_counter() - start
    for future in futures:
        if future.exception() is not None:
            logger.warning(
                "fast engine: a kernel did not compile ahead (it compiles at its launch)",
                exc_info=future.exception(),
            )


def spec_key(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What Triton compiles a launch of ``kernel`` for: its tensors' dtypes and 16-byte
    alignment, its specialised integers' classes (1, a multiple of 16, 64-bit), the
    constexprs and launch options. Launches of one key share a compile."""
    params = getattr(kernel, "params", ())
    spec: list[Any] = []
    for i, arg in enumerate(args):
        fixed = i < len(params) and getattr(params[i], "do_not_specialize", False)
        if isinstance(arg, Tensor):
            spec.append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif isinstance(arg, int) and not isinstance(arg, bool) and not fixed:
            spec.append((arg == 1, arg % 16 == 0, arg >= 2**31))
        else:
            spec.append(None if fixed else arg)
    return (id(kernel), tuple(spec), tuple(sorted(kwargs.items())))


def record(plan: Callable[[], None]) -> list[Launch]:
    """The launches ``plan`` makes, one per :func:`spec_key`, none of them run."""
    global _recording
    if _recording is not None:
        raise RuntimeError("a plan is already recording")
    _recording = []
    try:
        plan()
        launches = _recording
    finally:
        _recording = None
    unique: dict[tuple[Any, ...], Launch] = {}
    for kernel, grid, args, kwargs in launches:
        # An aligned tensor compiles as its dtype does (Triton's warmup takes a dtype for a
        # tensor), so the plan's buffers need not live on.
        light = tuple(_light(arg) for arg in args)
        unique.setdefault(spec_key(kernel, args, kwargs), (kernel, grid, light, kwargs))
    return list(unique.values())


def _light(arg: Any) -> Any:
    if isinstance(arg, Tensor) and arg.data_ptr() % 16 == 0:
        return arg.dtype
    return arg


@contextmanager
def compile_ahead(
    plan: Callable[[], None], device: torch.device, threads: int | None = None
) -> Iterator[int]:
    """Inside the block, the kernels ``plan`` launches compile in up to ``threads`` threads
    (default :data:`THREADS`); the block's first :func:`run` waits for them, and so does its
    end (:data:`waited_s` adds up the waits). Yields how many compile. Does nothing off CUDA
    or with ``threads`` 0."""
    global waited_s
    waited_s = 0.0
    threads = THREADS if threads is None else threads
    if device.type != "cuda" or threads < 1:
        yield 0
        return
    try:
        launches = record(plan)
    except Exception:  # compiling ahead saves time; without it the kernels compile as used
        logger.exception("fast engine: no kernel compiles ahead (the plan failed)")
        launches = []
    if not launches:
        yield 0
        return
    workers = max(1, min(threads, len(launches), (os.cpu_count() or 2) - 1))
    index = torch.cuda.current_device() if device.index is None else device.index
    pool = ThreadPoolExecutor(  # (set_device takes no index-less "cuda": the index it means)
        workers, thread_name_prefix="compile-ahead", initializer=torch.cuda.set_device,
        initargs=(index,),
    )  # fmt: skip
    for kernel, *_ in launches:
        caches = getattr(kernel, "device_caches", None)  # Triton's, per device: made here,
        if caches is not None:  # not by two threads at once (one's compiles would be lost)
            _ = caches[index]
    for kernel, grid, args, kwargs in launches:
        _pending.append(pool.submit(kernel.warmup, *args, grid=grid, **kwargs))
    try:
        yield len(launches)
    finally:
        wait_ahead()
        pool.shutdown()
