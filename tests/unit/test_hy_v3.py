"""The fast engine's ``hy_v3`` (Hy-MT2-30B-A3B's mixture of experts) against transformers'
``HYV3ForCausalLM``, on a tiny random model of the same form (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import generate, teacher_forced_logits
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from hymt_serve.core.types import GenerationRow
from hymt_serve.engine.kernels.experts import grouped_experts, route, with_shared
from hymt_serve.engine.models.hy_v3_weights import MoeLayerWeights, MoeShape
from hymt_serve.engine.models.weights import LayerWeights
from hymt_serve.engine.runners.build import UnsupportedModelError, build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner

PROMPTS = ((1, 17, 250, 33, 91, 402, 5), (1, 300, 12), (1, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53))
MAX_NEW = (20, 6, 13)


def tiny_config(**overrides: object) -> object:
    values: dict[str, object] = dict(
        num_hidden_layers=3, hidden_size=64, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=512,
        rms_norm_eps=1e-5, num_experts=8, num_experts_per_tok=3, num_shared_experts=1,
        moe_intermediate_size=32, router_scaling_factor=2.826,
        rope_parameters={"rope_type": "default", "rope_theta": 11_158_840.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip
    values.update(overrides)
    return AutoConfig.for_model(model_type="hy_v3", **values)


def tiny_model(**overrides: object) -> PreTrainedModel:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(**overrides), dtype=torch.float32)
    # Larger weights than the default init make the logits decisive (no argmax ties), and a
    # random expert bias makes choosing by score plus bias differ from choosing by score.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.15)
        for layer in model.model.layers[1:]:
            layer.mlp.e_score_correction_bias.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_model()


@pytest.fixture(scope="module")
def fast(model: PreTrainedModel) -> FastRunner:
    return build_fast_runner(model, max_batch_size=4, max_seq_len=64)


def hf_generate(model: PreTrainedModel, prompt: tuple[int, ...], new: int) -> list[int]:
    config = GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
        pad_token_id=0, bos_token_id=1,
    )  # fmt: skip
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return list(out[0, len(prompt) :].tolist())


def test_the_shape_and_layers_follow_the_config(fast: FastRunner) -> None:
    shape = fast.shape
    assert isinstance(shape, MoeShape)
    assert (shape.experts, shape.top_k, shape.sparse) == (8, 3, (False, True, True))
    assert shape.shared_stacked
    dense, *mixtures = fast.weights.layers
    assert isinstance(dense, LayerWeights)
    assert all(isinstance(lw, MoeLayerWeights) for lw in mixtures)
    # eight routed experts and the shared one, stacked; gate and up rows of width 32
    assert mixtures[0].experts_gate_up.shape == (9, 64, 64)
    assert mixtures[0].experts_down.shape == (9, 64, 32)
    assert mixtures[0].router.dtype == torch.float32


def test_prefill_and_decode_logits_match_hf(model: PreTrainedModel, fast: FastRunner) -> None:
    prompts = PROMPTS[:2]
    forced = torch.tensor([[5, 77, 301, 9], [400, 2, 18, 18]])
    ours = teacher_forced_logits(fast, prompts, forced)
    for i, prompt in enumerate(prompts):
        full = torch.tensor([list(prompt) + forced[i].tolist()])
        with torch.no_grad():
            theirs = model(full).logits[0, len(prompt) - 1 :].float()
        torch.testing.assert_close(ours[i], theirs, atol=1e-4, rtol=1e-4)


def test_greedy_tokens_equal_hf_generate(model: PreTrainedModel, fast: FastRunner) -> None:
    rows = [GenerationRow(p, n) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    results = generate(fast, rows, stop_token_ids=())
    for (tokens, reason), prompt, new in zip(results, PROMPTS, MAX_NEW, strict=True):
        assert tokens == hf_generate(model, prompt, new)
        assert reason == "length"


def test_a_shared_expert_of_another_width_runs_beside_the_stack() -> None:
    model = tiny_model(num_shared_experts=2)
    fast = build_fast_runner(model, max_batch_size=2, max_seq_len=32)
    assert not fast.shape.shared_stacked  # type: ignore[attr-defined]
    assert fast.weights.layers[1].experts_gate_up.shape[0] == 8  # type: ignore[union-attr]
    prompt = PROMPTS[0]
    results = generate(fast, [GenerationRow(prompt, 8)], stop_token_ids=())
    assert results[0][0] == hf_generate(model, prompt, 8)


def test_grouped_experts_equal_each_expert_alone() -> None:
    torch.manual_seed(1)
    tokens, hidden, width, experts, k = 11, 16, 8, 5, 2
    x = torch.randn(tokens, hidden)
    gate_up = torch.randn(experts, 2 * width, hidden)
    down = torch.randn(experts, hidden, width)
    chosen, weights = route(x, torch.randn(experts, hidden), torch.randn(experts), k, 2.0)
    chosen, weights = with_shared(chosen, weights, experts - 1)
    expected = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for e, w in zip(chosen[t].tolist(), weights[t].tolist(), strict=True):
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            expected[t] += w * (down[e] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(
        grouped_experts(x, chosen, weights, gate_up, down), expected, atol=1e-4, rtol=1e-4
    )
    assert torch.allclose(weights[:, :k].sum(-1), torch.tensor(2.0))


def test_routing_chooses_by_biased_score_and_weighs_by_score() -> None:
    x = torch.eye(4)
    router = torch.eye(4) * 3.0  # token t scores highest on expert t
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])  # expert 3 always chosen
    chosen, weights = route(x, router, bias, top_k=2, scale=1.0)
    for t in range(3):
        assert set(chosen[t].tolist()) == {t, 3}
        scores = torch.sigmoid(torch.tensor([3.0, 0.0]))
        order = chosen[t].tolist().index(t)
        assert weights[t, order] == pytest.approx(float(scores[0] / scores.sum()))


def test_quantized_hy_v3_is_refused_with_its_reason(model: PreTrainedModel) -> None:
    with pytest.raises(UnsupportedModelError, match="hy_v3"):
        build_fast_runner(tiny_model(), max_batch_size=2, max_seq_len=32, quantize="int8")


def test_a_config_whose_dense_layers_disagree_is_refused() -> None:
    """first_k_dense_replace (the published config's key) must agree with the layers
    transformers built from mlp_layer_types."""
    build_fast_runner(tiny_model(first_k_dense_replace=1), max_batch_size=2, max_seq_len=32)
    with pytest.raises(UnsupportedModelError, match="first_k_dense_replace"):
        build_fast_runner(tiny_model(first_k_dense_replace=2), max_batch_size=2, max_seq_len=32)


def test_the_head_runs_in_fp32_when_the_config_asks() -> None:
    """enable_lm_head_fp32 (the published config's key): logits of a bf16 model are no
    longer bf16 values, and match the bf16 model's final hidden state times the fp32 head."""
    plain = build_fast_runner(tiny_model().to(torch.bfloat16), max_batch_size=2, max_seq_len=32)
    model = tiny_model(enable_lm_head_fp32=True).to(torch.bfloat16)
    head = model.lm_head.weight.detach().float().clone()
    forced = torch.tensor([[5, 77]])
    with torch.no_grad():
        hidden = model.model(torch.tensor([[*PROMPTS[1], 5, 77]])).last_hidden_state[0]
    fp32 = build_fast_runner(model, max_batch_size=2, max_seq_len=32)
    assert fp32.weights.lm_head.dtype == torch.float32
    ours = teacher_forced_logits(fp32, PROMPTS[1:2], forced)[0]
    bf16 = teacher_forced_logits(plain, PROMPTS[1:2], forced)[0]
    assert torch.equal(bf16, bf16.bfloat16().float())  # a bf16 head rounds its logits
    assert not torch.equal(ours, ours.bfloat16().float())
    expected = hidden[len(PROMPTS[1]) - 1 :].float() @ head.T
    torch.testing.assert_close(ours, expected, atol=0.05, rtol=0.02)
