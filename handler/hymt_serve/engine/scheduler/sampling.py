"""Greedy and model-card sampling for a batch of rows, on the device, without host syncs.
(Writes of a Python constant through an index tensor, ``t[index] = False``, copy the constant
to the device from pageable memory, which waits for the whole queue: ``index_fill_`` and
device values instead.)

Semantics follow transformers' logits processors for one row at a time: greedy rows take the
argmax of the raw logits; sampled rows apply the repetition penalty over prompt and generated
tokens (divide positive logits, multiply negative ones), then temperature, top-k, top-p, and
draw. The draw uses the exponential trick (argmax of p / E with E ~ Exp(1), taken as the argmax
of log p - log E so that softmax's normaliser plays no part), which samples from p without the
host sync of ``torch.multinomial``'s checks; it uses torch's default generator, so
``torch.manual_seed`` makes it reproducible. A row with a ``seed`` draws its E from a hash of
the seed, the token's position in its output and the candidate's token id instead: the same
tokens for the same logits, whatever rows share its batch. Keyed by token id, not by the
candidate's rank after sorting, a draw is a continuous function of the logits: float
differences between batch shapes far below the logits' spread reorder near-tied candidates
(often, in a vocabulary of 128k) but change the token only at a near-tie of log p - log E.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hymt_serve.core.types import GenerationRow, SamplingParams
from hymt_serve.engine.runners.inputs import to_device


@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling settings for the rows of one generate call (plus one padding row)."""

    greedy: Tensor
    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    penalty: Tensor
    presence: Tensor | None
    candidates: int
    all_greedy: bool
    seed: Tensor  # int64, a seeded row's seed (0 for the others)
    seeded: Tensor  # bool
    any_seeded: bool

    @classmethod
    def for_rows(
        cls, rows: Sequence[GenerationRow], vocab: int, device: torch.device
    ) -> RowSampling:
        """Settings of ``rows``; the extra last row (index ``len(rows)``) pads batches."""
        params = [row.sampling for row in rows] + [None]
        sampled = [p for p in params if p is not None]
        top_ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in sampled]

        def column(values: Sequence[float], dtype: torch.dtype) -> Tensor:
            return to_device(values, dtype, device)

        penalty = [p.repetition_penalty if p else 1.0 for p in params]
        return cls(
            greedy=column([p is None for p in params], torch.bool),
            temperature=column(
                [max(p.temperature, 1e-5) if p else 1.0 for p in params], torch.float32
            ),
            top_k=column(
                [p.top_k if p and 0 < p.top_k < vocab else vocab for p in params], torch.int64
            ),
            top_p=column([p.top_p if p else 1.0 for p in params], torch.float32),
            penalty=column(penalty, torch.float32),
            presence=_presence(rows, vocab, device) if any(x != 1.0 for x in penalty) else None,
            candidates=max(top_ks, default=1),
            all_greedy=not sampled,
            seed=column([_seed_of(p) or 0 for p in params], torch.int64),
            seeded=column([_seed_of(p) is not None for p in params], torch.bool),
            any_seeded=any(p.seed is not None for p in sampled),
        )

    def select(self, rows: Tensor) -> RowSampling:
        """The settings for a batch whose positions hold the row indices ``rows``."""
        return RowSampling(
            greedy=self.greedy[rows],
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            penalty=self.penalty[rows],
            presence=self.presence,
            candidates=self.candidates,
            all_greedy=self.all_greedy,
            seed=self.seed[rows],
            seeded=self.seeded[rows],
            any_seeded=self.any_seeded,
        )


def _seed_of(params: SamplingParams | None) -> int | None:
    return params.seed if params is not None else None


def _presence(rows: Sequence[GenerationRow], vocab: int, device: torch.device) -> Tensor:
    presence = torch.zeros(len(rows) + 1, vocab, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        presence[i].index_fill_(0, to_device(row.prompt_ids, torch.int64, device), True)
    return presence


# A row's argmax over the vocabulary is one block's loop on the GPU, slow for a large
# vocabulary; a few rows split theirs into up to this many chunks.
ARGMAX_CHUNKS = 64


def greedy_tokens(logits: Tensor) -> Tensor:
    """``logits.argmax(-1)`` for ``[B, V]``, the same index (the first maximum), computed for
    few rows as the maximum of each chunk of the vocabulary and then the best chunk, so that
    many blocks share the read. No host sync (a CUDA graph can hold it)."""
    rows, vocab = logits.shape
    chunks = ARGMAX_CHUNKS // max(rows, 1)
    while chunks > 1 and vocab % chunks:
        chunks //= 2
    if chunks <= 1:
        return logits.argmax(-1)
    width = vocab // chunks
    values, within = logits.reshape(rows, chunks, width).max(-1)
    best = values.argmax(-1, keepdim=True)
    return (best * width + within.gather(1, best)).squeeze(1)


def sample_next(
    logits: Tensor, batch: RowSampling, rows: Tensor, positions: Tensor | None = None
) -> Tensor:
    """Next token per batch position: ``logits [B, V]`` fp32, ``rows [B]`` row indices -> ``[B]``.

    ``batch`` must come from :meth:`RowSampling.select` with the same ``rows``; ``positions
    [B]`` (int64) is how many tokens each row has generated so far (None: none, a prefill's
    first token), which seeded rows' draws depend on.
    """
    greedy = greedy_tokens(logits)
    if batch.all_greedy:
        return greedy
    scores = logits
    if batch.presence is not None:
        seen = batch.presence[rows]
        penalty = batch.penalty[:, None]
        penalised = torch.where(scores > 0, scores / penalty, scores * penalty)
        scores = torch.where(seen, penalised, scores)
    scores = scores / batch.temperature[:, None]
    values, indices = _candidates(scores, batch.candidates, stable=batch.any_seeded)
    ranks = torch.arange(batch.candidates, device=logits.device)
    values = values.masked_fill(ranks[None, :] >= batch.top_k[:, None], float("-inf"))
    probs = values.softmax(-1)
    before = probs.cumsum(-1) - probs
    values = values.masked_fill(before >= batch.top_p[:, None], float("-inf"))
    noise = torch.empty_like(probs).exponential_()
    if batch.any_seeded:
        at = positions if positions is not None else torch.zeros_like(batch.seed)
        keyed = seeded_exponential(batch.seed, at, indices)
        noise = torch.where(batch.seeded[:, None], keyed, noise)
    # argmax of p / E, the same as of log p - log E = values - log E up to softmax's
    # normaliser, which is one constant a row and whose rounding depends on the batch's width.
    choice = (values - noise.clamp_min_(1e-20).log()).argmax(-1, keepdim=True)
    sampled = indices.gather(1, choice).squeeze(1)
    return torch.where(batch.greedy, greedy, sampled)


def _candidates(scores: Tensor, count: int, *, stable: bool) -> tuple[Tensor, Tensor]:
    """The ``count`` best scores of each row and their token ids, best first. ``stable``: tied
    scores in token id order, so that which of tied tokens make the top-k cut is decided by
    the values alone (topk's choice among ties may follow the batch's shape). The order comes
    from one int64 key per token, the score's bits ordered as the floats are above the
    complement of the token id: distinct keys, one topk, no full sort."""
    if not stable:
        return scores.topk(count, dim=-1)
    bits = (scores + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes 0.0, the same score
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: magnitude bits flipped
    tokens = torch.arange(scores.shape[-1], device=scores.device, dtype=torch.int64)
    keys = (ordered.to(torch.int64) << 32) | (_LOW32 - tokens)
    indices = keys.topk(count, dim=-1).indices
    return scores.gather(1, indices), indices


_LOW32 = 0xFFFFFFFF


def _times(x: Tensor, constant: int) -> Tensor:
    """``x * constant mod 2**32`` for int64 ``x`` holding 32-bit values, in two halves so that
    no product overflows int64."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _LOW32


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (the "lowbias32" finaliser) of each value of ``x``."""
    x = x ^ (x >> 16)
    x = _times(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _times(x, 0x846CA68B)
    return x ^ (x >> 16)


def seeded_exponential(seed: Tensor, position: Tensor, tokens: Tensor) -> Tensor:
    """Exp(1) noise ``[B, C]`` (fp32) for the candidates ``tokens [B, C]`` (int64 token ids),
    decided by each row's ``seed [B]`` (int64), its ``position [B]`` and the token id alone: a
    counter-based generator, so a row's draws never depend on the other rows of its batch, on
    where its candidates sort or on torch's generator state. A token's noise is the same
    whatever rank it takes: the rank of near-tied candidates follows float rounding."""
    key = _mix((seed & _LOW32) ^ 0x9E3779B9)
    key = _mix(key ^ ((seed >> 32) & _LOW32))
    key = _mix(key ^ (position & _LOW32))
    bits = _mix(key[:, None] ^ _mix((tokens + 0x632BE5AB) & _LOW32))
    uniform = (bits.to(torch.float64) + 0.5) / 2.0**32  # in (0, 1)
    return (-uniform.log()).to(torch.float32)


def record_tokens(batch: RowSampling, rows: Tensor, tokens: Tensor) -> None:
    """Mark generated tokens as seen, for the repetition penalty of later steps."""
    if batch.presence is not None:
        seen = torch.ones((), dtype=torch.bool, device=tokens.device)
        batch.presence.index_put_((rows, tokens), seen)


class SlotSampling:
    """Sampling settings per cache slot, for continuous batching: a row that takes a slot
    writes its settings (and its prompt into the repetition-penalty mask) there.

    Slots never assigned stay greedy, so padding positions pointing at a scratch slot cost
    nothing. ``batch`` builds the :class:`RowSampling` of the slots currently in the batch.
    """

    def __init__(self, slots: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.params: list[SamplingParams | None] = [None] * slots
        self.greedy = torch.ones(slots, dtype=torch.bool, device=device)
        self.temperature = torch.ones(slots, dtype=torch.float32, device=device)
        self.top_k = torch.full((slots,), vocab, dtype=torch.int64, device=device)
        self.top_p = torch.ones(slots, dtype=torch.float32, device=device)
        self.penalty = torch.ones(slots, dtype=torch.float32, device=device)
        self.presence = torch.zeros(slots, vocab, dtype=torch.bool, device=device)
        self.seed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.seeded = torch.zeros(slots, dtype=torch.bool, device=device)

    def assign(self, slots: Sequence[int], rows: Sequence[GenerationRow]) -> None:
        """Give each slot the settings and prompt of its row."""
        settings = RowSampling.for_rows(rows, self.vocab, self.greedy.device)
        index = to_device(list(slots), torch.int64, self.greedy.device)
        count = len(rows)
        self.greedy[index] = settings.greedy[:count]
        self.temperature[index] = settings.temperature[:count]
        self.top_k[index] = settings.top_k[:count]
        self.top_p[index] = settings.top_p[:count]
        self.penalty[index] = settings.penalty[:count]
        self.seed[index] = settings.seed[:count]
        self.seeded[index] = settings.seeded[:count]
        self.presence.index_fill_(0, index, False)
        if settings.presence is not None:
            self.presence[index] = settings.presence[:count]
        for slot, row in zip(slots, rows, strict=True):
            self.params[slot] = row.sampling

    def batch(self, slots: Sequence[int], index: Tensor) -> RowSampling:
        """Settings for a batch whose positions hold ``slots`` (``index`` is the same slots,
        padding included, as a tensor)."""
        sampled = [p for p in (self.params[s] for s in slots) if p is not None]
        penalised = any(p.repetition_penalty != 1.0 for p in sampled)
        return RowSampling(
            greedy=self.greedy[index],
            temperature=self.temperature[index],
            top_k=self.top_k[index],
            top_p=self.top_p[index],
            penalty=self.penalty[index],
            presence=self.presence if penalised else None,
            candidates=max(
                (p.top_k if 0 < p.top_k < self.vocab else self.vocab for p in sampled), default=1
            ),
            all_greedy=not sampled,
            seed=self.seed[index],
            seeded=self.seeded[index],
            any_seeded=any(p.seed is not None for p in sampled),
        )
