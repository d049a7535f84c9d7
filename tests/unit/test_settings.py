from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hymt_serve.core.config import CONCERNS, Quantization, specs
from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import MODEL_PATH_ENV, Settings
from hymt_serve.core.types import SamplingParams


def load(raw: dict[str, Any], env: dict[str, str] | None = None) -> Settings:
    return Settings.from_mapping(raw, model_dir="/archive", environ=env or {})


def test_defaults_and_model_card_sampling() -> None:
    settings = load({"model_path": "/models/mt"})
    assert settings.model_path == Path("/models/mt")
    loading = settings.loading
    assert (loading.device, loading.dtype, loading.attention) == ("auto", "auto", "auto")
    assert settings.loading.quantization == "none"
    assert settings.sampling == SamplingParams(0.7, 0.6, 20, 1.05)


def test_relative_model_path_is_read_against_the_archive() -> None:
    assert load({"model_path": "model"}).model_path == Path("/archive/model")


def test_environment_overrides_model_path() -> None:
    settings = load({"model_path": "/a"}, {MODEL_PATH_ENV: "/from/env"})
    assert settings.model_path == Path("/from/env")
    assert load({}, {MODEL_PATH_ENV: "/only/env"}).model_path == Path("/only/env")


def test_choices_are_normalised() -> None:
    settings = load({"model_path": "/m", "dtype": " BFloat16 ", "quantization": None})
    assert settings.loading.dtype == "bfloat16"
    assert settings.loading.quantization == "none"
    assert settings.loading.quantization is Quantization.NONE
    assert load({"model_path": "/m", "blas_library": "cuBLASLt"}).loading.blas_library == "cublaslt"
    assert load({"model_path": "/m"}).loading.blas_library == "cublas"
    assert load({"model_path": "/m"}).loading.one_row_kernel == "auto"
    loaded = load({"model_path": "/m", "one_row_kernel": "cuBLAS"})
    assert loaded.loading.one_row_kernel == "cublas"
    assert load({"model_path": "/m"}).loading.compile_cache_dir == "auto"
    assert (
        load({"model_path": "/m", "compile_cache_dir": " OFF "}).loading.compile_cache_dir == "off"
    )
    kept = load({"model_path": "/m", "compile_cache_dir": " /Cache/Kept "})
    assert kept.loading.compile_cache_dir == "/Cache/Kept"  # a folder keeps its case


def test_the_blas_library_applies_on_cuda_only() -> None:
    from hymt_serve.engine.checkpoints.loading import plan_load

    settings = load({"model_path": "/m", "device": "cpu", "blas_library": "cublaslt"})
    assert plan_load(settings).describe()["blas_library"] == "none"
    settings = load({"model_path": "/m", "device": "cpu", "one_row_kernel": "cublas"})
    assert plan_load(settings).describe()["one_row_kernel"] == "none"


@pytest.mark.parametrize(
    ("setting", "capability", "resolved"),
    [("auto", (9, 0), "triton"), ("auto", (8, 0), "cublas"), ("auto", (8, 9), "cublas"),
     ("triton", (8, 6), "triton"), ("cublas", (9, 0), "cublas")],
)  # fmt: skip
def test_auto_takes_the_plain_row_kernel_where_it_was_measured(
    monkeypatch: pytest.MonkeyPatch, setting: str, capability: tuple[int, int], resolved: str
) -> None:
    """Compute capability 9.x: the Triton kernel (measured faster than cuBLAS there); elsewhere
    cuBLAS unless asked for."""
    from hymt_serve.engine.checkpoints import loading

    monkeypatch.setattr(loading.torch.cuda, "get_device_capability", lambda device: capability)
    assert loading.one_row_kernel(setting, loading.torch.device("cuda", 0)) == resolved


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "model_path must name"),
        (
            {"model_path": "/m", "max_new_tokens": 0},
            "max_new_tokens must be an integer in [1, 32768], got 0",
        ),
        ({"model_path": "/m", "max_new_tokens": "64"}, "got '64'"),
        ({"model_path": "/m", "max_new_tokens": True}, "got True"),
        ({"model_path": "/m", "top_p": 1.5}, "top_p must be a number in (0.0, 1.0], got 1.5"),
        (
            {"model_path": "/m", "temperature": 0},
            "temperature must be a number in (0.0, 10.0], got 0",
        ),
        ({"model_path": "/m", "dtype": "int4"}, "dtype must be one of"),
        (
            {"model_path": "/m", "blas_library": "mkl"},
            "blas_library must be one of ['cublas', 'cublaslt']",
        ),
        (
            {"model_path": "/m", "one_row_kernel": "cutlass"},
            "one_row_kernel must be one of ['auto', 'triton', 'cublas']",
        ),
        (
            {"model_path": "/m", "quantization": "gptq"},
            "quantization must be one of ['none', 'fp8', 'int8', 'int4', 'bnb-int8', 'nf4']",
        ),
        (
            {"model_path": "/m", "max_new_tokenz": 5},
            "unknown handler setting(s) ['max_new_tokenz']",
        ),
    ],
)
def test_bad_settings_name_key_bound_and_value(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load(raw)
    assert message in str(info.value)


def test_sampling_overrides() -> None:
    settings = load({"model_path": "/m", "temperature": 0.5, "top_k": 5})
    assert settings.sampling == SamplingParams(temperature=0.5, top_p=0.6, top_k=5)


def test_settings_are_frozen_and_public_view_is_json_ready() -> None:
    import json

    settings = load({"model_path": "/m"})
    with pytest.raises(AttributeError):
        settings.limits.max_new_tokens = 5  # type: ignore[misc]
    assert json.loads(json.dumps(settings.public()))["sampling"]["top_k"] == 20


@pytest.mark.parametrize(
    ("raw", "env", "engines", "cores", "threads"),
    [({}, {}, 2, 2, 1), ({}, {}, 3, 16, 5), ({}, {}, 4, 2, 1), ({}, {}, 1, 8, 8),
     ({"cpu_threads": 6}, {}, 4, 2, 6), ({}, {"OMP_NUM_THREADS": "3"}, 2, 8, 0)],
)  # fmt: skip
def test_cpu_threads_share_the_cores_among_engines(
    monkeypatch: pytest.MonkeyPatch,
    raw: dict[str, Any],
    env: dict[str, str],
    engines: int,
    cores: int,
    threads: int,
) -> None:
    """Auto (0): the usable cores over the engines, at least one each; a set count, or
    OMP_NUM_THREADS (then PyTorch's own choice, 0 here), stays."""
    from hymt_serve.core import settings as module

    monkeypatch.setattr(module, "usable_cpus", lambda: cores)
    settings = load({"model_path": "/m", **raw}).with_cpu_threads(engines, env)
    assert settings.loading.cpu_threads == threads


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [("max 100000\n", 4), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000", 1),
     ("1200000 100000\n", 4), ("garbage", 4), (None, 4)],
)  # fmt: skip
def test_usable_cpus_follow_affinity_and_the_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_max: str | None, cores: int
) -> None:
    from hymt_serve.core import settings as module

    monkeypatch.setattr(module.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max, encoding="ascii")
    assert module.usable_cpus(path) == cores


def test_the_cpu_plan_sets_the_threads_it_reports() -> None:
    from hymt_serve.engine.checkpoints.loading import plan_load

    settings = load({"model_path": "/m", "device": "cpu", "cpu_threads": 3})
    assert plan_load(settings).describe()["cpu_threads"] == "3"
    assert plan_load(settings).cpu_threads == 3
    auto = plan_load(load({"model_path": "/m", "device": "cpu"}))
    assert auto.cpu_threads >= 1  # PyTorch's own count, left as it is


def test_the_public_view_keeps_the_flat_keys_of_model_config() -> None:
    """The describe output's ``settings`` names each key as model-config.yaml writes it."""
    view = load({"model_path": "/m", "quantization": "int8", "max_new_tokens": 20}).public()
    keys = {f.name for name, config in CONCERNS.items() if name != "sampling"
            for f, _ in specs(config)}  # fmt: skip
    assert set(view) == keys | {"model_path", "sampling"}
    assert (view["quantization"], view["max_new_tokens"]) == ("int8", 20)


@pytest.mark.parametrize(
    ("raw", "message"),
    [({"quantize_lm_head": True, "quantization": "nf4"}, "quantize_lm_head needs quantization"),
     ({"top_k": -1}, "top_k must be an integer in [0, 1000], got -1"),
     ({"document_length_factor": 0.0}, "document_length_factor must be a number in (0.0, 100.0]"),
     ({"share_engine": "yes"}, "share_engine must be true or false, got 'yes'"),
     ({"compile_cache_dir": 3}, "compile_cache_dir must be auto, off, a folder, got 3"),
     ({"compile_cache_dir": " "}, "compile_cache_dir must be auto, off, a folder, got ' '")],
)  # fmt: skip
def test_every_kind_of_key_names_its_bound(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"model_path": "/m", **raw})
    assert message in str(info.value)


def test_quantization_knows_its_engine_and_head() -> None:
    fast = {q for q in Quantization if q.fast}
    assert fast == {Quantization.FP8, Quantization.INT8, Quantization.INT4}
    assert {q for q in Quantization if q.bitsandbytes} == {Quantization.BNB_INT8, Quantization.NF4}
    assert {q for q in Quantization if q.head_may_follow} == fast | {Quantization.GPTQ_INT4}
    assert "gptq-int4" not in Quantization.settable()
    assert Quantization.INT4.fits_checkpoint(Quantization.GPTQ_INT4)
    assert not Quantization.FP8.fits_checkpoint(Quantization.GPTQ_INT4)
    assert Quantization.NONE.fits_checkpoint(Quantization.FP8)
    assert not Quantization.INT8.fits_checkpoint(Quantization.FP8)


def test_sampling_defaults_come_from_the_folders_generation_config(tmp_path: Path) -> None:
    """Hy-MT2-30B-A3B recommends other sampling than the 7B family: its folder says so."""
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.7, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0})
    )
    settings = Settings.from_mapping({"model_path": str(tmp_path)}, environ={})
    assert (settings.sampling.top_p, settings.sampling.top_k) == (1.0, 0)
    assert settings.sampling.repetition_penalty == 1.0
    # the handler section still decides what it names
    chosen = Settings.from_mapping({"model_path": str(tmp_path), "top_k": 40}, environ={})
    assert chosen.sampling.top_k == 40
    # a folder without the file, or without sampling keys, keeps the defaults
    assert Settings.from_mapping({"model_path": "/m"}, environ={}).sampling.top_k == 20
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 2.0}))
    with pytest.raises(ConfigurationError, match=r"generation_config\.json: top_p must be"):
        Settings.from_mapping({"model_path": str(tmp_path)}, environ={})
