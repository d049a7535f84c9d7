"""GPTQ-Int4 checkpoints (HY-MT1.5-*-GPTQ-Int4's layout): written from the tiny model in that
layout, read back by the engine without a GPTQ package, dequantized exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.engine.checkpoints.gptq import dequantize, gptq_config, kernel_form
from hymt_serve.engine.engine import load_engine
from hymt_serve.engine.kernels.weight_only import unpack_int4
from hymt_serve.ops.quantize import gptq_pack, gptq_quantization_config, write_gptq_checkpoint


@pytest.fixture(scope="module")
def gptq_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gptq_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("gptq") / "tiny-gptq")


def load(path: Path, **settings: object):  # type: ignore[no-untyped-def]
    raw = {"model_path": str(path), "max_new_tokens": 8, "max_input_tokens": 128, **settings}
    return load_engine(Settings.from_mapping(raw, environ={}))


def test_packing_follows_the_format_bit_by_bit() -> None:
    """Independent of the loader: value v of input column i, output o sits in
    qweight[i // 8, o] at bits 4 * (i % 8); zero points (8) are stored as 7."""
    torch.manual_seed(0)
    weight = torch.randn(16, 256)
    parts = gptq_pack(weight)
    assert parts["qweight"].shape == (32, 16) and parts["qweight"].dtype == torch.int32
    assert parts["qzeros"].shape == (2, 2) and parts["scales"].shape == (2, 16)
    assert parts["scales"].dtype == torch.float16
    assert parts["g_idx"].tolist() == [i // 128 for i in range(256)]
    for i, o in ((0, 0), (5, 3), (130, 15), (255, 7)):
        stored = (int(parts["qweight"][i // 8, o]) >> (4 * (i % 8))) & 0xF
        scale = float(parts["scales"][i // 128, o])
        assert stored == max(0, min(15, round(float(weight[o, i]) / scale) + 8))
    assert all((int(z) >> (4 * k)) & 0xF == 7 for z in parts["qzeros"].flatten() for k in range(8))
    back = dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"])
    group_scale = parts["scales"].float()[parts["g_idx"].long()].T
    # half a step, a little more at the top of the range (+7.5 steps clamps to +7 with an
    # fp16-rounded scale)
    assert ((back - weight).abs() <= group_scale * 0.51).all()
    assert unpack_int4(parts["qweight"]).shape == (256, 16)


def test_the_checkpoint_has_the_published_layout(gptq_dir: Path) -> None:
    config = json.loads((gptq_dir / "config.json").read_text())
    assert config["quantization_config"] == gptq_quantization_config()
    with safe_open(str(gptq_dir / "model.safetensors"), framework="pt") as handle:
        kinds = {key: str(handle.get_slice(key).get_dtype()) for key in handle.keys()}  # noqa: SIM118
    assert kinds["model.layers.0.self_attn.q_proj.qweight"] == "I32"
    assert kinds["model.layers.0.self_attn.q_proj.scales"] == "F16"
    assert kinds["model.layers.0.mlp.down_proj.g_idx"] == "I32"
    assert not any(key.endswith("proj.weight") for key in kinds)


def test_transformers_serves_it_dequantized(gptq_dir: Path, tiny_model_dir: Path) -> None:
    engine = load(gptq_dir)  # engine auto on the CPU: transformers' forward
    described = engine.describe()
    assert described["engine"] == "hf"
    assert described["weights_format"] == "GPTQ-Int4 checkpoint, then dequantized at load"
    source = load(tiny_model_dir)
    ours = engine.loaded.model.model.layers[1].mlp.down_proj.weight.float()
    theirs = source.loaded.model.model.layers[1].mlp.down_proj.weight.float()
    assert (ours - theirs).norm() / theirs.norm() < 0.15  # 4 bits: about a tenth
    tensors = load_file(str(gptq_dir / "model.safetensors"))
    prefix = "model.layers.1.mlp.down_proj."
    exact = dequantize(*(tensors[prefix + p] for p in ("qweight", "qzeros", "scales", "g_idx")))
    torch.testing.assert_close(ours, exact.to(ours.dtype).float())
    prompts = [engine.encode_prompt(t) for t in ("Good morning.", "今天天气很好。")]
    with torch.no_grad():
        a = engine.loaded.model(torch.tensor([prompts[0]])).logits[0, -1]
        b = source.loaded.model(torch.tensor([prompts[0]])).logits[0, -1]
    assert F.cosine_similarity(a.double(), b.double(), dim=0) >= 0.9
    assert engine.generate([row(engine, prompts[1])])[0].output_tokens >= 1


def test_the_fast_engine_serves_it_in_int4(gptq_dir: Path) -> None:
    """The fast engine takes the packed weights as they are (fused q/k/v and gate/up side by
    side) and releases the dequantized copies; its product is the dequantized one's."""
    reference = load(gptq_dir)
    engine = load(gptq_dir, engine="fast")
    described = engine.describe()
    assert described["weights_format"] == (
        "GPTQ-Int4 checkpoint, then int4 weight-only in the fast engine"
    )
    assert described["quantization"] == "gptq-int4"  # also hymt_engine_info's label
    assert described["fast"]["projections"] == (
        "int4 weight-only, a scale and zero point per 64 inputs"  # the tiny model's 64 inputs
    )
    layer = engine.runner.weights.layers[1]
    assert layer.gate_up.dtype == torch.int32 and layer.gate_up.shape == (8, 256)
    assert layer.gate_up_scale.shape == (2, 1, 256)
    assert engine.loaded.model.model.layers[1].mlp.up_proj.weight.numel() == 0
    tensors = load_file(str(gptq_dir / "model.safetensors"))
    torch.testing.assert_close(layer.down, tensors["model.layers.1.mlp.down_proj.qweight"])
    prompts = [engine.encode_prompt(t) for t in ("Good morning.", "今天天气很好。")]
    fast = engine.generate([row(engine, p) for p in prompts])
    slow = reference.generate([row(reference, p) for p in prompts])
    # greedy over the same dequantized numbers (fp32 on the CPU)
    assert [r.token_ids for r in fast] == [r.token_ids for r in slow]


def test_a_gptq_checkpoint_serves_with_its_head_in_int8(gptq_dir: Path) -> None:
    """quantize_lm_head beside a GPTQ checkpoint's int4 projections: the published head (bf16)
    becomes int8 with a scale per row, shared with the tied embedding."""
    engine = load(gptq_dir, engine="fast", quantize_lm_head=True)
    weights = engine.runner.weights
    assert weights.lm_head.dtype == torch.int8 and weights.embed.dtype == torch.int8
    assert engine.describe()["fast"]["lm_head"] == (
        "int8, a scale per row, its table shared with the embedding"
    )
    (result,) = engine.generate([row(engine, engine.encode_prompt("Good morning."))])
    assert result.token_ids


def test_act_order_without_static_groups_keeps_the_dequantized_path() -> None:
    """A ``g_idx`` that is not ``column // group_size`` cannot use the kernel's groups."""
    parts = gptq_pack(torch.randn(16, 256))
    assert kernel_form(**parts) is not None
    shuffled = {**parts, "g_idx": parts["g_idx"].flip(0)}
    assert kernel_form(**shuffled) is None


def row(engine, prompt):  # type: ignore[no-untyped-def]
    from hymt_serve.core.types import GenerationRow

    return GenerationRow(tuple(prompt), 8)


@pytest.mark.parametrize("change", [{"bits": 8}, {"sym": False}, {"checkpoint_format": "gptq_v2"}])
def test_other_gptq_variants_are_refused_by_name(change: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match="supported: GPTQ 4-bit"):
        gptq_config({"quantization_config": {**gptq_quantization_config(), **change}})


def test_a_projection_with_missing_parts_is_refused(gptq_dir: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(gptq_dir, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.0.self_attn.k_proj.qzeros"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ConfigurationError, match=r"k_proj: GPTQ parts .*missing \['qzeros'\]"):
        load(broken)


@pytest.mark.parametrize("quantization", ["fp8", "int8"])
def test_quantizing_it_again_is_refused(gptq_dir: Path, quantization: str) -> None:
    with pytest.raises(ConfigurationError, match="this is a GPTQ-Int4 checkpoint"):
        load(gptq_dir, quantization=quantization)


def test_int4_names_what_it_already_is(gptq_dir: Path) -> None:
    engine = load(gptq_dir, quantization="int4")  # the checkpoint's own weights, not requantized
    assert engine.describe()["weights_format"] == (
        "GPTQ-Int4 checkpoint, then int4 weight-only in the fast engine"
    )
