"""The serving benchmark's front-end paths (``loadtest/serving/frontend.py``, ``run_bench.py
--paths``): every path asks the handler for the same translation of the same length, the
settings that keep the front end's configuration out of the measurement, and the comparison
against the goals."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "loadtest/serving"))
import frontend  # noqa: E402
from run_bench import path_overrides  # noqa: E402

from hymt_serve.core.settings import Settings  # noqa: E402
from hymt_serve.request import openai_api  # noqa: E402
from hymt_serve.request.chat import ChatRequest, parse_body  # noqa: E402
from hymt_serve.request.protocol import TranslationRequest  # noqa: E402
from hymt_serve.web.app import _with_default_stream  # noqa: E402

SETTINGS = Settings.from_mapping({"model_path": "/m", "max_new_tokens": 512}, environ={})
MODEL = "hunyuan-mt"


def segments(count: int = 40) -> list[dict[str, Any]]:
    lines = (REPO / "loadtest/data/segments.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return random.Random(3).sample([r for r in rows if len(r["text"]) < 300], count)


def test_every_path_asks_the_handler_for_the_same_translation_and_length() -> None:
    """What TorchServe's handler makes of each path's body: the direct body, the page route's
    body as that route forwards it, and the chat form the OpenAI route sends for the chat
    body: one TranslationRequest, greedy, not streamed, with the same max_new_tokens."""
    for index, row in enumerate(segments()):
        n = 8 + index * 7  # lengths from 8 to 281
        direct = parse_body(frontend.body("torchserve", row, n, MODEL), SETTINGS)
        page = frontend.body("web", row, n, MODEL)
        assert _with_default_stream(page) == page  # forwarded whole: it says stream false
        through_page = parse_body(page, SETTINGS)
        call = openai_api.parse_chat(frontend.body("openai", row, n, MODEL), (MODEL,))
        assert not call.stream and call.n == 1
        chat = parse_body(call.forward, SETTINGS)
        assert isinstance(direct, TranslationRequest) and isinstance(chat, ChatRequest)
        assert chat.translation is not None
        assert direct == through_page == chat.translation, row
        assert direct.max_new_tokens == n and direct.sampling is None and not direct.stream
        assert direct.texts == (row["text"],) and direct.target.code == row["target_lang"]


def test_paths_are_checked() -> None:
    assert frontend.parse_paths("torchserve") == ["torchserve"]
    assert frontend.parse_paths("torchserve, web,openai") == ["torchserve", "web", "openai"]
    for wrong in ("web,openai", "torchserve,web,web", "torchserve,deepl", ""):
        with pytest.raises(ValueError):
            frontend.parse_paths(wrong)


def test_the_rounds_rotate_the_paths_order() -> None:
    paths = ["torchserve", "web", "openai"]
    orders = [frontend.ordered(paths, index) for index in range(3)]
    assert [order[0] for order in orders] == paths
    assert all(sorted(order) == sorted(paths) for order in orders)


def args(paths: list[str], users: list[int], check: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(paths=paths, users=users, language_check=check)


def test_the_handler_settings_of_a_front_end_run(tmp_path: Path) -> None:
    """By default a run through TorchServe alone keeps the profile as shipped; with a
    front-end path the language check is off (retries of a random model's output would make
    each path's work follow its noise) unless asked otherwise, and the job queue grows when
    hymt web's upstream slots (three quarters of it) would not hold every user's request."""
    gpu = REPO / "configs/model-config-gpu.yaml"  # jobQueueSize 512: 384 slots
    assert path_overrides(args(["torchserve"], [64, 256]), gpu) == {}
    check_off = {"handler.target_language_check": "off"}
    assert path_overrides(args(["torchserve", "web"], [64, 256]), gpu) == check_off
    assert path_overrides(args(["torchserve", "openai"], [64, 256], "profile"), gpu) == {}
    assert path_overrides(args(["torchserve"], [1], "report"), gpu) == {
        "handler.target_language_check": "report"
    }
    crowded = path_overrides(args(["torchserve", "web"], [64, 400]), gpu)
    assert crowded == {**check_off, "jobQueueSize": 535}
    assert int(crowded["jobQueueSize"] * 0.75) >= 400
    cpu = REPO / "configs/model-config-cpu.yaml"  # no jobQueueSize: TorchServe's 100
    assert path_overrides(args(["torchserve", "web"], [75]), cpu) == check_off
    assert path_overrides(args(["torchserve", "web"], [76]), cpu)["jobQueueSize"] == 103


def test_the_key_file_is_the_front_end_s_format_with_no_quota_in_reach(tmp_path: Path) -> None:
    from hymt_serve.web.keys import ClientKeys

    (tmp_path / "web_usage.json").write_text('{"bench": 999}')  # a former run's
    path, key = frontend.write_key_file(tmp_path)
    keys = ClientKeys.open(path)
    found = keys.find(key)
    assert found is not None and found.character_limit == frontend.NO_QUOTA
    assert keys.used(found) == 0 and path.stat().st_mode & 0o777 == 0o600


def level(path: str, users: int, rate: float, p50: float, run: int = 1, **more: Any) -> dict:
    row = {"path": path, "system": path, "mode": "continuous", "gpus": 1, "users": users,
           "round": run, "requests_per_s": rate, "p50_ms": p50, "p95_ms": 2 * p50,
           "errors": 0, "output_mismatches": 0, "requests": int(rate * 8), "elapsed_s": 8.0,
           "output_tokens_per_s": rate * 16, "prompt_tokens_per_s": rate * 26}  # fmt: skip
    return {**row, **more}


def by_path_and_users(table: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(entry["path"], entry["users"]): entry for entry in table}


def test_the_comparison_takes_medians_over_rounds_and_judges_the_goals() -> None:
    rows = [
        # 64 users: web 8 ms over direct's p50 (met), openai 12 ms over (not met)
        *(level("torchserve", 64, 400, p, run) for run, p in ((1, 100), (2, 140), (3, 102))),
        *(level("web", 64, 390, p, run) for run, p in ((1, 108), (2, 109), (3, 200))),
        *(level("openai", 64, 395, p, run) for run, p in ((1, 114), (2, 113), (3, 112))),
        # 256 users: web at 0.9 x direct's requests/s (met), openai at 0.85 (not met)
        *(level("torchserve", 256, r, 270, run) for run, r in ((1, 800), (2, 790), (3, 810))),
        *(level("web", 256, r, 280, run) for run, r in ((1, 720), (2, 700), (3, 740))),
        *(level("openai", 256, r, 280, run) for run, r in ((1, 680), (2, 670), (3, 690))),
        level("torchserve", 1, 10, 100),
        level("web", 1, 9.5, 104),
        level("naive", 1, 1, 1000) | {"path": None},  # not a path of --paths
    ]
    table = frontend.comparison(rows)
    found = by_path_and_users(table)
    assert set(found) == {(p, u) for p in ("web", "openai") for u in (64, 256)} | {("web", 1)}
    web64 = found[("web", 64)]
    assert (web64["p50_ms"], web64["torchserve_p50_ms"], web64["p50_diff_ms"]) == (109, 102, 7)
    assert web64["p50_diff_spread"] == "-31 to 98" and web64["rounds"] == 3
    assert web64["verdict"] == "goal met" and web64["goal"].startswith("p50 <=")
    assert (
        found[("openai", 64)]["p50_diff_ms"] == 11 and found[("openai", 64)]["verdict"] == "not met"
    )
    web256 = found[("web", 256)]
    assert web256["ratio"] == pytest.approx(720 / 800, abs=1e-3)
    assert web256["verdict"] == "goal met" and web256["goal"].startswith("req/s >=")
    assert found[("openai", 256)]["ratio"] == pytest.approx(680 / 800, abs=1e-3)
    assert found[("openai", 256)]["verdict"] == "not met"
    assert found[("web", 1)]["goal"] == found[("web", 1)]["verdict"] == ""  # no goal at 1
    assert found[("web", 1)]["output_tokens_per_request"] == 16.0
    text = frontend.comparison_markdown(table)
    assert text.startswith("## The front end's cost") and text.count("goal met") == 2
    assert text.count("| not met |") == 2
    assert frontend.comparison_markdown([]) == ""


def test_errors_or_other_lengths_leave_no_goal_met() -> None:
    rows = [
        level("torchserve", 256, 800, 270),
        level("web", 256, 800, 270, errors=2),
        level("openai", 256, 800, 270, output_mismatches=5),
        level("torchserve", 64, 400, 100, errors=1),
        level("web", 64, 400, 100),
    ]
    found = by_path_and_users(frontend.comparison(rows))
    assert found[("web", 256)]["verdict"] == "not met (errors)"
    assert found[("openai", 256)]["verdict"].startswith("no verdict (output lengths")
    assert found[("web", 64)]["verdict"] == "not met (errors)"  # direct's errors count too
