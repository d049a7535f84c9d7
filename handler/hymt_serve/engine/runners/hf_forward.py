"""The fallback runner: transformers' own forward, for models the fast engine cannot run
(bitsandbytes-quantized weights, other architectures, ``engine: hf``).

It serves the same scheduler as the fast runner, one forward per step, so sampling, stopping
and streaming are the scheduler's in both. What differs: the KV cache is transformers'
``DynamicCache`` for the batch as a whole, prompts are left-padded to the longest one, and rows
join only an idle runner (a batch runs until its last row finishes; finished rows leave it at
once). Rows are slots ``0..max_rows-1`` like the fast runner's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from hymt_serve.engine.runners.protocol import Context


class HFRunner:
    """Prefill and decode steps through ``model(...)`` with left padding and a dynamic cache."""

    def __init__(self, model: Any, *, pad_id: int, max_batch_size: int) -> None:
        self.model = model
        self.pad_id = pad_id
        self.max_batch_size = max_batch_size
        # Rows join an idle runner only: every waiting row that has a slot starts together.
        self.prefill_budget: int | None = None
        self.mixed_tokens = 0  # transformers' cache takes prompts between steps only
        self.device: torch.device = next(model.parameters()).device
        self.vocab = int(model.config.vocab_size)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0))
        self._cache: Any = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self._tokens = torch.zeros(0, dtype=torch.long, device=self.device)
        self._slots = torch.zeros(0, dtype=torch.long, device=self.device)

    @property
    def context(self) -> Context:
        """The model's positions (transformers' cache grows as needed)."""
        return Context(self.max_positions, "the model's max_position_embeddings")

    def can_admit(self, running: int) -> bool:
        """Rows join an idle runner only (the cache is one left-padded batch)."""
        return running == 0

    def prefill(self, prompts: Sequence[Sequence[int]], slots: Sequence[int]) -> Tensor:
        """Run the left-padded prompts; logits after each prompt ``[R, V]`` (fp32)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._cache, self._mask = out.past_key_values, mask
        self._positions = positions[:, -1] + 1
        self._slots = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        logits: Tensor = out.logits[:, -1, :].float()
        return logits

    def add(self, tokens: Tensor, lengths: Tensor, slots: Tensor, running: int) -> None:
        """Start the batch that :meth:`prefill` just ran with its first tokens."""
        if running or not torch.equal(slots, self._slots):
            raise RuntimeError("the transformers runner takes one batch at a time")
        self._tokens = tokens.clone()

    def step(self) -> Tensor:
        """One decode step for the batch; logits ``[rows, V]`` (fp32)."""
        ones = torch.ones_like(self._mask[:, :1])
        self._mask = torch.cat([self._mask, ones], dim=1)
        out = self.model(
            input_ids=self._tokens[:, None],
            attention_mask=self._mask,
            position_ids=self._positions[:, None],
            past_key_values=self._cache,
            use_cache=True,
        )
        self._cache = out.past_key_values
        logits: Tensor = out.logits[:, -1, :].float()
        return logits

    def advance(self, next_tokens: Tensor) -> None:
        self._tokens = next_tokens.clone()
        self._positions = self._positions + 1

    def keep(self, keep: Tensor) -> None:
        """Keep only the batch positions ``keep`` (in order), cache rows included."""
        self._cache.batch_select_indices(keep)
        self._mask, self._positions = self._mask[keep], self._positions[keep]
        self._tokens, self._slots = self._tokens[keep], self._slots[keep]

    def clear(self) -> None:
        self._cache = None
        self._tokens = self._tokens[:0]
        self._slots = self._slots[:0]

    def batch_slots(self) -> Tensor:
        return self._slots.clone()

    def describe(self) -> dict[str, object]:
        param = next(self.model.parameters())
        return {
            "device": str(self.device),
            "dtype": str(param.dtype).removeprefix("torch."),
            "max_batch_size": self.max_batch_size,
        }
