"""Shared prompt prefixes computed once (:mod:`hymt_serve.engine.runners.prefixes`): which prefixes
are kept, and that a prompt prefilled on a kept prefix gives the logits and the tokens of a
full prefill (tiny random model, CPU, fp32: equal to rounding)."""

from __future__ import annotations

import copy

import pytest
import torch
from runner_helpers import generate
from test_fast_engine import hf_generate, tiny_model
from torch import Tensor
from transformers import PreTrainedModel

from hymt_serve.core.types import GenerationRow
from hymt_serve.engine.runners import prefill
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.runners.inputs import PackedPrompts
from hymt_serve.engine.runners.prefixes import PrefixCache, common_length, copy_positions

TEMPLATE = (1, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19)  # 12 tokens every prompt starts with
OTHER = (1, 9, 10, 11, 12, 13, 14, 15, 30, 31, 32, 33, 34)  # shares 8 tokens with TEMPLATE


def prompt(template: tuple[int, ...], *source: int) -> tuple[int, ...]:
    return template + tuple(source)


def test_a_beginning_is_kept_once_three_prompts_share_it() -> None:
    cache = PrefixCache(entries=4, max_tokens=64)
    first, second, third = prompt(TEMPLATE, 40, 41), prompt(TEMPLATE, 50), prompt(TEMPLATE, 60)
    assert cache.lookup(first) == (0, -1) and cache.candidate(first, 0) == 0
    assert cache.candidate(second, 0) == 0  # two prompts may share a beginning by chance
    assert cache.candidate(third, 0) == len(TEMPLATE)
    entry = cache.keep(TEMPLATE)
    assert cache.lookup(prompt(TEMPLATE, 70, 71)) == (len(TEMPLATE), entry)
    assert cache.candidate(prompt(TEMPLATE, 70, 71), len(TEMPLATE)) == 0  # reused already
    assert cache.lookup(TEMPLATE) == (0, -1)  # at least one token is left to prefill
    assert cache.stats["hits"] == 1 and cache.stats["reused_tokens"] == len(TEMPLATE)


def test_the_beginning_shared_with_two_others_wins_over_a_chance_one() -> None:
    cache = PrefixCache(entries=4, max_tokens=64)
    for source in ((40, 41, 42), (40, 41, 43), (50,)):  # two share 14 tokens, all share 12
        cache.candidate(prompt(TEMPLATE, *source), 0)
    assert cache.candidate(prompt(TEMPLATE, 40, 41, 44), 0) == len(TEMPLATE) + 2
    assert cache.candidate(prompt(TEMPLATE, 60), 0) == len(TEMPLATE)


def test_kept_beginnings_are_cut_to_max_tokens_and_leave_a_token_to_prefill() -> None:
    cache = PrefixCache(entries=4, max_tokens=10)
    for source in (40, 50, 60):
        length = cache.candidate(prompt(TEMPLATE, source), 0)
    assert length == 10  # max_tokens
    repeated = PrefixCache(entries=4, max_tokens=64)
    for source in ((40, 41), (40, 41), (50,), (40, 41), (60,)):  # a repeat counts once
        length = repeated.candidate(prompt(TEMPLATE, *source), 0)
    assert length == len(TEMPLATE)  # not the repeated prompt's whole length
    alike = PrefixCache(entries=4, max_tokens=64)
    for source in ((40, 41), (40, 42), (40, 43)):  # three texts that start alike
        length = alike.candidate(prompt(TEMPLATE, *source), 0)
    assert length == len(TEMPLATE) + 1  # all but the last token, which is left to prefill
    unrelated = PrefixCache(entries=4, max_tokens=64, min_tokens=9)
    for tail in ((20, 21), (22, 23), (24, 25)):  # 8 tokens in common: under min_tokens
        length = unrelated.candidate((*TEMPLATE[:8], *tail), 0)
    assert length == 0


def test_the_least_recently_used_prefix_goes_first() -> None:
    cache = PrefixCache(entries=2, max_tokens=64)
    a, b, c = cache.keep(TEMPLATE), cache.keep(OTHER), None
    cache.lookup(prompt(TEMPLATE, 5))  # TEMPLATE used last: OTHER goes
    c = cache.keep((1, 2, 3, 4, 5, 6, 7, 8, 9))
    assert c == b and cache.stats["evicted"] == 1
    assert cache.lookup(prompt(OTHER, 5)) == (0, -1)
    assert cache.lookup(prompt(TEMPLATE, 5)) == (len(TEMPLATE), a)


def test_common_length() -> None:
    assert common_length((1, 2, 3), (1, 2, 4)) == 2
    assert common_length((1, 2), (1, 2, 3)) == 2
    assert common_length((), (1,)) == 0


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_model()


def runners(model: PreTrainedModel, entries: int) -> tuple[FastRunner, FastRunner]:
    sizes = {"max_batch_size": 8, "max_seq_len": 64}
    plain = build_fast_runner(copy.deepcopy(model), **sizes)
    return plain, build_fast_runner(copy.deepcopy(model), prefix_entries=entries, **sizes)


@torch.inference_mode()
def test_a_prefill_on_a_kept_prefix_gives_the_full_prefills_logits(model: PreTrainedModel) -> None:
    plain, reusing = runners(model, entries=2)
    warm = [prompt(TEMPLATE, 40, 41), prompt(TEMPLATE, 50, 51, 52), prompt(TEMPLATE, 60)]
    for index, warm_prompt in enumerate(warm):
        reusing.prefill([warm_prompt], [index])
    assert reusing.describe()["prefixes_kept_now"] == 1
    # one batch: a prompt on the kept prefix, one without any, one longer on it
    batch = [prompt(TEMPLATE, 70, 71, 72), (1, 200, 201, 202), prompt(TEMPLATE, *range(80, 95))]
    ours = reusing.prefill(batch, [3, 4, 5]).clone()
    theirs = plain.prefill(batch, [3, 4, 5]).clone()
    assert reusing.describe()["prefix_hits"] == 2
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    # the slots hold the same K/V (the copied prefix included), so decoding goes on alike
    for layer in range(len(plain.caches[0])):
        for part in (0, 1):
            torch.testing.assert_close(
                reusing.caches[part][layer][3:6, :, :30], plain.caches[part][layer][3:6, :, :30]
            )


def test_generation_with_prefixes_kept_equals_transformers(model: PreTrainedModel) -> None:
    """Rows in two templates through the scheduler, one entry only (the two evict each
    other): greedy tokens equal transformers' generate for every row."""
    _, reusing = runners(model, entries=1)
    rows = [
        GenerationRow(prompt(template, *source), 6)
        for source in ((40,), (41, 42), (43,), (44, 45, 46), (47,))
        for template in (TEMPLATE, OTHER)
    ]
    for row in rows[:6]:  # one at a time first, so later rows find their prefix kept
        generate(reusing, [row])
    results = generate(reusing, rows)
    info = reusing.describe()
    assert info["prefix_hits"] > 0 and info["prefix_evicted"] > 0, info
    for (tokens, _), row in zip(results, rows, strict=True):
        assert tokens == hf_generate(model, row.prompt_ids, row.max_new_tokens)


class EmulatedGraph:
    """A prefill "graph" on the CPU: replays the bucket's forward over the inputs buffer, as
    the captured graph does, so the padded bucket layout runs here too."""

    def __init__(self, runner: FastRunner, bucket: int) -> None:
        self.runner, self.bucket = runner, bucket

    def replay(self) -> None:
        runner, bucket = self.runner, self.bucket
        rows = runner._prefill_rows(bucket)
        inputs = PackedPrompts.view(runner.prefill_inputs, bucket, 2 * bucket, rows)
        assert runner.prefill_logits is not None
        runner.prefill_logits[:rows] = runner._mixed_forward(0, inputs)


@torch.inference_mode()
def test_the_padded_bucket_layout_gives_the_exact_prefills_logits(
    model: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the buckets' layout (padding tokens and keys, twice as many keys as tokens),
    including a prompt whose keys fill a bucket's key capacity while its tokens do not fill
    the bucket (it must go to the next bucket: its padding tokens need a padding key)."""
    # no page-locked memory on the CPU
    monkeypatch.setattr(prefill, "pinned", lambda values, dtype: torch.tensor(values, dtype=dtype))
    plain, reusing = runners(model, entries=2)
    reusing.prefill_logits = torch.zeros(reusing.max_batch_size, reusing.vocab)
    reusing.prefill_graphs = {b: EmulatedGraph(reusing, b) for b in (32, 64)}  # type: ignore[misc]
    template = tuple(range(1, 41))  # 40 tokens
    for slot, source in enumerate((100, 101, 102)):
        reusing.prefill([(*template, source)], [slot])
    assert reusing.describe()["prefixes_kept_now"] == 1
    batch = [(*template, *range(200, 224))]  # 64 keys, 24 tokens to compute
    ours = reusing.prefill(batch, [4]).clone()
    assert reusing.describe()["prefix_hits"] == 1
    torch.testing.assert_close(ours, plain.prefill(batch, [4]), rtol=1e-5, atol=1e-5)
    mixed = [(*template, 300, 301), (1, 5, 6, 7), (*template, *range(400, 410))]
    ours = reusing.prefill(mixed, [1, 2, 3]).clone()
    torch.testing.assert_close(ours, plain.prefill(mixed, [1, 2, 3]), rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_two_prefixes_kept_in_one_prefill_for_one_entry_leave_the_later(
    model: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One entry, and one prefill that keeps two prefixes: the second evicts the first, and
    the entry must hold the second's K/V (a prompt on it then gets the full prefill's logits).
    Two copies into one entry in one indexed copy would leave either on a GPU (the CPU keeps
    the last), so the copies are checked to go to distinct entries."""
    copies: list[list[tuple[int, int, int]]] = []

    def recorded(
        source: Tensor, target: Tensor, moves: list[tuple[int, int, int]], device: object
    ) -> None:
        copies.append(list(moves))
        copy_positions(source, target, moves, device)  # type: ignore[arg-type]

    monkeypatch.setattr(prefill, "copy_positions", recorded)
    plain, reusing = runners(model, entries=1)
    alone = tuple(range(100, 112))  # a template that shares no beginning with TEMPLATE
    for slot, source in enumerate((40, 41)):  # two prompts of each template seen
        reusing.prefill([prompt(TEMPLATE, source), prompt(alone, source)], [slot, slot + 2])
    reusing.prefill([prompt(TEMPLATE, 50), prompt(alone, 50)], [4, 5])  # both become kept
    info = reusing.describe()
    assert info["prefix_kept"] == 2 and info["prefix_evicted"] == 1, info
    assert all(len({move[1] for move in moves}) == len(moves) for moves in copies), copies
    later = [prompt(alone, 60, 61)]
    ours = reusing.prefill(later, [6]).clone()
    assert reusing.describe()["prefix_hits"] == 1
    torch.testing.assert_close(ours, plain.prefill(later, [6]), rtol=1e-5, atol=1e-5)
