"""Chimera refinement across two TorchServe models: candidates from the translation model, one
refined translation from Hunyuan-MT-Chimera-7B.

Both are ordinary models of one TorchServe (each its own archive and workers, scaled through
the management API on their own); this module only calls their prediction endpoints.

Candidates (``CANDIDATE_PLAN``): the translation model is asked six times at once (one request
each, so TorchServe batches them together): greedy, three samples with the model card's
settings, and two with wider sampling. Per text, candidates cut by ``max_new_tokens`` are left
out (unless all are), and duplicates (ignoring surrounding and repeated whitespace) are merged,
keeping the first. When every candidate agrees there is nothing to choose between: that text is
answered without a Chimera call (``"refined": false``). A request can instead bring its own
``candidates`` (1 to 6 per text): they go to Chimera as they are. The answer's ``timing_ms``
says how long each phase took (``candidates``, ``refine``: the Chimera call, 0 when none).

The request is billed its texts' characters once, for all its calls. Its ``usage.
memory_characters`` (present when not 0: the route refunds it) is the share of that work the
translation memory served: the texts' characters times the characters the calls' replies
served from memory over the characters the calls asked for (each candidate request its texts,
the Chimera call those it refined). Every call served: all of them; a repeated request whose
greedy candidate alone came from memory (samples without a seed never do): about a sixth.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hymt_serve.web.access import memory_characters
from hymt_serve.web.fairness import Post, fan_out

CARD_SAMPLING = {"temperature": 0.7, "top_p": 0.6, "top_k": 20, "repetition_penalty": 1.05}
WIDE_SAMPLING = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.05}
# (sampling fields or None for greedy, how many requests with them)
CANDIDATE_PLAN: tuple[tuple[dict[str, Any] | None, int], ...] = (
    (None, 1),
    (CARD_SAMPLING, 3),
    (WIDE_SAMPLING, 2),
)
# The request's own sampling choices give way to the plan's.
SAMPLING = ("sampling", *CARD_SAMPLING)
# Fields the Chimera model takes; the rest of the request (glossary, context, ...) only shapes
# the candidates.
REFINE_FIELDS = ("text", "source_lang", "target_lang", "max_new_tokens", "candidates")


class RefineError(Exception):
    """A model refused or failed: its status and JSON body go back to the client as they are."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("error", f"HTTP {status}"))
        self.status, self.body = status, body


async def refine(
    body: dict[str, Any], post: Post, translator: str, refiner: str
) -> tuple[int, dict[str, Any]]:
    """The refined translation(s) of ``body`` (the request API's fields, ``source_lang``
    required), with their candidates; or the first error a model answered."""
    try:
        return 200, await _refine(body, post, translator, refiner)
    except RefineError as error:
        return error.status, error.body


async def _refine(
    body: dict[str, Any], post: Post, translator: str, refiner: str
) -> dict[str, Any]:
    if "source_lang" not in body and "src_lang" not in body:
        raise RefineError(
            400,
            {
                "error": "refinement needs source_lang: Chimera's prompt names the source language",
                "error_type": "invalid_request",
                "field": "source_lang",
            },
        )
    fields = {k: v for k, v in body.items() if k in REFINE_FIELDS}
    clock = _Clock()
    if "candidates" in body:  # the client's own: Chimera checks and refines them as they are
        answer = await _post(post, refiner, {**fields, "stream": False})
        items = [{**item, "refined": True} for item in answer["translations"]]
        served = memory_characters(answer)
        return _response(body, items, {}, answer["usage"], {"refine": clock.lap()}, served)
    per_text, candidate_usage, asked, served = await _candidates(body, post, translator)
    timing = {"candidates": clock.lap()}
    unique = [_distinct(candidates) for candidates in per_text]
    texts = [body["text"]] if isinstance(body["text"], str) else body["text"]
    billed = sum(len(text) for text in texts)
    to_refine = [i for i, candidates in enumerate(unique) if len(candidates) > 1]
    refined: dict[int, dict[str, Any]] = {}
    usage = {"input_tokens": 0, "output_tokens": 0}
    if to_refine:
        request = {
            **fields,
            "text": [texts[i] for i in to_refine],
            "candidates": [unique[i] for i in to_refine],
            "stream": False,
        }
        answer = await _post(post, refiner, request)
        refined = dict(zip(to_refine, answer["translations"], strict=True))
        usage = answer["usage"]
        asked += sum(len(texts[i]) for i in to_refine)
        served += memory_characters(answer)
    timing["refine"] = clock.lap()
    items = [
        {**refined[i], "refined": True}
        if i in refined
        else {"text": unique[i][0], "candidates": unique[i], "refined": False}
        for i in range(len(texts))
    ]
    share = min(billed, billed * served // asked) if asked else 0
    return _response(body, items, candidate_usage, usage, timing, share)


class _Clock:
    def __init__(self) -> None:
        self.last = time.perf_counter()

    def lap(self) -> float:
        """Milliseconds since the last lap (or the start)."""
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return round(elapsed * 1000, 1)


async def _post(post: Post, model: str, request: dict[str, Any]) -> dict[str, Any]:
    return _checked(await post(model, request))


def _checked(reply: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    """The answer of a 200, else RefineError with the model's status and body."""
    status, answer = reply
    if status != 200:
        raise RefineError(status, answer)
    return answer


def _response(
    body: dict[str, Any],
    items: list[dict[str, Any]],
    candidate_usage: dict[str, int],
    refine_usage: dict[str, int],
    timing_ms: dict[str, float],
    served: int,
) -> dict[str, Any]:
    response: dict[str, Any] = {}
    memory = {"memory_characters": served} if served else {}
    if isinstance(body.get("text"), str):
        response["translation"] = items[0]["text"]
    response.update(
        translations=items,
        source_lang=body.get("source_lang", body.get("src_lang")),
        target_lang=body.get("target_lang", body.get("tgt_lang")),
        usage={"candidates": candidate_usage, "refine": refine_usage, **memory},
        timing_ms=timing_ms,
    )
    return response


async def _candidates(
    body: dict[str, Any], post: Post, translator: str
) -> tuple[list[list[str]], dict[str, int], int, int]:
    """Each text's candidates in the plan's order, the tokens they took, the characters the
    requests asked for and those their replies served from the translation memory."""
    base = {k: v for k, v in body.items() if k not in ("candidates", "stream", *SAMPLING)}
    requests = [
        {**base, "stream": False, **({"sampling": True, **sampling} if sampling else {})}
        for sampling, copies in CANDIDATE_PLAN
        for _ in range(copies)
    ]
    # one client's candidates, waited for at once: not bulk
    sent = await fan_out(post, translator, requests, len(requests), bulk=False)
    answers = [_checked(answer) for answer in sent]
    per_text: list[list[str]] = [[] for _ in answers[0]["translations"]]
    for answer in answers:
        for i, item in enumerate(answer["translations"]):
            if item["finish_reason"] != "length":
                per_text[i].append(item["text"])
    for i, candidates in enumerate(per_text):
        if not candidates:  # all cut by max_new_tokens: keep them all the same
            per_text[i] = [answer["translations"][i]["text"] for answer in answers]
    usage = {
        key: sum(answer["usage"][key] for answer in answers)
        for key in ("input_tokens", "output_tokens")
    }
    texts = [body["text"]] if isinstance(body["text"], str) else body["text"]
    asked = len(answers) * sum(len(text) for text in texts)
    return per_text, usage, asked, sum(memory_characters(answer) for answer in answers)


def _distinct(candidates: Sequence[str]) -> list[str]:
    """The candidates without duplicates (compared without surrounding or repeated
    whitespace), first occurrence kept; empty ones left out."""
    seen: set[str] = set()
    kept = []
    for candidate in candidates:
        key = " ".join(candidate.split())
        if key and key not in seen:
            seen.add(key)
            kept.append(candidate)
    return kept or list(candidates[:1])
