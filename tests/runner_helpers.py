"""Offline generation over a runner through the production scheduler, and teacher-forced
logits for comparing a runner's forward with another implementation (tests and benchmarks)."""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hymt_serve.core.types import FinishReason, GenerationResult, GenerationRow
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.runners.protocol import Runner
from hymt_serve.engine.scheduler.loop import Scheduler


def token_result(tokens: list[int], finish: FinishReason) -> GenerationResult:
    return GenerationResult("", tuple(tokens), finish)


def scheduler_for(runner: Runner, stop_ids: Collection[int] = (), **options: object) -> Scheduler:
    width = getattr(runner, "max_seq_len", 512)
    return Scheduler(runner, stop_ids, token_result, max_seq_len=width, **options)  # type: ignore[arg-type]


def generate(
    runner: Runner, rows: Sequence[GenerationRow], stop_token_ids: Collection[int] = ()
) -> list[tuple[list[int], FinishReason]]:
    """Submit every row, step until done: (tokens without the stop token, reason) per row."""
    scheduler = scheduler_for(runner, stop_token_ids)
    futures = [scheduler.submit(row) for row in rows]
    scheduler.run(futures)
    return [(list(f.result().token_ids), f.result().finish_reason) for f in futures]


def teacher_forced_logits(
    runner: FastRunner, prompts: Sequence[Sequence[int]], forced: Tensor
) -> Tensor:
    """Logits after each prompt and after each forced token ``[B, k]`` -> ``[B, k+1, V]``,
    through the runner's own prefill and decode steps (graphs included)."""
    with torch.inference_mode():
        count = len(prompts)
        logits = [runner.prefill(prompts, range(count)).clone()]
        lengths = torch.tensor([len(p) for p in prompts], device=forced.device)
        slots = torch.arange(count, device=forced.device)
        runner.add(forced[:, 0], lengths, slots, 0)
        for k in range(forced.shape[1]):
            logits.append(runner.step()[:count].clone())
            if k + 1 < forced.shape[1]:
                next_tokens = runner.tokens[: runner.bucket].clone()
                next_tokens[:count] = forced[:, k + 1]
                runner.advance(next_tokens)
        runner.clear()
        return torch.stack(logits, dim=1)


# Six forced tokens after each of three prompts: the quantized models' comparisons.
FORCED = torch.tensor([[5, 77, 301, 9, 14, 200], [400, 2, 18, 18, 7, 7], [3, 4, 5, 6, 7, 8]])


def against_unquantized(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    forced: Tensor,
    quantize: str,
    max_batch_size: int = 4,
    max_seq_len: int = 64,
    quantize_head: bool = False,
) -> tuple[FastRunner, FastRunner, Tensor]:
    """The fast engine over a copy of ``model`` and over ``model`` quantized, and the cosine
    similarity of their teacher-forced logits (one value per position)."""
    sizes = {"max_batch_size": max_batch_size, "max_seq_len": max_seq_len}
    dense = build_fast_runner(copy.deepcopy(model), **sizes)
    quantized = build_fast_runner(model, quantize=quantize, quantize_head=quantize_head, **sizes)
    ours = teacher_forced_logits(quantized, prompts, forced).flatten(0, 1)
    theirs = teacher_forced_logits(dense, prompts, forced).flatten(0, 1)
    return dense, quantized, F.cosine_similarity(ours.double(), theirs.double(), dim=-1)
