"""A seeded row gives the same tokens whatever else shares its batch, on a tiny real model (CPU),
on the fast engine and on transformers' forward: alone, beside one row and beside five rows of
other lengths and settings (some ending early, so the batch changes shape under it), with and
without a stop string, at temperature 1.5 where a random model's distribution is nearly flat.

The engines' logits for the row differ between these batches by about 1e-7 (other GEMM shapes,
padding, packed prefill); a draw keyed by the candidates' sorted rank changed with that (seeds
42 and 2024 here), one keyed by token id only at a near-tie of log p - log E.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationRow, SamplingParams
from hymt_serve.engine.engine import Engine, load_engine

MAX_NEW = 32
MINE = "Write a long story about a cat and a dog."
OTHERS = (
    ("Hi", 32, SamplingParams(temperature=1.0, top_p=1.0, top_k=0)),
    ("Translate into French: the weather is fine today, and tomorrow too.", 9, None),
    ("Bonjour", 20, SamplingParams(seed=5)),
    ("一二三四五六七八九十 the quick brown fox jumps over the dog", 32, SamplingParams()),
    ("ok?", 3, SamplingParams(temperature=1.5, top_p=1.0, top_k=0, seed=42)),
)
SETTINGS = {
    "flat": SamplingParams(temperature=1.5, top_p=1.0, top_k=0, repetition_penalty=1.0),
    "truncated": SamplingParams(temperature=1.5, top_p=0.9, top_k=40, repetition_penalty=1.05),
}


@pytest.fixture(scope="module", params=["fast", "hf"])
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Engine:
    raw = {"model_path": str(tiny_model_dir), "engine": request.param, "max_new_tokens": MAX_NEW}
    return load_engine(Settings.from_mapping(raw, environ={}))


def others(engine: Engine, count: int) -> list[GenerationRow]:
    return [
        GenerationRow(tuple(engine.encode_chat([ChatTurn("user", text)])), length, params)
        for text, length, params in OTHERS[:count]
    ]


NEVER = ("never in this text \u2603",)
CASES = [(42, "flat", ()), (2024, "flat", NEVER), (7, "flat", ()), (1, "truncated", NEVER)]


@pytest.mark.parametrize(("seed", "settings", "stop"), CASES, ids=lambda value: str(value))
def test_a_seeded_row_keeps_its_tokens_beside_any_rows(
    engine: Engine, seed: int, settings: str, stop: tuple[str, ...]
) -> None:
    ids = tuple(engine.encode_chat([ChatTurn("user", MINE)]))
    mine = GenerationRow(ids, MAX_NEW, replace(SETTINGS[settings], seed=seed), stop)
    [alone] = engine.generate([mine])
    assert alone.output_tokens == MAX_NEW  # the random model ran to its length
    beside_one = engine.generate([*others(engine, 1), mine])[-1]
    first = engine.generate([mine, *others(engine, 5)])[0]
    assert beside_one.token_ids == alone.token_ids
    assert first.token_ids == alone.token_ids
    # The seed decides: another seed gives other tokens.
    other = engine.generate([replace(mine, sampling=replace(mine.sampling, seed=seed + 1))])
    assert other[0].token_ids != alone.token_ids
