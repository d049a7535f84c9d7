"""The language check on the chat form (what the OpenAI routes send) with deliberately wrong
translators: a chat request with our translation fields is a translation and is checked,
retried once (streams judged, never retried) and reported like the request API's; a plain chat
is never checked; the client is billed for one answer."""

from __future__ import annotations

import json
from typing import Any

from test_target_language import (
    ALWAYS_WRONG,
    ENGLISH,
    HINDI,
    JAPANESE,
    RIGHT,
    WRONG_ONCE,
    service_with,
    translate,
)

from hymt_serve.core.types import SamplingParams
from hymt_serve.request import openai_api, openai_reply

MODELS = ("hunyuan-mt",)


def chat_to_japanese(text: str = ENGLISH, **fields: Any) -> dict[str, Any]:
    """The chat form as the OpenAI routes forward it, translating ``text`` into Japanese."""
    messages = [{"role": "system", "content": "Translate."}, {"role": "user", "content": text}]
    return {"messages": messages, "target_lang": "ja", "source_lang": "en", **fields}


def test_wrong_once_then_right_is_retried_once_sampled() -> None:
    service, engine = service_with(WRONG_ONCE)
    (reply,) = translate(service, chat_to_japanese())
    assert reply["choices"][0]["text"] == JAPANESE
    assert reply["choices"][0]["target_language"] == "retried"
    assert reply["target_language"] == "retried"
    first, retry = engine.rows
    assert engine.calls == [1, 1]
    assert retry.prompt_ids == first.prompt_ids and retry.max_new_tokens == first.max_new_tokens
    assert first.sampling is None and retry.sampling == SamplingParams()  # the card's defaults


def test_always_wrong_is_a_mismatch_after_exactly_one_retry() -> None:
    service, engine = service_with(ALWAYS_WRONG)
    (reply,) = translate(service, chat_to_japanese())
    assert reply["target_language"] == "mismatch"
    assert reply["choices"][0]["text"] == HINDI  # the first answer stays
    assert engine.calls == [1, 1]


def test_right_is_ok_and_generated_once() -> None:
    service, engine = service_with(RIGHT)
    (reply,) = translate(service, chat_to_japanese())
    assert (reply["choices"][0]["text"], reply["target_language"]) == (JAPANESE, "ok")
    assert engine.calls == [1]


def test_a_chat_without_our_fields_is_never_checked() -> None:
    """The fake answers the last user turn in Hindi: with no target_lang nobody knows that is
    wrong, so it is neither judged nor retried."""
    service, engine = service_with(ALWAYS_WRONG)
    (reply,) = translate(service, {"messages": [{"role": "user", "content": ENGLISH}]})
    assert reply["choices"][0]["text"] == HINDI and engine.calls == [1]
    assert "target_language" not in reply and "target_language" not in reply["choices"][0]


def test_each_choice_is_judged_and_the_wrong_one_retried() -> None:
    """Two choices of one text: the first answer is wrong, the second right (the fake answers
    in turn); only the first is generated again."""
    service, engine = service_with(WRONG_ONCE)
    (reply,) = translate(service, chat_to_japanese(n=2))
    assert [c["text"] for c in reply["choices"]] == [JAPANESE, JAPANESE]
    assert [c["target_language"] for c in reply["choices"]] == ["retried", "ok"]
    assert reply["target_language"] == "retried"
    assert engine.calls == [2, 1]


def test_a_seeded_choice_is_retried_with_a_seed_of_its_own() -> None:
    """The same seed would draw the same wrong answer: the retry's is derived from the row's,
    so the whole reply stays reproducible."""
    seeded = chat_to_japanese(temperature=0.9, seed=7)
    retries = []
    for _ in range(2):
        service, engine = service_with(WRONG_ONCE)
        (reply,) = translate(service, seeded)
        assert reply["target_language"] == "retried"
        first, retry = engine.rows
        assert first.sampling is not None and retry.sampling is not None
        assert first.sampling.seed == 7 and retry.sampling.seed not in (None, 7)
        assert retry.sampling.temperature == 0.9
        retries.append(retry.sampling.seed)
    assert retries[0] == retries[1]


def test_a_stream_is_judged_at_the_end_and_never_retried() -> None:
    service, engine = service_with(WRONG_ONCE)
    events: list[dict[str, Any]] = []
    (reply,) = translate(
        service, chat_to_japanese(stream=True), sink=lambda i, event: events.append(event)
    )
    assert reply["target_language"] == "mismatch"
    assert "".join(event["delta"] for event in events) == reply["choices"][0]["text"] == HINDI
    assert engine.calls == [1]


def test_a_choice_is_judged_as_the_client_gets_it_after_its_stop_string() -> None:
    """The retry's text runs on in Hindi past the stop string: cut there, it is Japanese and
    replaces the first answer; its tokens count through the stop string."""
    service, engine = service_with({ENGLISH: [HINDI, f"{JAPANESE}###{HINDI}"]})
    (reply,) = translate(service, chat_to_japanese(stop="###"))
    choice = reply["choices"][0]
    assert (choice["text"], choice["target_language"]) == (JAPANESE, "retried")
    assert choice["finish_reason"] == "stop"
    assert choice["output_tokens"] == len(JAPANESE) + len("###")
    assert engine.rows[1].stop == ("###",)  # the retry ends at the stop string too


def test_report_says_mismatch_without_retrying_and_off_says_nothing() -> None:
    service, engine = service_with(WRONG_ONCE, target_language_check="report")
    (reply,) = translate(service, chat_to_japanese())
    assert (reply["choices"][0]["text"], reply["target_language"]) == (HINDI, "mismatch")
    assert engine.calls == [1]
    service, engine = service_with(WRONG_ONCE, target_language_check="off")
    (reply,) = translate(service, chat_to_japanese())
    assert "target_language" not in reply and "target_language" not in reply["choices"][0]


def test_openai_usage_counts_one_answer_after_a_retry() -> None:
    """Through the OpenAI module both ways: the completion says the answer was retried, and its
    usage is the prompt once and the answer returned (the discarded attempt is not billed)."""
    body = {
        "model": "hunyuan-mt",
        "messages": [{"role": "user", "content": ENGLISH}],
        "target_lang": "ja",
        "source_lang": "en",
    }
    call = openai_api.parse_chat(json.dumps(body).encode(), MODELS)
    service, engine = service_with(WRONG_ONCE)
    (reply,) = translate(service, call.forward)
    completion = openai_reply.response(call, reply)
    assert completion["target_language"] == "retried"
    assert completion["choices"][0]["message"]["content"] == JAPANESE
    prompt = len(engine.rows[0].prompt_ids)
    assert completion["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": len(JAPANESE),
        "total_tokens": prompt + len(JAPANESE),
    }
    assert engine.calls == [1, 1]  # the retry ran, and is not in the usage


def test_an_openai_stream_says_the_outcome_on_its_finish_chunk() -> None:
    body = {"model": "hunyuan-mt", "messages": [{"role": "user", "content": ENGLISH}],
            "target_lang": "ja", "stream": True}  # fmt: skip
    call = openai_api.parse_chat(json.dumps(body).encode(), MODELS)
    service, _ = service_with(WRONG_ONCE)
    (reply,) = translate(service, call.forward, sink=lambda i, event: None)
    events = openai_reply.Stream(call).event(reply)
    finish = json.loads(events[0].removeprefix("data: "))
    assert finish["choices"][0]["finish_reason"] is not None
    assert finish["target_language"] == "mismatch"  # a stream is never retried
