"""Which runner a model gets: the fast engine's :class:`~hymt_serve.engine.runners.fast.FastRunner`
(static KV cache sized to the free device memory, inductor-compiled step functions, CUDA graphs
for decode and prefill) over the model's registered architecture (:mod:`hymt_serve.engine.models`).

The runner reuses the HF model's weight tensors (q/k/v and gate/up are fused in place, see
:func:`hymt_serve.engine.models.weights.fuse_linears`), so the model costs its weights once.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.checkpoints.fp8 import Fp8Scales
from hymt_serve.engine.compile_cache import CompileCache
from hymt_serve.engine.kernels.attention import TRITON_KERNEL, kernel_name
from hymt_serve.engine.kernels.quantized import Int4Parts
from hymt_serve.engine.models import architecture_for
from hymt_serve.engine.models.base import UnsupportedModelError as UnsupportedModelError
from hymt_serve.engine.runners.fast import STEP_HEADROOM, FastRunner
from hymt_serve.engine.runners.prefill import MIXED_TOKENS, PREFIX_TOKENS

logger = logging.getLogger(__name__)

KV_CACHE_SHARE = 0.8  # of the device memory left after the weights


def build_fast_runner(
    model: nn.Module,
    *,
    max_batch_size: int,
    max_seq_len: int,
    use_cuda_graphs: bool | None = None,
    compile_model: bool | None = None,
    quantize: str = "none",
    fp8_scales: Fp8Scales | None = None,
    int4: Int4Parts | None = None,
    quantize_head: bool = False,
    prefix_entries: int = 0,
    mixed_tokens: int = MIXED_TOKENS,
    open_compile_cache: Callable[[], CompileCache | None] | None = None,
) -> FastRunner:
    """A runner over ``model``'s weights; on CUDA compile and capture the steps' graphs.

    ``max_batch_size`` is capped by the free device memory (:func:`cache_rows`).
    ``compile_model`` (None = same as graphs) runs inductor over the step before capture.
    ``quantize`` "fp8" makes the projections e4m3 (one scale each, inputs scaled at run
    time; with ``fp8_scales``, an FP8 checkpoint's, its weights as they are), "int8" int8
    weights with a scale per output row, "int4" 4-bit weights with a scale per 128 inputs
    (both weight-only); ``int4`` (a GPTQ checkpoint's projections) replaces the model's
    dequantized ones. ``quantize_head`` quantizes the LM head like the projections (fp8 or
    int8 only). ``prefix_entries`` prompt prefixes are kept for reuse (0: none; see
    :mod:`hymt_serve.engine.runners.prefixes`); their memory comes out of the KV cache's share.
    ``mixed_tokens`` prompt tokens may ride in each decode step (chunks of the prompts that
    join; 0: rows join between steps, their prefill stalling the batch).
    ``open_compile_cache`` gives the compile cache to build with (None: off), opened only when
    something compiles (:mod:`hymt_serve.engine.compile_cache`).
    Raises :class:`UnsupportedModelError` if the model cannot run here (or no row fits).
    """
    start = time.perf_counter()
    architecture = architecture_for(model)
    shape = architecture.check(model)
    if max_batch_size < 1 or max_seq_len < 2:
        raise ValueError(
            f"need max_batch_size >= 1 and max_seq_len >= 2, got {max_batch_size} and {max_seq_len}"
        )
    param = next(model.parameters())
    rows = cache_rows(
        model, max_seq_len, max_batch_size, param.device, reserved=prefix_entries * PREFIX_TOKENS
    )
    if rows < 1:
        raise UnsupportedModelError("not enough free device memory for a KV cache of one row")
    capturable = kernel_name(param.device, param.dtype) == TRITON_KERNEL
    graphs = capturable if use_cuda_graphs is None else use_cuda_graphs
    if graphs and not capturable:
        raise UnsupportedModelError("CUDA graphs need a bf16/fp16 model on CUDA with Triton")
    cache, cache_report = _compile_cache(open_compile_cache if graphs else None, graphs)
    if capturable:  # (after the cache is in place: Triton's C launchers are kept there too)
        check_kernel_builds()
    config: Any = model.config
    with torch.inference_mode():
        weights = architecture.extract_weights(
            model, quantize=quantize, scales=fp8_scales, int4=int4, quantize_head=quantize_head
        )
        if param.device.type == "cuda":  # the copies that fusing replaced go back to the device
            torch.cuda.empty_cache()
        runner = FastRunner(
            architecture,
            weights,
            shape,
            max_batch_size=rows,
            max_seq_len=max_seq_len,
            max_positions=int(getattr(config, "max_position_embeddings", 0)),
            prefix_entries=prefix_entries,
            mixed_tokens=mixed_tokens,
        )
        if graphs:
            runner.capture(compile_=graphs if compile_model is None else compile_model)
    runner.compile_cache = cache.finish() if cache is not None else cache_report
    runner.timings["ready_s"] = time.perf_counter() - start
    logger.info("fast engine ready: %s", runner.describe())
    return runner


def _compile_cache(
    opener: Callable[[], CompileCache | None] | None, graphs: bool
) -> tuple[CompileCache | None, dict[str, Any]]:
    """The compile cache, in place for inductor and Triton, or None and why none is used. A
    cache that cannot be opened (a read-only or full disk) costs its reuse, never the start."""
    if not graphs:
        return None, {"dir": None, "reused": False, "why_not": "nothing compiles (no graphs)"}
    off = {"dir": None, "reused": False, "why_not": "compile_cache_dir is off"}
    if opener is None:
        return None, off
    try:
        cache = opener()
    except OSError as error:
        logger.warning("fast engine: compile cache not used: %s", error)
        return None, {"dir": None, "reused": False, "why_not": f"cannot open: {error}"}
    if cache is None:
        return None, off
    cache.apply()
    logger.info("fast engine: compile cache %s", cache.describe())
    return cache, {}


NO_COMPILER = (
    "the fast engine cannot start: Triton builds a C module for each kernel it compiles and "
    "found no C compiler (CC is unset and neither gcc nor clang is on PATH). Install gcc and "
    "the C library's headers (Debian: apt-get install gcc libc6-dev; docker/Dockerfile does), "
    "or set engine: hf to serve without the fast engine (several times slower)"
)
BUILD_FAILED = (
    "the fast engine cannot start: Triton's C module did not build with {compiler!r} (see the "
    "compiler's output above). It needs the C library's headers (Debian: libc6-dev) and "
    "Python's (python3-dev, in the python images already); or set engine: hf"
)


def check_kernel_builds(build: Callable[[], object] | None = None) -> None:
    """Raise :class:`ConfigurationError` saying what to install where Triton cannot build the
    C modules its kernels launch through.

    Triton compiles one with the system's C compiler and Python's headers for its CUDA driver
    and one for each kernel (or loads them from its cache, ~/.triton/cache); without a
    compiler the fast engine would fail deep in its first compile with Triton's own message.
    ``build`` replaces loading Triton's CUDA driver (which builds the first module).
    """
    try:
        (build or _load_triton_driver)()
    except RuntimeError as error:
        if "C compiler" not in str(error):
            raise
        raise ConfigurationError(NO_COMPILER) from error
    except subprocess.CalledProcessError as error:
        command = error.cmd if isinstance(error.cmd, list | tuple) else [error.cmd]
        raise ConfigurationError(BUILD_FAILED.format(compiler=str(command[0]))) from error


def _load_triton_driver() -> None:
    from triton.runtime.driver import driver  # Triton: optional (the CPU image has none)

    driver.active.utils  # noqa: B018  (built, or loaded from the cache, when first reached)


def cache_rows(
    model: nn.Module, max_seq_len: int, wanted: int, device: torch.device, reserved: int = 0
) -> int:
    """Rows of ``max_seq_len`` tokens (plus the runner's headroom) whose KV cache fits the free
    device memory next to ``reserved`` more tokens' (kept prefixes), at most ``wanted``."""
    if device.type != "cuda":
        return wanted
    config: Any = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = (
        config.num_hidden_layers
        * config.num_key_value_heads
        * head_dim
        * 2
        * next(model.parameters()).element_size()
    )
    free, _ = torch.cuda.mem_get_info(device)
    budget = int(free * KV_CACHE_SHARE) - reserved * int(per_token)
    return min(wanted, budget // int(per_token * (max_seq_len + STEP_HEADROOM)))
