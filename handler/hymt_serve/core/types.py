"""Value objects of generation (pure Python, no torch): what goes into the engine and out.

Each text reaches the engine as one :class:`GenerationRow` (prompt already tokenised with the
chat template) through ``Engine.submit(row, on_tokens)``, and comes back as the
:class:`GenerationResult` of the returned future. ``on_tokens`` (:data:`OnTokens`) gets the
row's new token ids as they become known.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

FinishReason = Literal["stop", "length"]
OnTokens = Callable[[list[int]], None]
# A model folder holding this file has random weights (``hymt tiny-model`` writes it; the
# engine's describe output says so).
TINY_MODEL_MARKER = "TINY_MODEL.json"


def cut_at_stop(tokens: Sequence[int], stop_ids: Collection[int]) -> tuple[list[int], FinishReason]:
    """``tokens`` up to (without) the first stop token: "stop" if there is one, else "length"."""
    for position, token in enumerate(tokens):
        if token in stop_ids:
            return list(tokens[:position]), "stop"
    return list(tokens), "length"


@dataclass(frozen=True)
class SamplingParams:
    """Sampling knobs; the defaults are the model card's recommendation."""

    temperature: float = 0.7
    top_p: float = 0.6
    top_k: int = 20
    repetition_penalty: float = 1.05
    # A row with a seed draws from noise that only the seed, the token's position and each
    # candidate's token id decide: the same tokens whatever else is in the batch, as long as
    # its logits are the same (another batch shape may round them apart: docs/openai.md);
    # None: torch's default generator.
    seed: int | None = None


class ChatTurn(NamedTuple):
    """One message of a conversation rendered through the model's chat template: its role
    ("system", "user" or "assistant") and its text (always encoded as text)."""

    role: str
    content: str


@dataclass(frozen=True)
class GenerationRow:
    """One text to generate for.

    ``prompt_ids`` is the full templated prompt (BOS included). ``sampling`` is None for greedy
    decoding. ``max_new_tokens`` counts generated tokens, the stop token included. ``stop``:
    strings (OpenAI's ``stop``) that end the row once its text holds one, "stop" as for a stop
    token; its tokens then end with the one that completed the string (the text is not cut:
    the request side cuts it).
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationResult:
    """What an engine produced for one row.

    ``token_ids`` are the generated ids without the prompt and without the stop token;
    ``finish_reason`` is "stop" when a stop token or one of the row's stop strings ended the
    row, "length" when ``max_new_tokens`` did.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason

    @property
    def output_tokens(self) -> int:
        return len(self.token_ids)
