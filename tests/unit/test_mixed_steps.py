"""Mixed steps: prompt chunks riding in the running batch's decode step (tiny random model,
CPU, fp32). A mixed pass gives the logits of a decode step and a separate prefill; prompts
split in chunks give a full prefill's; rows joining at every stage (while others decode,
part-way through another's prompt, on a kept prefix) get transformers' greedy tokens."""

from __future__ import annotations

import copy
from typing import ClassVar

import pytest
import torch
from runner_helpers import scheduler_for
from test_fast_engine import hf_generate, tiny_model
from torch import Tensor
from transformers import PreTrainedModel

from hymt_serve.core.errors import DeviceOutOfMemory
from hymt_serve.core.types import GenerationRow
from hymt_serve.engine.runners import prefill
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.runners.inputs import PackedPrompts
from hymt_serve.engine.runners.prefill import MIXED_BUCKETS
from hymt_serve.engine.scheduler.loop import Scheduler

RUNNING = ((1, 5, 9, 33, 2), (1, 7, 7, 7, 40, 41, 42))
JOINING = ((1, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69), (1, 3))
TEMPLATE = tuple(range(100, 112))  # 12 tokens that prompts of one template share


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_model()


def runner(model: PreTrainedModel, **options: object) -> FastRunner:
    built: FastRunner = build_fast_runner(
        copy.deepcopy(model),
        max_batch_size=6,
        max_seq_len=64,
        **options,  # type: ignore[arg-type]
    )
    return built


def start_batch(runner: FastRunner) -> None:
    """RUNNING in slots 0 and 1, decoding (their first tokens fed)."""
    runner.prefill(RUNNING, [0, 1])
    lengths = torch.tensor([len(p) for p in RUNNING])
    runner.add(torch.tensor([11, 12]), lengths, torch.tensor([0, 1]), 0)


@torch.inference_mode()
def test_a_mixed_pass_gives_the_decode_step_and_the_prefill(model: PreTrainedModel) -> None:
    mixing, plain = runner(model), runner(model)
    for each in (mixing, plain):
        start_batch(each)
    step, logits = mixing.mixed_step(JOINING, [2, 3], [0, 0], decode=True)
    assert step is not None and step.shape[0] == mixing.bucket
    torch.testing.assert_close(step[:2], plain.step()[:2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, plain.prefill(JOINING, [2, 3]), rtol=1e-5, atol=1e-5)
    # the next decode step of the running rows reads the K/V that the mixed pass wrote
    for each in (mixing, plain):
        each.advance(torch.tensor([13, 14])[: each.bucket])
    torch.testing.assert_close(mixing.step()[:2], plain.step()[:2], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_a_prompt_in_chunks_gives_the_full_prefills_logits(model: PreTrainedModel) -> None:
    mixing, plain = runner(model), runner(model)
    start_batch(mixing)
    prompt, done = JOINING[0], 0
    for end in (4, 9, len(prompt)):  # three chunks, each attending to the ones before
        _, logits = mixing.mixed_step([prompt[:end]], [4], [done], decode=True)
        done = end
    torch.testing.assert_close(logits, plain.prefill([prompt], [4]), rtol=1e-5, atol=1e-5)
    for layer in range(len(plain.caches[0])):
        torch.testing.assert_close(
            mixing.caches[0][layer][4, :, : len(prompt)],
            plain.caches[0][layer][4, :, : len(prompt)],
        )


class EmulatedMixedGraph:
    """A mixed "graph" on the CPU: the pass over the inputs buffer laid out as the captured
    graph's (its chunk bucket's tokens and keys, padding), into the shared logits."""

    replayed: ClassVar[list[tuple[int, int]]] = []

    def __init__(self, runner: FastRunner, bucket: int, chunk: int) -> None:
        self.runner, self.bucket, self.chunk = runner, bucket, chunk

    def replay(self) -> None:
        runner, chunk = self.runner, self.chunk
        self.replayed.append((self.bucket, chunk))
        rows, keys = runner._mixed_rows(chunk), dict(MIXED_BUCKETS)[chunk]
        inputs = PackedPrompts.view(runner.prefill_inputs, chunk, keys, rows)
        assert runner.mixed_logits is not None
        logits = runner._mixed_forward(self.bucket, inputs)
        runner.mixed_logits[: logits.shape[0]] = logits


@torch.inference_mode()
def test_the_padded_mixed_graph_layout_gives_the_exact_logits(
    model: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the mixed graphs' layout (the decode bucket's padding rows, padded chunk
    tokens and keys), including a chunk that attends to 40 positions before it."""
    monkeypatch.setattr(prefill, "pinned", lambda values, dtype: torch.tensor(values, dtype=dtype))
    graphed, eager = runner(model), runner(model)
    graphed.mixed_logits = torch.zeros(8 + 6, graphed.vocab)
    graphed.mixed_graphs = {  # type: ignore[assignment]
        (bucket, chunk): EmulatedMixedGraph(graphed, bucket, chunk)
        for bucket in graphed.buckets
        for chunk in (16, 32)
    }
    long = tuple(range(1, 61))
    for each in (graphed, eager):
        start_batch(each)
        each.prefill([long[:40]], [5])  # 40 positions in slot 5 already
    cases = (
        (JOINING, [2, 3], [0, 0]),  # 13 tokens and keys: the 16-token graph
        ([long], [5], [40]),  # 20 tokens, 60 keys: the 32-token graph (128 keys)
    )
    for prompts, slots, starts in cases:
        ours_step, ours = graphed.mixed_step(prompts, slots, starts, decode=True)
        assert ours_step is not None
        ours_step, ours = ours_step[:2].clone(), ours.clone()
        theirs_step, theirs = eager.mixed_step(prompts, slots, starts, decode=True)
        assert theirs_step is not None
        torch.testing.assert_close(ours_step, theirs_step[:2], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        for each in (graphed, eager):
            each.advance(torch.tensor([13, 14])[: each.bucket])
    assert EmulatedMixedGraph.replayed == [(2, 16), (2, 32)]


def stepped(scheduler: Scheduler, arrivals: dict[int, list[GenerationRow]]) -> list[list[int]]:
    """Step on this thread; at step k, submit ``arrivals[k]``. Tokens per row, in order."""
    futures = []
    with torch.inference_mode():
        for round_ in range(400):
            futures += [scheduler.submit(row) for row in arrivals.get(round_, [])]
            if not scheduler.step() and round_ > max(arrivals):
                break
    return [list(future.result(timeout=0).token_ids) for future in futures]


def test_rows_joining_at_every_stage_get_transformers_tokens(model: PreTrainedModel) -> None:
    """Five prompt tokens per mixed step: long prompts take several passes, and rows arrive
    while others decode, while another's prompt is part-way, and in a pass of their own;
    prompts on a template arrive after the template is kept."""
    mixing = runner(model, mixed_tokens=5, prefix_entries=2)
    scheduler = scheduler_for(mixing)
    on_template = [(*TEMPLATE, 70 + i, 80 + i) for i in range(5)]
    arrivals = {
        0: [GenerationRow(RUNNING[0], 12)],
        2: [GenerationRow(JOINING[0], 9), GenerationRow(RUNNING[1], 4)],
        3: [GenerationRow(JOINING[1], 6)],
        5: [GenerationRow(p, 5) for p in on_template[:3]],
        14: [GenerationRow(p, 7) for p in on_template[3:]],
        30: [GenerationRow(tuple(range(1, 40)), 3)],  # alone: one large pass, then decoding
    }
    rows = [row for _, due in sorted(arrivals.items()) for row in due]
    results = stepped(scheduler, arrivals)
    for tokens, row in zip(results, rows, strict=True):
        assert tokens == hf_generate(model, row.prompt_ids, row.max_new_tokens), row
    info = scheduler.describe()
    assert info["mixed_steps"] > 5 and info["prefill_tokens"] < sum(len(r.prompt_ids) for r in rows)
    assert mixing.describe()["prefix_hits"] > 0 and info["prefilling"] == 0


def test_a_long_prompt_does_not_stall_the_batch(model: PreTrainedModel) -> None:
    """While a long prompt prefills four tokens a pass, the running row decodes every pass."""
    scheduler = scheduler_for(runner(model, mixed_tokens=4))
    first = scheduler.submit(GenerationRow(RUNNING[0], 30))
    with torch.inference_mode():
        scheduler.step()
        scheduler.submit(GenerationRow(tuple(range(1, 30)), 2))
        before = dict(scheduler.stats)
        while scheduler.describe()["prefilling"] or scheduler.stats["prefill_rows"] < 2:
            scheduler.step()
        passes = scheduler.stats["prefills"] - before["prefills"]
        assert passes == 8  # 29 tokens, 4 a pass
        assert scheduler.stats["mixed_steps"] - before["mixed_steps"] == passes
        assert scheduler.stats["steps"] - before["steps"] == passes
        scheduler.run([first])
    assert list(first.result().token_ids) == hf_generate(model, RUNNING[0], 30)


def test_a_failing_mixed_pass_fails_its_new_rows_only(
    model: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    mixing = runner(model)
    scheduler = scheduler_for(mixing)
    real = mixing.mixed_step

    def failing_for_slot(
        prompts: list[tuple[int, ...]], slots: list[int], starts: list[int], *, decode: bool
    ) -> tuple[Tensor | None, Tensor]:
        if JOINING[0] in [tuple(p) for p in prompts]:
            raise torch.OutOfMemoryError("injected")
        return real(prompts, slots, starts, decode=decode)

    monkeypatch.setattr(mixing, "mixed_step", failing_for_slot)
    running = scheduler.submit(GenerationRow(RUNNING[0], 10))
    with torch.inference_mode():
        scheduler.step()
        doomed = scheduler.submit(GenerationRow(JOINING[0], 4))
        scheduler.step()
        later = scheduler.submit(GenerationRow(JOINING[1], 5))
        scheduler.run([running, later])
    with pytest.raises(DeviceOutOfMemory, match="ran out of memory for a batch of 1 texts"):
        doomed.result(timeout=0)
    assert list(running.result().token_ids) == hf_generate(model, RUNNING[0], 10)
    assert list(later.result().token_ids) == hf_generate(model, JOINING[1], 5)
    assert scheduler.describe()["prefilling"] == 0 and len(scheduler._free) == mixing.max_batch_size


@pytest.mark.parametrize(("keys", "rows", "per_pass"), [(25, 8, 2), (1000, 3, 3)])
def test_a_pass_beside_running_rows_keeps_to_the_runners_keys_and_rows(
    model: PreTrainedModel, keys: int, rows: int, per_pass: int
) -> None:
    """Beside running rows a pass takes chunks while their keys (each chunk's end) and their
    count stay within what the runner's graphs take; every row still gets its tokens."""
    mixing = runner(model)
    mixing.mixed_keys, mixing.mixed_rows = keys, rows
    scheduler = scheduler_for(mixing)
    running = scheduler.submit(GenerationRow(RUNNING[0], 20))
    with torch.inference_mode():
        scheduler.step()
        joining = [scheduler.submit(GenerationRow(JOINING[0], 3)) for _ in range(4)]
        scheduler.step()
        assert scheduler.stats["prefill_rows"] == 1 + per_pass
        scheduler.run([running, *joining])
    expected = hf_generate(model, JOINING[0], 3)
    assert [list(f.result().token_ids) for f in joining] == [expected] * 4


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
def test_packed_attention_equals_causal_attention_per_prompt(heads: int, kv_heads: int) -> None:
    """Two prompts packed end to end, keys padded past them: each query sees its own
    prompt's keys up to its position, with each key head shared by its group of query heads."""
    from hymt_serve.engine.models.decoder import packed_attention

    torch.manual_seed(0)
    lengths, dim, padded = (5, 3), 16, 11
    q = torch.randn(sum(lengths), heads, dim)
    k, v = torch.randn(2, padded, kv_heads, dim).unbind(0)
    sequence = torch.tensor([0] * lengths[0] + [1] * lengths[1])
    positions = torch.cat([torch.arange(n) for n in lengths])
    key_sequence = torch.tensor([0] * lengths[0] + [1] * lengths[1] + [-1] * 3)
    key_positions = torch.cat([positions, torch.zeros(3, dtype=torch.long)])
    mask = (sequence[:, None] == key_sequence[None]) & (key_positions[None] <= positions[:, None])
    got = packed_attention(q, k, v, mask)
    group = heads // kv_heads
    start = 0
    for n in lengths:
        qs, ks, vs = q[start : start + n], k[start : start + n], v[start : start + n]
        ks, vs = (t.repeat_interleave(group, dim=1).transpose(0, 1) for t in (ks, vs))
        want = torch.nn.functional.scaled_dot_product_attention(
            qs.transpose(0, 1), ks, vs, is_causal=True
        ).transpose(0, 1)
        torch.testing.assert_close(got[start : start + n], want, rtol=1e-5, atol=1e-5)
        start += n
