"""The fast engine against transformers' own model, on a tiny random hunyuan_v1_dense (CPU)."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import generate, scheduler_for, teacher_forced_logits
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from hymt_serve.core.errors import ContextTooLong, RowRejected
from hymt_serve.core.types import GenerationRow, SamplingParams
from hymt_serve.engine.models import hunyuan_v1_dense as step
from hymt_serve.engine.models import hunyuan_v1_dense_weights
from hymt_serve.engine.models.decoder import SPLIT_SUMS_READ
from hymt_serve.engine.models.hunyuan_v1_dense_weights import norms_fit_fp16
from hymt_serve.engine.models.weights import ModelShape
from hymt_serve.engine.runners.build import UnsupportedModelError, build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.runners.inputs import max_blocks, packed_layout, prompt_blocks
from hymt_serve.engine.runners.prefill import PREFILL_TOKENS

PROMPTS = ((1, 17, 250, 33, 91, 402, 5), (1, 300, 12), (1, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53))
MAX_NEW = (20, 6, 13)


def tiny_config(**overrides: object) -> object:
    values: dict[str, object] = dict(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=512,
        rms_norm_eps=1e-5, use_qk_norm=True, rope_theta=10000.0,
        rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
    )  # fmt: skip
    values.update(overrides)
    return AutoConfig.for_model(model_type="hunyuan_v1_dense", **values)


def tiny_model(**overrides: object) -> PreTrainedModel:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(**overrides), dtype=torch.float32)
    # Larger weights than the default init make the logits decisive, so argmax ties cannot occur.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.15)
    return model.eval()


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_model()


@pytest.fixture(scope="module")
def fast(model: PreTrainedModel) -> FastRunner:
    return build_fast_runner(model, max_batch_size=4, max_seq_len=64)


def hf_generate(
    model: PreTrainedModel, prompt: tuple[int, ...], new: int, penalty: float = 1.0
) -> list[int]:
    config = GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, repetition_penalty=penalty,
        eos_token_id=None, pad_token_id=0, bos_token_id=1,
    )  # fmt: skip
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return list(out[0, len(prompt) :].tolist())


def greedy_rows() -> list[GenerationRow]:
    return [GenerationRow(p, n) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]


def test_greedy_tokens_equal_hf_generate(model: PreTrainedModel, fast: FastRunner) -> None:
    results = generate(fast, greedy_rows(), stop_token_ids=())
    for (tokens, reason), prompt, new in zip(results, PROMPTS, MAX_NEW, strict=True):
        assert tokens == hf_generate(model, prompt, new)
        assert reason == "length"


def test_prefill_and_decode_logits_match_hf(model: PreTrainedModel, fast: FastRunner) -> None:
    prompts = PROMPTS[:2]
    forced = torch.tensor([[5, 77, 301, 9], [400, 2, 18, 18]])
    ours = teacher_forced_logits(fast, prompts, forced)
    for i, prompt in enumerate(prompts):
        full = torch.tensor([list(prompt) + forced[i].tolist()])
        with torch.no_grad():
            theirs = model(full).logits[0, len(prompt) - 1 :].float()
        torch.testing.assert_close(ours[i], theirs, atol=1e-4, rtol=1e-4)


def test_stops_at_stop_token(model: PreTrainedModel, fast: FastRunner) -> None:
    reference = hf_generate(model, PROMPTS[0], MAX_NEW[0])
    stop = reference[3]
    cut = reference.index(stop)
    rows = [GenerationRow(PROMPTS[0], MAX_NEW[0]), GenerationRow(PROMPTS[1], MAX_NEW[1])]
    (tokens, reason), (other, other_reason) = generate(fast, rows, stop_token_ids={stop, 511})
    assert (tokens, reason) == (reference[:cut], "stop")
    expected = hf_generate(model, PROMPTS[1], MAX_NEW[1])
    if stop in expected:
        assert (other, other_reason) == (expected[: expected.index(stop)], "stop")
    else:
        assert (other, other_reason) == (expected, "length")


def test_greedy_batches_record_in_the_step_and_sampled_ones_do_not(fast: FastRunner) -> None:
    """A batch of greedy rows takes the runner's recorded steps; one sampled row (top_k 1, so
    still greedy in effect) sends the batch through the plain step and sampling: same tokens."""
    recorded = scheduler_for(fast)
    futures = [recorded.submit(row) for row in greedy_rows()]
    recorded.run(futures)
    stats = recorded.stats
    assert stats["recorded_steps"] > 0
    assert stats["recorded_steps"] == stats["steps"] - stats["mixed_steps"]
    # The longest row, so that every decode step has it.
    one_sampled = [
        GenerationRow(PROMPTS[0], MAX_NEW[0], SamplingParams(top_k=1, repetition_penalty=1.0))
    ]
    one_sampled += greedy_rows()[1:]
    plain = scheduler_for(fast)
    others = [plain.submit(row) for row in one_sampled]
    plain.run(others)
    assert plain.stats["recorded_steps"] == 0 and plain.stats["steps"] > 0
    assert [f.result().token_ids for f in futures] == [f.result().token_ids for f in others]


def test_batches_larger_than_max_batch_size_are_split(model: PreTrainedModel) -> None:
    small = build_fast_runner(tiny_model(), max_batch_size=2, max_seq_len=64)
    results = generate(small, greedy_rows(), stop_token_ids=())
    assert [tokens for tokens, _ in results] == [
        hf_generate(model, p, n) for p, n in zip(PROMPTS, MAX_NEW, strict=True)
    ]


def test_packed_layout_pads_tokens_and_rows() -> None:
    layout = packed_layout([(5, 6, 7), (8,)], [2, 0], tokens=6, rows=3, scratch_slot=9)
    assert layout == [
        5, 6, 7, 8, 0, 0,  # ids
        0, 1, 2, 0, 0, 0,  # positions
        2, 2, 2, 0, 9, 9,  # cache slots (padding: the scratch slot)
        0, 0, 0, 1, -1, -1,  # which prompt
        2, 2, 2, 0, 9, 9,  # the keys' slots: each prompt's own positions
        0, 1, 2, 0, 0, 0,  # the keys' positions
        0, 0, 0, 1, -1, -1,  # which prompt attends to each key
        2, 3, 0,  # last token of each prompt
        0, 3, 4, 0,  # blocks for the prompt attention kernel: first packed index,
        3, 1, 2, 0,  # token count (the padding's block last, then one unused),
        2, 0, 9, 9,  # slot,
        2, 0, 0, 0,  # and the position of its last token
    ]  # fmt: skip
    with pytest.raises(ValueError, match="exceed"):
        packed_layout([(5, 6, 7), (8,)], [2, 0], tokens=3, rows=3, scratch_slot=9)


def test_prompt_blocks_split_at_the_block_size_and_between_prompts() -> None:
    # a 20-token chunk from position 4 of slot 3, a 2-token prompt in slot 1, 3 padding tokens
    blocks = prompt_blocks([(0, 20, 3, 4), (20, 2, 1, 0)], tokens=25, rows=2, scratch=7)
    assert max_blocks(25, 2) == 4
    assert blocks == [
        0, 16, 20, 22,  # first packed index
        16, 4, 2, 3,  # tokens
        3, 3, 1, 7,  # slot (the padding's: the scratch slot)
        19, 23, 1, 0,  # position of the last token
    ]  # fmt: skip


def test_a_reused_prefix_is_not_packed_but_still_attended_to() -> None:
    prompts, slots = [(5, 6, 7, 4), (8, 1)], [2, 0]
    layout = packed_layout(prompts, slots, tokens=5, rows=2, scratch_slot=9, starts=[2, 0], keys=7)
    assert layout == [
        7, 4, 8, 1, 0,  # ids: the first prompt's 2 reused tokens are not packed
        2, 3, 0, 1, 0,  # positions
        2, 2, 0, 0, 9,  # cache slots
        0, 0, 1, 1, -1,  # which prompt
        2, 2, 2, 2, 0, 0, 9,  # the keys' slots: the reused positions too
        0, 1, 2, 3, 0, 1, 0,  # the keys' positions
        0, 0, 0, 0, 1, 1, -1,  # which prompt attends to each key
        1, 3,  # last token of each prompt
        0, 2, 4,  # blocks: first packed index,
        2, 2, 1,  # tokens,
        2, 0, 9,  # slot,
        3, 1, 0,  # last position (the first prompt's block starts after its kept prefix)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="exceed"):  # padding queries need a padding key
        packed_layout(prompts, slots, tokens=5, rows=2, scratch_slot=9, starts=[2, 0], keys=6)


def test_prefills_past_the_token_budget_run_in_groups(model: PreTrainedModel) -> None:
    """More prompt tokens than one prefill takes (PREFILL_TOKENS): split into groups, same
    logits as prefilling each prompt alone."""
    wide = build_fast_runner(model, max_batch_size=24, max_seq_len=64)
    prompts = [tuple(range(1 + i, 61 + i)) for i in range(20)]
    assert sum(len(p) for p in prompts) > PREFILL_TOKENS
    with torch.inference_mode():
        together = wide.prefill(prompts, range(20))
        alone = torch.cat([wide.prefill([p], [i]) for i, p in enumerate(prompts)])
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)


def test_sampling_is_reproducible_with_a_seed(fast: FastRunner) -> None:
    rows = [
        GenerationRow(p, 12, SamplingParams(temperature=1.5, top_p=0.9, top_k=50)) for p in PROMPTS
    ]
    torch.manual_seed(123)
    first = generate(fast, rows, stop_token_ids=())
    torch.manual_seed(123)
    second = generate(fast, rows, stop_token_ids=())
    torch.manual_seed(7)
    third = generate(fast, rows, stop_token_ids=())
    assert first == second
    assert first != third
    assert all(len(tokens) == 12 for tokens, _ in first)


def test_top_k_one_and_tiny_top_p_are_greedy(fast: FastRunner) -> None:
    greedy = generate(fast, greedy_rows(), stop_token_ids=())
    for params in (
        SamplingParams(top_k=1, repetition_penalty=1.0),
        SamplingParams(top_k=0, top_p=1e-6, repetition_penalty=1.0),
    ):
        rows = [GenerationRow(p, n, params) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
        assert generate(fast, rows, stop_token_ids=()) == greedy


def test_repetition_penalty_matches_hf(model: PreTrainedModel, fast: FastRunner) -> None:
    params = SamplingParams(top_k=1, repetition_penalty=1.8)
    mixed = [GenerationRow(PROMPTS[0], 15, params), GenerationRow(PROMPTS[2], 15)]
    (penalised, _), (greedy, _) = generate(fast, mixed, stop_token_ids=())
    assert penalised == hf_generate(model, PROMPTS[0], 15, penalty=1.8)
    assert greedy == hf_generate(model, PROMPTS[2], 15)
    assert penalised != hf_generate(model, PROMPTS[0], 15)


def test_rows_that_do_not_fit_are_rejected(fast: FastRunner) -> None:
    with pytest.raises(ContextTooLong, match="prompt \\+ max_new_tokens is 67"):
        generate(fast, [GenerationRow(PROMPTS[0], 60)], stop_token_ids=())
    with pytest.raises(RowRejected, match="prompt"):
        generate(fast, [GenerationRow((), 4)], stop_token_ids=())


def test_a_row_may_use_the_whole_context() -> None:
    """prompt + max_new_tokens equal to max_seq_len and to max_position_embeddings fits: the
    last token is never fed back (it used to be refused with a ValueError, a 500)."""
    positions = 40
    model = tiny_model(max_position_embeddings=positions)
    whole = build_fast_runner(model, max_batch_size=2, max_seq_len=positions)
    row = GenerationRow(PROMPTS[1], positions - len(PROMPTS[1]))
    [(tokens, reason)] = generate(whole, [row])
    assert (tokens, reason) == (hf_generate(model, row.prompt_ids, row.max_new_tokens), "length")
    with pytest.raises(ContextTooLong):
        generate(whole, [GenerationRow(PROMPTS[1], row.max_new_tokens + 1)])


@pytest.mark.parametrize(
    "overrides", [{"hidden_act": "gelu"}, {"rope_scaling": {"type": "linear", "factor": 2.0}}]
)
def test_unsupported_configs_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(UnsupportedModelError):
        build_fast_runner(tiny_model(**overrides), max_batch_size=2, max_seq_len=32)


def test_other_architectures_are_refused() -> None:
    config = AutoConfig.for_model(
        model_type="llama", num_hidden_layers=1, hidden_size=32, intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
    )  # fmt: skip
    llama = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedModelError, match="model_type"):
        build_fast_runner(llama, max_batch_size=2, max_seq_len=32)


def test_describe_on_cpu(fast: FastRunner) -> None:
    info = fast.describe()
    assert info["cuda_graphs"] is False
    assert info["attention_kernel"] == "torch_reference"
    assert info["prompt_attention_kernel"] == "gathered_sdpa"
    assert info["buckets"] == [1, 2, 4]
    assert info["norms_fit_fp16"] is True


def test_odd_vocabulary_is_padded_without_changing_tokens() -> None:
    model = tiny_model(vocab_size=509)
    expected = [hf_generate(model, p, n) for p, n in zip(PROMPTS, MAX_NEW, strict=True)]
    fast = build_fast_runner(model, max_batch_size=4, max_seq_len=64)
    assert model.lm_head.weight.shape[0] == 509
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert [tokens for tokens, _ in generate(fast, greedy_rows(), stop_token_ids=())] == expected
    assert [hf_generate(model, p, n) for p, n in zip(PROMPTS, MAX_NEW, strict=True)] == expected


def test_the_step_functions_compile_reading_split_sums_in_the_next_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every step function compiles with inductor's unroll_reductions_threshold above 16, so a
    weight-only product's sum over 8 splits (int8's one row of a 7B's attention output and
    down projection) or 16 (int4's one row of its gate_up) runs inside the next kernel, not as
    a kernel of its own."""
    seen = []
    real = torch.compile

    def spy(fn, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("options"))
        return real(fn, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    shape = ModelShape(layers=2, heads=4, kv_heads=2, head_dim=8, eps=1e-5, vocab=32)
    step.make_step_functions(shape, compile_=True)
    assert len(seen) == 3, seen
    assert all(o == {"unroll_reductions_threshold": SPLIT_SUMS_READ} for o in seen), seen
    assert SPLIT_SUMS_READ > 16


def test_a_norm_output_stays_within_sqrt_hidden_times_its_largest_weight() -> None:
    """The bound behind ModelShape.norms_fit_fp16: RMSNorm's normalised input has no element
    above sqrt(hidden) in size; an input with one nonzero element reaches it."""
    hidden = 64
    weight = torch.linspace(-3.0, 2.0, hidden)
    bound = hidden**0.5 * 3.0
    one_hot = torch.zeros(1, hidden)
    one_hot[0, 0] = 1e4  # the element under weight -3
    assert step.rms_norm(one_hot, weight, 1e-5).abs().max() == pytest.approx(bound, rel=1e-4)
    torch.manual_seed(0)
    spiky = torch.randn(256, hidden) * torch.rand(256, hidden) ** 8 * 1e3
    assert step.rms_norm(spiky, weight, 1e-5).abs().max() <= bound


def test_norms_fit_fp16_from_the_largest_norm_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    assert norms_fit_fp16(model)  # norm weights of 1
    limit = torch.finfo(torch.float16).max / model.config.hidden_size**0.5
    norm = model.model.layers[1].post_attention_layernorm.weight
    with torch.no_grad():
        norm[5] = -limit  # the output could reach fp16's largest value: no headroom left
    assert not norms_fit_fp16(model)
    with torch.no_grad():
        norm[5] = 0.98 * limit
    assert norms_fit_fp16(model)
    with torch.no_grad():
        model.model.norm.weight[0] = 1.1 * limit  # the final norm feeds the LM head
    assert not norms_fit_fp16(model)
    monkeypatch.setattr(hunyuan_v1_dense_weights, "FP16_NORM_INPUTS", False)
    assert not norms_fit_fp16(tiny_model())
