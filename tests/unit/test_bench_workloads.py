"""The serving benchmarks' long-input workload (``run_bench.long_jobs``): inputs of about
500-1,000 tokens, each from one language pair's segments, under the server's character limit,
with the sentences' output-length rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "loadtest/serving"))
from run_bench import LONG_CHARS, long_jobs  # noqa: E402


def test_long_inputs_are_joined_from_one_pair_up_to_their_length(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    segments: dict[tuple[str, str], set[str]] = {}
    for line in (REPO / "loadtest/data/segments.jsonl").read_text().splitlines():
        row = json.loads(line)
        segments.setdefault((row["source_lang"], row["target_lang"]), set()).add(row["text"])
    jobs = long_jobs(tokenizer, cap=512)
    assert len(jobs) == 64
    assert len({body["text"] for body, _ in jobs}) > 48  # drawn, not one input repeated
    for body, new_tokens in jobs:
        pair = (body["source_lang"], body["target_lang"])
        assert set(body["text"].split("\n")) <= segments[pair]
        n_in = len(tokenizer(body["text"], add_special_tokens=False)["input_ids"])
        assert len(body["text"]) <= LONG_CHARS
        # at least the drawn length (500 or more), unless the next segment (under 300
        # characters) would have passed the characters' limit
        assert n_in >= 500 or len(body["text"]) > LONG_CHARS - 300, n_in
        assert n_in <= 1000
        assert new_tokens == max(8, min(512, round(1.2 * n_in)))
    assert long_jobs(tokenizer, cap=512) == jobs  # seeded: every run sends the same inputs
