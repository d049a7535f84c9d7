"""FP8 checkpoints in the format Tencent publishes (compressed-tensors, AngelSlim's export):
written by ``hymt quantize-fp8`` from the tiny model, read back by the engine without the
compressed-tensors package, and anything else under ``quantization_config`` refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.engine.checkpoints import loading
from hymt_serve.engine.checkpoints.fp8 import fp8_scheme
from hymt_serve.engine.engine import Engine, load_engine
from hymt_serve.engine.kernels.quantized import FP8
from hymt_serve.ops.quantize import quantization_config, write_fp8_checkpoint

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def fp8_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fp8_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("fp8") / "tiny-fp8")


def load(path: Path, **settings: Any) -> Engine:
    raw = {"model_path": str(path), "max_new_tokens": 8, "max_input_tokens": 128, **settings}
    return load_engine(Settings.from_mapping(raw, environ={}))


def test_the_checkpoint_is_written_in_the_published_format(fp8_dir: Path) -> None:
    config = json.loads((fp8_dir / "config.json").read_text())
    quantization = config["quantization_config"]
    assert quantization["quant_method"] == "compressed-tensors"
    assert quantization["format"] == "naive-quantized"
    assert quantization["ignored_layers"] == ["lm_head", "model.embed_tokens"]
    group = quantization["config_groups"]["group_0"]
    expected = {"num_bits": 8, "strategy": "tensor", "dynamic": False, "type": "float"}
    assert group["weights"] == group["input_activations"] == expected
    assert group["targets"] == ["Linear"] and quantization["kv_cache_scheme"] is None
    hf_quant = (fp8_dir / "hf_quant_config.json").read_text()
    assert len(hf_quant) == 192  # the size of Hunyuan-MT-7B-fp8's own file
    assert json.loads(hf_quant)["quantization"]["quant_algo"] == "FP8"
    assert (fp8_dir / "tokenizer.json").is_file() and (fp8_dir / "TINY_MODEL.json").is_file()
    with safe_open(str(fp8_dir / "model.safetensors"), framework="pt") as handle:
        kinds = {key: str(handle.get_slice(key).get_dtype()) for key in handle.keys()}  # noqa: SIM118
        shapes = {key: handle.get_slice(key).get_shape() for key in handle.keys()}  # noqa: SIM118
    for key, kind in kinds.items():
        module, _, leaf = key.rpartition(".")
        if module.endswith(PROJECTIONS):
            assert kind == {"weight": "F8_E4M3", "weight_scale": "F32", "input_scale": "BF16"}[leaf]
            assert leaf == "weight" or shapes[key] == [1]
        else:
            assert kind == "BF16", key
    assert sum(key.endswith("q_proj.weight") for key in kinds) == 2  # both layers
    assert "model.embed_tokens.weight" in kinds and "lm_head.weight" not in kinds  # tied


def test_the_engine_serves_it_on_fp8_with_its_own_scales(
    fp8_dir: Path, tiny_model_dir: Path
) -> None:
    engine = load(fp8_dir)
    described = engine.describe()
    assert engine.fast and described["quantization"] == "fp8"
    assert described["weights_format"] == (
        "FP8 checkpoint (compressed-tensors, tensor-wise, static input scales)"
    )
    assert described["fast"]["projections"].endswith("static input scales")
    layer = engine.runner.weights.layers[0]  # type: ignore[attr-defined]
    assert layer.qkv.dtype == FP8 and layer.qkv_input.numel() == 1
    # The fused q/k/v, dequantized, is the source model's q/k/v to e4m3's rounding.
    source = load(tiny_model_dir, engine="fast")
    dense = source.runner.weights.layers[0].qkv.float()  # type: ignore[attr-defined]
    back = layer.qkv.float() * layer.qkv_scale
    normal = dense.abs() > dense.abs().max() / 64
    assert ((back - dense).abs() <= dense.abs() / 8)[normal].all()
    assert (back - dense).norm() / dense.norm() < 0.04
    results = engine.generate([source_row(engine, "Hello there, how are you?")])
    assert results[0].output_tokens >= 1


def source_row(engine: Engine, text: str) -> Any:
    from hymt_serve.core.types import GenerationRow

    return GenerationRow(tuple(engine.encode_prompt(text)), 8)


def test_its_logits_stay_close_to_the_bf16_model(fp8_dir: Path, tiny_model_dir: Path) -> None:
    """Cosine similarity of last-position logits over a few prompts (teacher-forced through
    each engine's own prefill); the bound is the one test_fp8_engine explains."""
    fp8, dense = load(fp8_dir), load(tiny_model_dir, engine="fast")
    prompts = [fp8.encode_prompt(t) for t in ("Good morning.", "今天天气很好。", "Wie geht's?")]
    with torch.inference_mode():
        ours = fp8.runner.prefill(prompts, range(len(prompts))).clone()
        theirs = dense.runner.prefill(prompts, range(len(prompts))).clone()
    cosine = F.cosine_similarity(ours.double(), theirs.double(), dim=-1)
    assert cosine.mean() >= 0.98 and cosine.min() >= 0.95, cosine


def test_the_ignore_spelling_loads_too(fp8_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ignore"
    shutil.copytree(fp8_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"] = quantization_config("ignore")
    (copy / "config.json").write_text(json.dumps(config))
    assert load(copy).describe()["quantization"] == "fp8"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quant_method": "gptq"}, "quantized with 'gptq'"),
        ({"format": "pack-quantized"}, "format 'pack-quantized'"),
        ({"kv_cache_scheme": {"num_bits": 8}}, "quantized KV cache"),
        ({"weights": {"strategy": "channel"}}, "'strategy': 'channel'"),
        ({"weights": {"num_bits": 4, "type": "int"}}, "'num_bits': 4"),
        ({"weights": {"dynamic": True}}, "'dynamic': True"),
    ],
)
def test_other_quantizations_are_refused_by_name(change: dict[str, Any], message: str) -> None:
    config = quantization_config()
    group = config["config_groups"]["group_0"]
    for key, value in change.items():
        if key == "weights":
            group["weights"] = {**group["weights"], **value}
        else:
            config[key] = value
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        fp8_scheme({"quantization_config": config})


def test_dynamic_input_scales_and_no_quantization(fp8_dir: Path) -> None:
    config = quantization_config()
    config["config_groups"]["group_0"]["input_activations"]["dynamic"] = True
    assert fp8_scheme({"quantization_config": config}) is False
    assert fp8_scheme({"quantization_config": quantization_config()}) is True
    assert fp8_scheme({}) is None


def test_settings_that_contradict_the_checkpoint_are_refused(fp8_dir: Path) -> None:
    """(On a GPU: the CPU refuses bitsandbytes before the checkpoint is read.)"""
    settings = Settings.from_mapping(
        {"model_path": str(fp8_dir), "quantization": "nf4"}, environ={}
    )
    plan = loading.LoadPlan(torch.device("cuda", 0), torch.bfloat16, "sdpa", "nf4")
    with pytest.raises(ConfigurationError, match="FP8 checkpoint: quantization 'nf4'"):
        loading._fp8_checkpoint(settings, plan, loading.read_config(fp8_dir), {})


def test_a_projection_stored_without_its_scale_is_refused(fp8_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(fp8_dir, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight_scale"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ConfigurationError, match=r"layers\.1\.mlp\.down_proj is not stored"):
        load(broken)
