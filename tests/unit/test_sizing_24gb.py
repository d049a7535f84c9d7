"""The arithmetic of benchmarks/sizing (sizing on paper for 24 GB cards): the weight bytes of
every form against what the fast engine reported holding on a GPU, the shapes against
transformers' own modules, the KV slots against the engine's own memory plan (its free-memory
query answered here: there is no GPU), FP8's refusal below compute capability 8.9 against the
loader's, and the calibration giving back the H100's measurements."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from hymt_serve.core.config import Quantization
from hymt_serve.core.errors import ConfigurationError
from hymt_serve.engine.checkpoints import loading
from hymt_serve.engine.runners import build, fast, prefill

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks/sizing"))
sys.path.insert(0, str(REPO / "loadtest/serving"))
import card_roofline as cr  # noqa: E402
import size_24gb  # noqa: E402
from flops import flops_per_token  # noqa: E402

SEVEN_B, SMALL = cr.HUNYUAN_7B, cr.HUNYUAN_1_8B

# weight_bytes the fast engine's describe() reported per form for the 7B (decode benchmark,
# H200, 2026-12-04); the FP8 checkpoint's adds its 128 input scales (512 bytes) to fp8's.
ENGINE_REPORTED = {
    "bf16": 15_009_136_640,
    "fp8": 8_029_815_296,
    "fp8+head": 7_504_843_784 - 512,
    "int8+head": 7_511_373_312,
    "int4+head": 4_234_311_168,
}


def config_of(shape: cr.Shape, layers: int | None = None) -> dict[str, Any]:
    return {
        "model_type": "hunyuan_v1_dense",
        "num_hidden_layers": layers or shape.layers,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab,
        "tie_word_embeddings": shape.tied,
        "use_qk_norm": True,
    }


def test_the_7b_in_bf16_is_its_parameters_times_two() -> None:
    assert SEVEN_B.params() == 7_504_568_320
    assert cr.weight_bytes(SEVEN_B, "bf16") == 2 * SEVEN_B.params()


@pytest.mark.parametrize("form", sorted(ENGINE_REPORTED))
def test_each_form_holds_the_bytes_the_engine_reported(form: str) -> None:
    assert cr.weight_bytes(SEVEN_B, form) == ENGINE_REPORTED[form]


def test_quantized_forms_keep_what_their_bits_say() -> None:
    projections = SEVEN_B.projection_params()
    int4 = cr.weight_bytes(SEVEN_B, "int4") - cr.weight_bytes(SEVEN_B, "bf16")
    # 4 bits a weight plus an fp16 scale and zero point per 128 inputs, against 16 bits
    assert int4 == projections // 2 + projections // 32 - 2 * projections
    with pytest.raises(ValueError, match="form must be one of"):
        cr.weight_bytes(SEVEN_B, "fp4")


@pytest.mark.parametrize("shape", [SEVEN_B, SMALL], ids=["7B", "1.8B"])
def test_shapes_count_what_transformers_builds(shape: cr.Shape) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM  # (heavy: this test only)

    two_layers = cr.Shape(**{**shape.__dict__, "layers": 2})
    config = AutoConfig.for_model(**config_of(shape, layers=2))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == two_layers.params()


@pytest.mark.parametrize("shape", [SEVEN_B, SMALL], ids=["7B", "1.8B"])
def test_flops_and_kv_bytes_per_token(shape: cr.Shape) -> None:
    assert shape.flops_per_token() == flops_per_token(config_of(shape))
    assert SEVEN_B.kv_bytes_per_token() == 128 * 1024 and SMALL.kv_bytes_per_token() == 64 * 1024


def test_the_memory_plan_is_the_engine_s_and_the_gpu_profile_s() -> None:
    plan = cr.GPU_PROFILE
    profile = yaml.safe_load((REPO / "configs/model-config-gpu.yaml").read_text())["handler"]
    assert plan.kv_share == build.KV_CACHE_SHARE and plan.headroom == fast.STEP_HEADROOM
    assert plan.prefix_tokens == prefill.PREFIX_TOKENS
    assert plan.positions == profile["max_input_tokens"] + profile["max_new_tokens"]
    assert plan.wanted == profile["max_batch_rows"]
    assert plan.prefix_entries == profile["prefix_cache_entries"]


class _Loaded(nn.Module):
    """What cache_rows reads of a loaded model: its config and its parameters' dtype."""

    def __init__(self, shape: cr.Shape) -> None:
        super().__init__()
        self.config = type("Config", (), {**config_of(shape), "head_dim": shape.head_dim})()
        self.weight = nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))


@pytest.mark.parametrize("card", [cr.A10, cr.L4, cr.H100], ids=lambda c: c.name)
@pytest.mark.parametrize("shape", [SEVEN_B, SMALL], ids=["7B", "1.8B"])
def test_slots_are_what_the_engine_s_own_plan_gives(
    card: cr.Card, shape: cr.Shape, monkeypatch: pytest.MonkeyPatch
) -> None:
    resident = cr.weight_bytes(shape, "bf16")
    free = cr.free_before_cache(card, resident)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, card.total_bytes))
    plan = cr.GPU_PROFILE
    engine = build.cache_rows(
        _Loaded(shape),
        plan.positions,
        plan.wanted,
        torch.device("cuda"),
        reserved=plan.prefix_entries * plan.prefix_tokens,
    )
    assert cr.kv_slots(card, shape, resident) == engine


def test_a_24_gb_card_holds_21_rows_of_the_7b_and_an_h100_all_256() -> None:
    bf16 = cr.weight_bytes(SEVEN_B, "bf16")
    assert cr.kv_slots(cr.A10, SEVEN_B, bf16) == cr.kv_slots(cr.L4, SEVEN_B, bf16) == 21
    assert cr.kv_slots(cr.H100, SEVEN_B, bf16) == 256
    fewer = cr.MemoryPlan(prefix_entries=16)
    assert cr.kv_slots(cr.A10, SEVEN_B, bf16, fewer) == 29  # each 8 entries: 2.1 GB, ~1 row


@pytest.mark.parametrize(
    ("card", "refused"), [(cr.A10, True), (cr.L4, False), (cr.H100, False)], ids=str
)
def test_fp8_is_refused_where_the_loader_refuses_it(
    card: cr.Card, refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: card.capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card.name)
    assert (cr.runs_on(card, "fp8+head") is not None) == refused
    assert cr.runs_on(card, "int4+head") is None
    if refused:
        with pytest.raises(ConfigurationError, match=r"compute capability 8\.9"):
            loading._fp8(torch.device("cuda"))
    else:
        assert loading._fp8(torch.device("cuda")) is Quantization.FP8


def test_the_roofline_reads_weights_and_live_cache_or_computes() -> None:
    mix = cr.Mix(prompt=26.0, output=16.0)
    step = cr.roofline_step(cr.L4, SEVEN_B, "bf16", 10, mix)
    kv = 10 * (26 + 8) * 128 * 1024
    assert step.memory_s == pytest.approx((15_009_136_640 + kv) / 300e9)
    assert step.compute_s == pytest.approx(10 * (1 + 26 / 16) * 15_008_587_776 / 121e12)
    assert step.seconds == step.memory_s  # ten rows of the 7B on an L4: bandwidth bound
    fp8 = cr.roofline_step(cr.L4, SEVEN_B, "fp8+head", 400, mix)
    assert fp8.compute_s == pytest.approx(400 * (1 + 26 / 16) * 15_008_587_776 / 242e12)
    assert cr.roofline_requests(cr.L4, SEVEN_B, "bf16", 10, mix) == 10 / (16 * step.seconds)
    assert cr.interpolate({1: 1.0, 65: 3.0}, 33) == 2.0
    assert cr.interpolate({1: 1.0, 65: 3.0}, 200) == 3.0


def test_the_calibration_gives_back_the_h100_s_measurements() -> None:
    mix = size_24gb.load_mix()
    calibrations = size_24gb.load_calibrations(mix)
    for form, cal in calibrations.items():
        for point in (cal.memory, cal.compute):
            got, _ = size_24gb.expected_requests(
                cr.H100, SEVEN_B, form, point.rows, mix, calibrations
            )
            assert got == pytest.approx(point.measured, rel=1e-9)
        assert 0 < cal.compute_share < 1 and 0 < cal.memory_share < 1


def test_the_program_writes_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = size_24gb.run(tmp_path)
    assert len(rows) == 2 * 2 * len(cr.FORMS)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(rows))
    a10_fp8 = [r for r in rows if r["card"] == "NVIDIA A10" and r["form"].startswith("fp8")]
    assert a10_fp8 and all(r["today"] is None and r["runs"] != "yes" for r in a10_fp8)
    l4 = {(r["model"], r["form"]): r for r in rows if r["card"] == "NVIDIA L4"}
    # FP8's bytes halve the 7B's step on an L4 once its slots are sized after quantizing
    assert l4["7B", "fp8+head"]["after"]["requests_per_s"] > (
        2 * l4["7B", "bf16"]["after"]["requests_per_s"]
    )
    assert "| L4 | 1.8B | fp8+head |" in (tmp_path / "results.md").read_text()
    assert "Sizing on paper" in capsys.readouterr().out
