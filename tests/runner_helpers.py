"""Offline generation over a runner through the production scheduler, and teacher-forced
logits for comparing a runner's forward with another implementation (tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from hymt_serve.engine.runner import FastRunner, Runner
from hymt_serve.engine.scheduler import Scheduler
from hymt_serve.engine.types import FinishReason, GenerationResult, GenerationRow


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
