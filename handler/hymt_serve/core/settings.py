"""One frozen settings object, loaded from model-config.yaml's ``handler:`` section.

The keys are flat on the wire and grouped here by concern (:mod:`hymt_serve.core.config`):
``settings.loading``, ``.scheduler``, ``.limits``, ``.serving``, ``.checks``, ``.memory``
and ``.sampling``. Unknown keys are rejected; values are normalised first (strings stripped and
lower-cased where they name a choice), then verified; every message names the key, the bound
and the value.
``HYMT_MODEL_PATH`` in the environment, when set, overrides ``model_path``. A relative model
path is read against the model archive's folder.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hymt_serve.core.config import (
    CONCERNS,
    Loading,
    Memory,
    OutputChecks,
    Quantization,
    RequestLimits,
    Sampling,
    Scheduler,
    Serving,
    Spec,
    spec_of,
    specs,
)
from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.types import GenerationRow, SamplingParams

MODEL_PATH_ENV = "HYMT_MODEL_PATH"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Validated handler settings, one config per concern. Build with :meth:`from_mapping`;
    never mutated."""

    model_path: Path
    loading: Loading = field(default_factory=Loading)
    scheduler: Scheduler = field(default_factory=Scheduler)
    limits: RequestLimits = field(default_factory=RequestLimits)
    serving: Serving = field(default_factory=Serving)
    checks: OutputChecks = field(default_factory=OutputChecks)
    memory: Memory = field(default_factory=Memory)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Not a handler key: a check the engine runs on the rows of each prefill, set by code that
    # wraps the handler (the tests inject device errors and hangs with it). It must pickle: the
    # engine process gets the settings.
    before_prefill: Callable[[Sequence[GenerationRow]], None] | None = None

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
        known = {"model_path"} | {f.name for c in CONCERNS.values() for f, _ in specs(c)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown handler setting(s) {unknown}; allowed: {sorted(known)}"
            )
        model_path = _model_path(values.pop("model_path", None), model_dir, environ)
        values = {**folder_sampling(model_path), **values}
        concerns = {name: _build(config, values) for name, config in CONCERNS.items()}
        sampling: Sampling = concerns.pop("sampling")
        settings = cls(model_path=model_path, sampling=sampling.params(), **concerns)
        quantization = settings.loading.quantization
        if settings.loading.quantize_lm_head and not (
            quantization is Quantization.NONE or quantization.head_may_follow
        ):
            raise ConfigurationError(
                "quantize_lm_head needs quantization 'fp8', 'int8' or 'int4' (or an FP8 or "
                f"GPTQ-Int4 checkpoint), got {quantization.value!r}"
            )
        return settings

    def with_cpu_threads(self, engines: int, environ: Mapping[str, str] = os.environ) -> Settings:
        """``cpu_threads: 0`` made a count for ``engines`` engines on this machine: the usable
        cores divided among them, at least one each. Unchanged when ``cpu_threads`` is set, or
        when OMP_NUM_THREADS is (PyTorch then follows it)."""
        if self.loading.cpu_threads or environ.get("OMP_NUM_THREADS", "").strip():
            return self
        threads = max(1, usable_cpus() // max(1, engines))
        return replace(self, loading=replace(self.loading, cpu_threads=threads))

    def public(self) -> dict[str, Any]:
        """The flat keys as model-config.yaml writes them, JSON-ready, for describe output and
        logs (no secrets in settings)."""
        view: dict[str, Any] = {"model_path": str(self.model_path)}
        for name in ("loading", "scheduler", "limits", "serving", "checks", "memory"):
            view.update(asdict(getattr(self, name)))
        view["memory_database_url"] = without_password(self.memory.memory_database_url)
        view["quantization"] = self.loading.quantization.value
        view["sampling"] = asdict(self.sampling)
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


def without_password(url: str) -> str:
    """A database URL fit for describe output and logs: its password, if any, as ``***``."""
    scheme, found, rest = url.partition("://")
    user, at, host = rest.rpartition("@")
    if not (found and at and ":" in user):
        return url
    return f"{scheme}://{user.split(':', 1)[0]}:***@{host}"


GENERATION_CONFIG = "generation_config.json"


def folder_sampling(model_path: Path) -> dict[str, Any]:
    """The sampling keys a model folder's ``generation_config.json`` names (temperature, top_p,
    top_k, repetition_penalty; top_k -1 or 0 meaning no limit, as 0); none without the file.
    Raises ConfigurationError, naming the file, for a value outside the setting's bounds."""
    try:
        config = json.loads((model_path / GENERATION_CONFIG).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    found = {key: config[key] for key in SAMPLING_KEYS if config.get(key) is not None}
    if found.get("top_k") == -1:
        found["top_k"] = 0
    for key, value in found.items():
        try:
            _check(key, spec_of(Sampling, key), value)
        except ConfigurationError as error:
            raise ConfigurationError(f"{model_path / GENERATION_CONFIG}: {error}") from None
    return found


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")


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


def _build(config: type[Any], values: Mapping[str, Any]) -> Any:
    """``config`` from the keys of ``values`` it defines, each checked against its spec."""
    given: dict[str, Any] = {}
    for field_, spec in specs(config):
        if field_.name in values:
            given[field_.name] = _check(field_.name, spec, values[field_.name])
    if config is Loading and "quantization" in given:
        given["quantization"] = Quantization(given["quantization"])
    return config(**given)


def _check(key: str, spec: Spec, value: Any) -> Any:
    if spec.kind == "choice":
        return _choice(key, spec, value)
    if spec.kind in ("path", "url"):
        if not isinstance(value, str) or not value.strip():
            raise ConfigurationError(f"{key} must be {spec.bounds()}, got {value!r}")
        word = value.strip().lower()
        return word if word in spec.choices else value.strip()
    if spec.kind == "flag":
        if not isinstance(value, bool):
            raise ConfigurationError(f"{key} must be true or false, got {value!r}")
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if spec.kind == "int":
        if not number or not isinstance(value, int) or not spec.low <= value <= spec.high:
            raise ConfigurationError(f"{key} must be an integer in {spec.bounds()}, got {value!r}")
        return value
    above_low = number and (value > spec.low if spec.low_open else value >= spec.low)
    if not (above_low and value <= spec.high):
        raise ConfigurationError(f"{key} must be a number in {spec.bounds()}, got {value!r}")
    return float(value)


def _choice(key: str, spec: Spec, value: Any) -> str:
    normal = value.strip().lower() if isinstance(value, str) else value
    if key == "quantization" and normal in (None, False, "", "null"):
        normal = "none"
    if normal not in spec.choices:
        raise ConfigurationError(f"{key} must be one of {list(spec.choices)}, got {value!r}")
    return str(normal)
