"""Chimera refinement's orchestration (hymt_serve.web.refine) with scripted model answers."""

from __future__ import annotations

import asyncio
from typing import Any

from hymt_serve.web.refine import CANDIDATE_PLAN, refine

BODY = {"text": "你好", "source_lang": "zh", "target_lang": "en"}


class Models:
    """Answers the translation model with scripted texts (in the order the concurrent requests
    arrive) and Chimera with the number of candidates it got; records every call."""

    def __init__(self, texts: list[str], cut: frozenset[int] = frozenset()) -> None:
        self.texts, self.cut = texts, cut
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def post(
        self, model: str, body: dict[str, Any], *, bulk: bool = False
    ) -> tuple[int, dict[str, Any]]:
        assert not bulk  # one client's candidates are not bulk work
        self.calls.append((model, body))
        number = len(self.calls) - 1
        await asyncio.sleep(0)  # the six candidate calls are in flight together
        texts = [body["text"]] if isinstance(body["text"], str) else body["text"]
        if model == "chimera":
            items = [
                {"text": f"refined {len(c)}", "candidates": c, "template": "refine"}
                for c in body["candidates"]
            ]
        else:
            finish = "length" if number in self.cut else "stop"
            items = [{"text": self.texts[number], "finish_reason": finish} for _ in texts]
        usage = {"input_tokens": 10 * len(texts), "output_tokens": 2 * len(texts)}
        return 200, {"translations": items, "usage": usage}


def run(models: Models, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return asyncio.run(refine(body, models.post, "hunyuan-mt", "chimera"))


def test_candidates_are_generated_deduplicated_and_refined() -> None:
    models = Models(["Hello", "Hi", " Hello ", "Hey", "Hi", "Hello  there"])
    status, answer = run(models, BODY)
    assert status == 200 and answer["translation"] == "refined 4"
    translator_calls = [body for model, body in models.calls if model == "hunyuan-mt"]
    assert len(translator_calls) == sum(copies for _, copies in CANDIDATE_PLAN) == 6
    assert sum("sampling" not in body for body in translator_calls) == 1  # one greedy
    assert all(body["stream"] is False for body in translator_calls)
    [(_, chimera)] = [call for call in models.calls if call[0] == "chimera"]
    # The scripted texts follow the requests' arrival order: compare without order.
    [candidates] = chimera["candidates"]
    assert sorted(" ".join(c.split()) for c in candidates) == ["Hello", "Hello there", "Hey", "Hi"]
    assert answer["translations"][0]["refined"] is True
    assert answer["usage"]["candidates"] == {"input_tokens": 60, "output_tokens": 12}


def test_agreeing_candidates_need_no_chimera_call() -> None:
    models = Models(["Hello"] * 6)
    status, answer = run(models, BODY)
    assert status == 200 and answer["translation"] == "Hello"
    assert answer["translations"][0] == {"text": "Hello", "candidates": ["Hello"], "refined": False}
    assert all(model == "hunyuan-mt" for model, _ in models.calls)


def test_candidates_cut_by_the_length_limit_are_left_out() -> None:
    models = Models(["Hello", "Hi", "Hi", "Hello", "Hel", "H"], cut=frozenset({4, 5}))
    _, answer = run(models, BODY)
    assert sorted(answer["translations"][0]["candidates"]) == ["Hello", "Hi"]


def test_a_list_of_texts_refines_only_those_with_a_choice() -> None:
    class PerText(Models):
        async def post(
            self, model: str, body: dict[str, Any], *, bulk: bool = False
        ) -> tuple[int, dict[str, Any]]:
            status, answer = await super().post(model, body, bulk=bulk)
            if model == "hunyuan-mt":  # the first text always agrees, the second never
                answer["translations"] = [
                    {"text": "same", "finish_reason": "stop"},
                    {"text": f"v{id(body)}", "finish_reason": "stop"},  # a body per request
                ]
            return status, answer

    models = PerText([""] * 6)
    status, answer = run(models, {**BODY, "text": ["a", "b"]})
    assert status == 200 and "translation" not in answer
    first, second = answer["translations"]
    assert first["refined"] is False and first["text"] == "same"
    assert second["refined"] is True and len(second["candidates"]) == 6
    [(_, chimera)] = [call for call in models.calls if call[0] == "chimera"]
    assert chimera["text"] == ["b"]


def test_own_candidates_go_straight_to_chimera() -> None:
    models = Models([])
    status, answer = run(models, {**BODY, "candidates": ["Hi", "Hello"], "glossary": []})
    assert status == 200 and answer["translation"] == "refined 2"
    [(model, body)] = models.calls
    assert model == "chimera" and "glossary" not in body  # Chimera takes only its fields


def test_errors_pass_through() -> None:
    status, answer = run(Models([]), {"text": "x", "target_lang": "en"})
    assert status == 400 and answer["field"] == "source_lang"

    async def refusing(
        model: str, body: dict[str, Any], *, bulk: bool = False
    ) -> tuple[int, dict[str, Any]]:
        return 503, {"error": "busy", "error_type": "server_busy"}

    assert asyncio.run(refine(BODY, refusing, "hunyuan-mt", "chimera")) == (
        503,
        {"error": "busy", "error_type": "server_busy"},
    )
