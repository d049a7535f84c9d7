"""One frozen settings object, loaded from model-config.yaml's ``handler:`` section.

Unknown keys are rejected; values are normalised first (strings stripped and lower-cased where
they name a choice), then verified; every message names the key, the bound and the value.
``HYMT_MODEL_PATH`` in the environment, when set, overrides ``model_path``. A relative model
path is read against the model archive's folder.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.types import SamplingParams

MODEL_PATH_ENV = "HYMT_MODEL_PATH"

CHOICES: dict[str, tuple[str, ...]] = {
    "device": ("auto", "cpu", "cuda"),
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "attention": ("auto", "flash_attention_2", "sdpa", "eager"),
    "quantization": ("none", "fp8", "int8", "int4", "bnb-int8", "nf4"),
    "engine": ("auto", "hf", "fast"),
    "prompt_family": ("auto", "hunyuan-mt-7b", "hunyuan-mt-chimera", "hy-mt1.5", "hy-mt2"),
    "blas_library": ("cublas", "cublaslt"),
    "one_row_kernel": ("auto", "triton", "cublas"),
}

# key: (lowest, highest) allowed, both inclusive.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "max_input_tokens": (16, 32_768),
    "max_new_tokens": (1, 32_768),
    "max_texts_per_request": (1, 1_024),
    "max_chars_per_text": (1, 1_000_000),
    "max_batch_rows": (1, 4_096),
    "prefix_cache_entries": (0, 1_024),
    "mixed_step_tokens": (0, 4_096),
    "max_waiting_rows": (1, 1_000_000),
    "max_glossary_terms": (0, 10_000),
    "max_term_chars": (1, 10_000),
    "max_context_chars": (0, 1_000_000),
    "max_instruction_chars": (1, 100_000),
    "max_document_bytes": (1, 16_777_216),
    "max_document_segments": (1, 1_000_000),
    "document_segment_tokens": (16, 32_768),
    "document_window_rows": (1, 1_000_000),
    "top_k": (1, 1_000),
    "test_oom_max_new_tokens": (0, 32_768),
    "test_hang_max_new_tokens": (0, 32_768),
    "cpu_threads": (0, 1_024),
}

# key: (lowest, highest, lowest excluded?)
FLOAT_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 10.0, True),
    "top_p": (0.0, 1.0, True),
    "repetition_penalty": (0.0, 10.0, True),
    "document_length_factor": (0.0, 100.0, True),
}
SAMPLING_FLOATS = ("temperature", "top_p", "repetition_penalty")
FLAGS = ("quantize_lm_head", "share_engine")
# The quantizations beside which the LM head can be quantized too (quantize_lm_head: fp8, or
# int8 beside int8 and int4); FP8 and GPTQ-Int4 checkpoints load with quantization "none".
HEAD_QUANTIZATIONS = ("fp8", "int8", "int4")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Validated handler settings. Build with :meth:`from_mapping`; never mutated."""

    model_path: Path
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "auto"
    quantization: str = "none"
    # The LM head (and the embedding table tied to it) quantized like the projections: with
    # fp8 (at load or an FP8 checkpoint) or int8 only. Off by default: the published
    # checkpoints keep it in bf16.
    quantize_lm_head: bool = False
    engine: str = "auto"
    # CUDA only: the library PyTorch's dense products go to (torch.backends.cuda's
    # preferred_blas_library), for the whole engine process. cublaslt: a 64-row decode step
    # took 0.96 x the time on an H200 (benchmarks/decode/blas/), but through TorchServe it
    # served 0.98 x the requests/s at 256 users (benchmarks/serving/guard-h200/).
    blas_library: str = "cublas"
    # CUDA only: where one row of a bf16/fp16 product goes (a batch-1 decode step), for the
    # whole engine process. triton: the tiled weight-only kernel with a plain weight, 0.78-0.96
    # x cuBLAS's time per projection on an H200 (benchmarks/decode/bf16-row/); auto: triton on
    # Hopper, where that was measured, cuBLAS on other GPUs.
    one_row_kernel: str = "auto"
    # CPU only: the threads of one engine's operations (torch.set_num_threads). 0: the cores
    # this process may use divided among the model's engines (the larger of minWorkers and
    # maxWorkers, or one with share_engine), unless OMP_NUM_THREADS is set; workers that each
    # take every core slow each other down several times over (threads spinning for a core
    # another worker holds).
    cpu_threads: int = 0
    # Which model family's prompts and request features (auto: from the model folder's name).
    prompt_family: str = "auto"
    max_input_tokens: int = 1024
    max_new_tokens: int = 512
    max_texts_per_request: int = 16
    max_chars_per_text: int = 4000
    max_batch_rows: int = 64
    # Fast engine: prompt beginnings (instruction templates per target language, a
    # document's context) whose K/V are kept and reused instead of computed again, up to 256
    # tokens each (33 MB each for the 7B, taken from the KV cache's share); 0 turns it off.
    prefix_cache_entries: int = 64
    # Fast engine: prompt tokens that ride in each decode step (new rows' prompts, in chunks),
    # so that admitting rows never stalls the running batch; 0: rows join between steps.
    mixed_step_tokens: int = 256
    # Async mode only: texts that may wait for the engine beyond those it is generating;
    # more get 503 at once (TorchServe's job queue does not apply in async mode).
    max_waiting_rows: int = 1024
    # Async mode only: the workers on one GPU share one engine process (one copy of the
    # weights, one continuous batch) instead of each loading its own; for several workers
    # per GPU, which spread TorchServe's per-request Python over cores.
    share_engine: bool = False
    # Request fields of the families that support them (HY-MT1.5, Hy-MT2): glossary pairs per
    # request, characters per glossary term, characters of context, characters of a style or of
    # one preference.
    max_glossary_terms: int = 64
    max_term_chars: int = 200
    max_context_chars: int = 2000
    max_instruction_chars: int = 500
    # Documents ("document" in a request): size in UTF-8 bytes, segments (rows) per document,
    # tokens per segment before a block is cut into sentences, and how many of a document's
    # rows are in the engine at once (the rest follow as they finish, so one document never
    # fills the waiting line that other requests need).
    max_document_bytes: int = 1_048_576
    max_document_segments: int = 20_000
    document_segment_tokens: int = 256
    document_window_rows: int = 512
    # A segment's output stops at 8 + this x its own tokens (and at max_new_tokens): a model
    # caught repeating itself cannot hold a whole document up.
    document_length_factor: float = 3.0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Test-only fault injection (0 = off): a batch holding a request with exactly this
    # max_new_tokens fails with a device out-of-memory error. Never set it in production.
    test_oom_max_new_tokens: int = 0
    # Test-only (0 = off): a batch holding a request with exactly this max_new_tokens never
    # finishes (a wedged worker, for the health check's tests). Never set it in production.
    test_hang_max_new_tokens: int = 0

    @classmethod
    def from_mapping(
        cls,
        raw: Mapping[str, Any] | None,
        *,
        model_dir: str | os.PathLike[str] = ".",
        environ: Mapping[str, str] = os.environ,
    ) -> Settings:
        """Settings from the ``handler:`` section. Raises ConfigurationError naming the key."""
        values = dict(raw or {})
        known = (
            {f.name for f in fields(cls) if f.name != "sampling"} | set(FLOAT_BOUNDS) | {"top_k"}
        )
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown handler setting(s) {unknown}; allowed: {sorted(known)}"
            )
        model_path = _model_path(values.pop("model_path", None), model_dir, environ)
        choices: dict[str, Any] = {k: _choice(k, values.pop(k)) for k in CHOICES if k in values}
        ints: dict[str, Any] = {
            k: _bounded_int(k, values.pop(k)) for k in INT_BOUNDS if k in values
        }
        floats: dict[str, Any] = {
            key: _bounded_float(key, values.pop(key)) for key in FLOAT_BOUNDS if key in values
        }
        flags: dict[str, Any] = {k: _flag(k, values.pop(k)) for k in FLAGS if k in values}
        sampling = SamplingParams(
            **{key: floats.pop(key) for key in SAMPLING_FLOATS if key in floats},
            **({"top_k": ints.pop("top_k")} if "top_k" in ints else {}),
        )
        settings = cls(
            model_path=model_path, sampling=sampling, **choices, **ints, **floats, **flags
        )
        if settings.quantize_lm_head and settings.quantization not in ("none", *HEAD_QUANTIZATIONS):
            raise ConfigurationError(
                "quantize_lm_head needs quantization 'fp8', 'int8' or 'int4' (or an FP8 or "
                "GPTQ-Int4 checkpoint), "
                f"got {settings.quantization!r}"
            )
        return settings

    def with_cpu_threads(self, engines: int, environ: Mapping[str, str] = os.environ) -> Settings:
        """``cpu_threads: 0`` made a count for ``engines`` engines on this machine: the usable
        cores divided among them, at least one each. Unchanged when ``cpu_threads`` is set, or
        when OMP_NUM_THREADS is (PyTorch then follows it)."""
        if self.cpu_threads or environ.get("OMP_NUM_THREADS", "").strip():
            return self
        return replace(self, cpu_threads=max(1, usable_cpus() // max(1, engines)))

    def public(self) -> dict[str, Any]:
        """A JSON-ready view for describe output and logs (no secrets in settings)."""
        view = {f.name: getattr(self, f.name) for f in fields(self)}
        view["model_path"] = str(self.model_path)
        view["sampling"] = vars(self.sampling).copy()
        return view


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota
    (a container's CPU limit, which the affinity does not show)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    try:
        quota, period = cpu_max.read_text(encoding="ascii").split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 here, or a file of another shape
        pass
    return cpus


def _model_path(value: Any, model_dir: str | os.PathLike[str], environ: Mapping[str, str]) -> Path:
    from_env = environ.get(MODEL_PATH_ENV, "").strip()
    if from_env:
        value = from_env
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"model_path must name a Hugging Face model folder (set it in the handler: section of "
            f"model-config.yaml or in ${MODEL_PATH_ENV}), got {value!r}"
        )
    path = Path(value.strip()).expanduser()
    return path if path.is_absolute() else (Path(model_dir) / path).resolve()


def _choice(key: str, value: Any) -> str:
    normal = value.strip().lower() if isinstance(value, str) else value
    if key == "quantization" and normal in (None, False, "", "null"):
        normal = "none"
    if normal not in CHOICES[key]:
        raise ConfigurationError(f"{key} must be one of {list(CHOICES[key])}, got {value!r}")
    return str(normal)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{key} must be true or false, got {value!r}")
    return value


def _bounded_int(key: str, value: Any) -> int:
    low, high = INT_BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _bounded_float(key: str, value: Any) -> float:
    low, high, low_open = FLOAT_BOUNDS[key]
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    in_range = ok_type and (value > low if low_open else value >= low) and value <= high
    if not in_range:
        bracket = "(" if low_open else "["
        raise ConfigurationError(
            f"{key} must be a number in {bracket}{low}, {high}], got {value!r}"
        )
    return float(value)
