"""A seeded row's draw depends on its seed, its position and its logits' values, not on where
its candidates sort: float rounding that differs between batch shapes (about 1e-7 of a logit
on the CPU) reorders near-tied tokens, and a draw keyed by rank would follow that reordering.

Deterministic: the noise of a seeded row is a hash, and the logits come from fixed generators.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from hymt_serve.core.types import GenerationRow, SamplingParams
from hymt_serve.engine.scheduler.sampling import RowSampling, sample_next, seeded_exponential

CPU = torch.device("cpu")
VOCAB = 4096
STEPS = 64


def seeded(seed: int, top_k: int = 0) -> GenerationRow:
    """A row sampled at temperature 1.5 (nearly flat for small logits) with ``seed``."""
    params = SamplingParams(temperature=1.5, top_p=1.0, top_k=top_k, repetition_penalty=1.0)
    return GenerationRow((), 16, replace(params, seed=seed))


def draws(rows: list[GenerationRow], logits: Tensor, at: int) -> list[int]:
    """Row ``at``'s token at each of ``STEPS`` positions, every row seeing ``logits [V]``."""
    settings = RowSampling.for_rows(rows, VOCAB, CPU)
    index = torch.arange(len(rows))
    batch = logits.expand(len(rows), VOCAB).contiguous()
    return [
        int(sample_next(batch, settings.select(index), index, torch.full((len(rows),), p))[at])
        for p in range(STEPS)
    ]


def nudged(logits: Tensor, seed: int) -> Tensor:
    """``logits`` with each value moved by at most a few units in the last place, as another
    batch shape's rounding moves them."""
    generator = torch.Generator().manual_seed(seed)
    ulps = torch.randint(-3, 4, logits.shape, generator=generator).float()
    return logits + ulps * torch.finfo(torch.float32).eps * logits.abs().clamp_min(1.0)


def test_near_ties_reordered_by_rounding_keep_the_draw() -> None:
    """A flat distribution (a random model at temperature 1.5 is nearly one) whose logits lie
    closer together than rounding moves them: the nudge reorders most candidates, and the
    seeded draws stay the same at every position."""
    generator = torch.Generator().manual_seed(0)
    flat = torch.randn(VOCAB, generator=generator) * 1e-5
    for seed in (42, 1, 7, 2024):
        other = nudged(flat, seed)
        assert not torch.equal(flat.sort().indices, other.sort().indices)  # ranks moved
        assert draws([seeded(seed)], other, 0) == draws([seeded(seed)], flat, 0)


def test_exact_ties_keep_the_draw_whatever_the_batch_width() -> None:
    """Logits with many exact ties, the seeded row alone (top-k 50: 50 candidates) and beside
    an unseeded full-vocabulary row (every token a candidate, sorted in another order)."""
    generator = torch.Generator().manual_seed(1)
    tied = torch.randint(-2, 3, (VOCAB,), generator=generator).float() * 0.01
    for seed in (42, 3, 11):
        mine = seeded(seed, top_k=50)
        beside = GenerationRow((), 16, SamplingParams(temperature=1.0, top_k=0, top_p=1.0))
        assert draws([beside, mine], tied, 1) == draws([mine], tied, 0)


def test_the_noise_follows_the_token_not_its_column() -> None:
    """The same tokens in another order of candidates get the same noise, each its own."""
    tokens = torch.arange(VOCAB)[None, :]
    shuffled = tokens[:, torch.randperm(VOCAB, generator=torch.Generator().manual_seed(2))]
    seed, position = torch.tensor([42]), torch.tensor([5])
    straight = seeded_exponential(seed, position, tokens)
    assert torch.equal(seeded_exponential(seed, position, shuffled), straight[:, shuffled[0]])
    assert straight.unique().numel() > VOCAB * 0.99  # distinct draws, not one repeated value
    assert 0.95 < float(straight.mean()) < 1.05  # Exp(1) has mean 1
