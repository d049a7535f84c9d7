"""Sampling must sample: the token frequencies of ``sample_next`` over many draws against the
distribution that transformers' own logits processors give for the same settings (CPU).

Each statistical check draws 5,000-20,000 tokens in one call (a batch of identical rows)
under a fixed torch seed, so it is deterministic. Its bounds would hold for any seed but with
probability about 1e-6: a chi-square goodness-of-fit p-value above 1e-6, a total variation
distance under a bound that sampling noise exceeds with probability below 1e-6 (0.02-0.07
here, by draw count), and no token outside the top-k / top-p support. A sampler that stays
greedy, or ignores temperature, top-k, top-p or the repetition penalty, misses them by orders
of magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pytest
import torch
from torch import Tensor
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hymt_serve.core.types import GenerationRow, SamplingParams
from hymt_serve.engine.scheduler.sampling import (
    RowSampling,
    SlotSampling,
    greedy_tokens,
    record_tokens,
    sample_next,
)

CPU = torch.device("cpu")
# One step's logits over a small vocabulary: distinct values (no argmax or top-k ties), both
# signs (the repetition penalty divides positive logits and multiplies negative ones).
LOGITS = torch.tensor(
    [
        -1.69, -1.73, -0.38, -0.65, 1.27, 1.04, -0.47, -3.17, 0.48, -1.90, 0.52,
        0.46, 0.18, 1.86, 1.68, -0.37, -2.03, -2.54, 0.85, 1.19, 0.90, -2.33,
        -0.51, 2.78, 1.13, -0.88, -0.26, 0.28, 2.08, 2.38, 1.42, -1.27,
    ]
)  # fmt: skip
VOCAB = LOGITS.numel()
ARGMAX = int(LOGITS.argmax())  # 23
# Prompt tokens: the top logit (23), two other high ones and three negative ones.
PROMPT = (23, 28, 13, 2, 7, 25)
OTHER_PROMPT = (29, 14, 0, 9)
DRAWS = 20_000
MIN_P_VALUE = 1e-6


def knobs(temperature: float, top_k: int, top_p: float, penalty: float = 1.0) -> SamplingParams:
    """SamplingParams by keyword (its field order is temperature, top_p, top_k, penalty)."""
    return SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=penalty
    )


CARD = SamplingParams()  # the model card's temperature 0.7, top_k 20, top_p 0.6, penalty 1.05
CASES = {
    "model_card": (CARD, PROMPT),
    "model_card_no_penalty": (knobs(0.7, 20, 0.6), ()),
    "hot_full_vocab": (knobs(1.5, 0, 1.0), ()),
    "cold_full_vocab": (knobs(0.5, 0, 1.0), ()),
    "top_k_binds": (knobs(1.0, 5, 1.0), ()),
    "top_p_binds": (knobs(1.0, 0, 0.8), ()),
    "penalty": (knobs(1.0, 0, 1.0, penalty=1.8), PROMPT),
    "penalty_then_truncation": (knobs(0.8, 10, 0.9, penalty=1.5), PROMPT),
}


@pytest.fixture(autouse=True)
def seeded() -> Iterator[None]:
    """A fixed seed for the draws, without changing the RNG state other tests see."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


def reference(params: SamplingParams, context: Sequence[int]) -> Tensor:
    """The next-token distribution transformers' ``generate`` samples from for one row whose
    prompt plus generated tokens are ``context``: the processors it builds for these settings
    (``GenerationMixin._get_logits_processor``), in its order, then softmax. float64 ``[V]``."""
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=params.repetition_penalty))
    if params.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k != 0:
        processors.append(TopKLogitsWarper(top_k=params.top_k))
    if params.top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=params.top_p))
    input_ids = torch.tensor([list(context)], dtype=torch.int64).reshape(1, len(context))
    scores = processors(input_ids, LOGITS.clone()[None, :])
    return scores[0].double().softmax(-1)


def rows_of(
    params: SamplingParams | None, prompt: Sequence[int], count: int
) -> list[GenerationRow]:
    return [GenerationRow(tuple(prompt), 16, params)] * count


def draw(settings: RowSampling, index: Tensor) -> Tensor:
    """One ``sample_next`` step for batch positions holding rows ``index``, all with LOGITS."""
    logits = LOGITS.expand(index.numel(), VOCAB).contiguous()
    return sample_next(logits, settings.select(index), index)


def draw_rows(rows: Sequence[GenerationRow]) -> Tensor:
    index = torch.arange(len(rows))
    return draw(RowSampling.for_rows(rows, VOCAB, CPU), index)


def chi_square_p_value(counts: Tensor, expected: Tensor) -> float:
    """Pearson's goodness-of-fit test over the support of ``expected`` (probabilities); the
    least likely cells are pooled until the pool expects 5 draws, so the chi-square
    approximation holds."""
    support = expected > 0
    want = expected[support] * counts.sum()
    got = counts[support]
    order = want.argsort()
    want, got = want[order], got[order]
    pooled = want.cumsum(0) - want < 5
    want = torch.cat([want[~pooled], want[pooled].sum()[None]])
    got = torch.cat([got[~pooled], got[pooled].sum()[None]])
    statistic = float(((got - want) ** 2 / want).sum())
    dof = want.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(statistic / 2.0)))


def tvd_bound(expected: Tensor, n: int) -> float:
    """A total variation distance that n correct draws exceed with probability below 1e-6:
    its mean is at most sum(sqrt(p (1 - p) / n)) / 2 (Jensen), and one draw moves it by at most
    1 / n, so McDiarmid's inequality adds sqrt(ln(1e6) / 2n) (0.019 at 20,000 draws)."""
    spread = 0.5 * float((expected * (1 - expected) / n).sqrt().sum())
    return spread + math.sqrt(math.log(1 / MIN_P_VALUE) / (2 * n))


def assert_distribution(tokens: Tensor, expected: Tensor) -> None:
    """``tokens`` are independent draws from ``expected``: nothing outside its support, a
    chi-square test that does not reject at 1e-6, and a total variation distance within
    what sampling noise allows."""
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    outside = [t for t in range(VOCAB) if expected[t] == 0 and counts[t] > 0]
    assert not outside, f"tokens {outside} were filtered out but drawn"
    empirical = counts / counts.sum()
    tvd = 0.5 * float((empirical - expected).abs().sum())
    bound = tvd_bound(expected, tokens.numel())
    p_value = chi_square_p_value(counts, expected)
    detail = (
        f"TVD {tvd:.4f} (bound {bound:.4f}), chi-square p {p_value:.3g}\n"
        f"expected  {[round(x, 3) for x in expected.tolist()]}\n"
        f"empirical {[round(x, 3) for x in empirical.tolist()]}"
    )
    assert p_value > MIN_P_VALUE, detail
    assert tvd < bound, detail


@pytest.mark.parametrize("case", sorted(CASES))
def test_draws_follow_transformers_distribution(case: str) -> None:
    params, prompt = CASES[case]
    expected = reference(params, prompt)
    assert expected.max() < 0.9  # a real spread: a greedy sampler cannot pass by luck
    tokens = draw_rows(rows_of(params, prompt, DRAWS))
    assert_distribution(tokens, expected)


def test_cases_exercise_every_filter() -> None:
    """The cases above are built so each knob changes the distribution: top-k and top-p each
    cut the support, and the penalty moves the argmax (23 -> 29)."""
    support = {case: int((reference(*CASES[case]) > 0).sum()) for case in CASES}
    assert support["hot_full_vocab"] == support["cold_full_vocab"] == VOCAB
    assert support["top_k_binds"] == 5
    assert 1 < support["top_p_binds"] < VOCAB
    assert 1 < support["model_card_no_penalty"] < 20  # top_p 0.6 binds before top_k 20
    assert int(reference(*CASES["penalty"]).argmax()) == 29 != ARGMAX


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        (knobs(1.0, 3, 1.0), {23, 29, 28}),
        # Probabilities at temperature 1: 23 .198, 29 .133, 28 .098, 13 .079, 14 .066, 30 .051;
        # the mass before 14 is .509 < 0.55 and before 30 it is .575, so the nucleus ends at 14.
        (knobs(1.0, 0, 0.55), {23, 29, 28, 13, 14}),
        # Top-p acts on the top-k survivors renormalised: at temperature 2 the top 4 carry
        # .315, .259, .223, .203, so the mass before 13 is .797 > 0.6 (over the whole
        # vocabulary the 0.6 nucleus would hold 12 tokens).
        (knobs(2.0, 4, 0.6), {23, 29, 28}),
    ],
    ids=["top_k_3", "top_p_0.55", "top_k_4_then_top_p_0.6"],
)
def test_never_draws_outside_top_k_or_nucleus(params: SamplingParams, allowed: set[int]) -> None:
    """The kept set, worked out here from LOGITS without transformers: over 10,000 draws every
    kept token appears and no other token ever does."""
    kept = LOGITS.argsort(descending=True)[: params.top_k or VOCAB]
    probs = (LOGITS[kept] / params.temperature).softmax(-1)
    before = (probs.cumsum(0) - probs).tolist()
    nucleus = {t for t, mass in zip(kept.tolist(), before, strict=True) if mass < params.top_p}
    assert nucleus == allowed
    assert set((reference(params, ()) > 0).nonzero().flatten().tolist()) == allowed
    tokens = draw_rows(rows_of(params, (), 10_000))
    assert set(tokens.tolist()) == allowed


def test_flat_distribution_gives_many_distinct_tokens() -> None:
    """Near-flat logits: a batch of 2,000 rows and one row drawn 300 times in a row both see
    most of the vocabulary (a greedy sampler gives one token, a sampler that reuses its noise
    across rows or steps gives one per call or one overall)."""
    params = knobs(1.0, 0, 1.0)
    flat = LOGITS * 0.1
    rows = rows_of(params, (), 2_000)
    settings = RowSampling.for_rows(rows, VOCAB, CPU)
    index = torch.arange(len(rows))
    batch = sample_next(flat.expand(len(rows), VOCAB).contiguous(), settings.select(index), index)
    assert len(set(batch.tolist())) >= 30

    single = RowSampling.for_rows(rows[:1], VOCAB, CPU).select(torch.tensor([0]))
    steps = [int(sample_next(flat[None, :], single, torch.tensor([0]))) for _ in range(300)]
    assert len(set(steps)) >= 25


def test_mixed_batch_greedy_rows_take_argmax_sampled_rows_their_own_distribution() -> None:
    """Greedy rows (sampling=None), three kinds of sampled rows and the padding row, shuffled
    in one batch: greedy and padding positions always take the raw argmax (even with 23 in
    their prompt while other rows penalise it), each sampled kind follows its own settings
    and prompt (top-k 5 must hold although the batch keeps 32 candidates for the full-vocab
    kind)."""
    card = CARD
    hot_penalised = knobs(1.5, 0, 1.0, penalty=1.3)
    top_k_5 = knobs(1.2, 5, 1.0, penalty=1.5)
    kinds = [
        (None, PROMPT, 1_000),
        (card, PROMPT, 10_000),
        (hot_penalised, PROMPT, 10_000),
        (top_k_5, OTHER_PROMPT, 10_000),
    ]
    rows = [row for params, prompt, count in kinds for row in rows_of(params, prompt, count)]
    kind = torch.repeat_interleave(torch.arange(5), torch.tensor([c for *_, c in kinds] + [1]))
    index = torch.randperm(len(rows) + 1)  # the padding row (index len(rows), kind 4) included
    tokens = draw(RowSampling.for_rows(rows, VOCAB, CPU), index)
    by_kind = [tokens[kind[index] == k] for k in range(5)]

    assert by_kind[0].numel() == 1_000
    assert by_kind[0].eq(ARGMAX).all()
    assert by_kind[4].tolist() == [ARGMAX]
    for k, (params, prompt, _) in enumerate(kinds[1:], start=1):
        assert len(set(by_kind[k].tolist())) > 1
        assert_distribution(by_kind[k], reference(params, prompt))
    # The penalty acts before top-k: 29 and 14 drop, so the top 5 swap 14 for 30.
    top_5 = set((reference(top_k_5, OTHER_PROMPT) > 0).nonzero().flatten().tolist())
    assert top_5 == {23, 28, 13, 29, 30}


def test_penalty_covers_generated_tokens() -> None:
    """After ``record_tokens`` marks 29 as generated, the next draw penalises it as well as
    the prompt: transformers' penalty over prompt + generated ids."""
    params = knobs(1.0, 0, 1.0, penalty=1.8)
    rows = rows_of(params, PROMPT, 10_000)
    settings = RowSampling.for_rows(rows, VOCAB, CPU)
    index = torch.arange(len(rows))
    record_tokens(settings.select(index), index, torch.full((len(rows),), 29))
    expected = reference(params, (*PROMPT, 29))
    assert expected[29] < reference(params, PROMPT)[29] / 1.5  # the case is sensitive to it
    assert_distribution(draw(settings, index), expected)


def test_slot_sampling_keeps_settings_per_slot() -> None:
    """Continuous batching: slots assigned in an interleaved order draw from their own row's
    distribution, an unassigned slot stays greedy, and a reassigned slot forgets the previous
    row's prompt in its penalty mask."""
    per_kind = 5_000
    slots = SlotSampling(2 * per_kind + 1, VOCAB, CPU)
    card = knobs(0.7, 20, 0.6)
    penalised = knobs(1.0, 0, 1.0, penalty=1.8)
    even = list(range(0, 2 * per_kind, 2))
    odd = list(range(1, 2 * per_kind, 2))
    slots.assign(even, rows_of(card, PROMPT, per_kind))
    slots.assign(odd, rows_of(penalised, PROMPT, per_kind))
    order = torch.randperm(2 * per_kind + 1).tolist()  # the last slot is never assigned

    def step() -> dict[str, Tensor]:
        index = torch.tensor(order)
        logits = LOGITS.expand(index.numel(), VOCAB).contiguous()
        tokens = sample_next(logits, slots.batch(order, index), index)
        free = index == 2 * per_kind
        return {
            "even": tokens[(index % 2 == 0) & ~free],
            "odd": tokens[index % 2 == 1],
            "free": tokens[free],
        }

    first = step()
    assert first["free"].tolist() == [ARGMAX]
    assert_distribution(first["even"], reference(card, PROMPT))
    assert_distribution(first["odd"], reference(penalised, PROMPT))

    slots.assign(odd, rows_of(penalised, OTHER_PROMPT, per_kind))
    second = step()
    assert second["free"].tolist() == [ARGMAX]
    assert_distribution(second["even"], reference(card, PROMPT))
    assert_distribution(second["odd"], reference(penalised, OTHER_PROMPT))


def test_reference_matches_closed_forms() -> None:
    """Guards the reference itself against closed forms: softmax(logits / temperature) over
    the full vocabulary, and the penalty dividing a positive and multiplying a negative logit."""
    hot = reference(knobs(1.5, 0, 1.0), ())
    assert torch.allclose(hot, (LOGITS.double() / 1.5).softmax(-1), atol=1e-6)
    penalised = reference(knobs(1.0, 0, 1.0, penalty=2.0), (23, 2))
    manual = LOGITS.clone()
    manual[23] /= 2.0
    manual[2] *= 2.0
    assert torch.allclose(penalised, manual.double().softmax(-1), atol=1e-6)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 63, 64, 65])
@pytest.mark.parametrize("vocab", [512, 1000, 997, 128256])
def test_greedy_tokens_are_argmax_ties_included(rows: int, vocab: int) -> None:
    """The chunked argmax gives argmax's index, the first of tied maxima: logits drawn from a
    few integers tie often, within a chunk and across chunks (997 is prime: one chunk)."""
    generator = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randint(-3, 4, (rows, vocab), generator=generator).float()
    logits[0, vocab - 1] = 9.0  # the last position wins in one row
    assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
    spread = torch.randn(rows, vocab, generator=generator)
    assert torch.equal(greedy_tokens(spread), spread.argmax(-1))


def with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "seed": seed})


def test_seeded_draws_follow_the_distribution_too() -> None:
    """Rows with a seed draw their noise from a hash of seed, position and token id, not from
    torch's generator: over many seeds the tokens still follow transformers' distribution."""
    params = knobs(1.0, 0, 1.0)
    rows = [GenerationRow((), 16, with_seed(params, seed)) for seed in range(DRAWS)]
    assert_distribution(draw_rows(rows), reference(params, ()))
    later = RowSampling.for_rows(rows, VOCAB, CPU)
    index = torch.arange(DRAWS)
    logits = LOGITS.expand(DRAWS, VOCAB).contiguous()
    at_seven = sample_next(logits, later.select(index), index, torch.full((DRAWS,), 7))
    assert_distribution(at_seven, reference(params, ()))


def test_a_seed_decides_its_tokens_whatever_shares_the_batch() -> None:
    """The same seed and position give the same token alone, beside other rows (sampled and
    greedy, in another order) and after torch's generator moved on; another seed or another
    position gives other tokens."""
    card = knobs(1.0, 0, 1.0)
    mine = GenerationRow(PROMPT, 16, with_seed(card, 1234))

    def tokens_of(rows: list[GenerationRow], at: int, positions: list[int]) -> list[int]:
        settings = RowSampling.for_rows(rows, VOCAB, CPU)
        index = torch.arange(len(rows))
        logits = LOGITS.expand(len(rows), VOCAB).contiguous()
        tokens = sample_next(logits, settings.select(index), index, torch.tensor(positions))
        return [int(tokens[at])]

    steps = range(40)
    alone = [tokens_of([mine], 0, [p])[0] for p in steps]
    torch.manual_seed(99)
    crowd = [
        tokens_of([GenerationRow((), 16, card), GenerationRow((), 16), mine], 2, [5, 0, p])[0]
        for p in steps
    ]
    assert crowd == alone
    assert len(set(alone)) > 5  # each position draws anew
    other = GenerationRow(PROMPT, 16, with_seed(card, 1235))
    assert [tokens_of([other], 0, [p])[0] for p in steps] != alone


def test_slot_sampling_keeps_seeds_per_slot() -> None:
    """A reassigned slot takes its new row's seed; an unseeded row in a seeded batch still
    draws from torch's generator."""
    card = knobs(1.0, 0, 1.0)
    slots = SlotSampling(3, VOCAB, CPU)
    slots.assign([0, 1], [GenerationRow((), 8, with_seed(card, 7)), GenerationRow((), 8, card)])
    index = torch.tensor([0, 1, 2])
    logits = LOGITS.expand(3, VOCAB).contiguous()

    def step(position: int) -> list[int]:
        batch = slots.batch([0, 1], index)
        return sample_next(logits, batch, index, torch.full((3,), position)).tolist()

    first = [step(p) for p in range(30)]
    assert all(tokens[2] == ARGMAX for tokens in first)  # never assigned: greedy
    assert len({tokens[1] for tokens in first}) > 5
    slots.assign([1], [GenerationRow((), 8, with_seed(card, 7))])
    again = [step(p) for p in range(30)]
    assert [t[1] for t in again] == [t[0] for t in again] == [t[0] for t in first]
