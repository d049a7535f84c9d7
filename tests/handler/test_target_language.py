"""The language check through the service and the handler, with deliberately wrong
translators (fake engines that answer in the wrong language once, always, or never): a wrong
row is generated once more, sampled, in one round per batch; never a second time, never for a
stream; the reply and the metric say what happened; the client is billed for one translation."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from fakes import FakeEngine, make_context, set_batch

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationResult, GenerationRow, OnTokens, SamplingParams
from hymt_serve.request.errors import Overloaded
from hymt_serve.request.service import StreamSink, TranslationService

ENGLISH = "Let us meet at the station tomorrow morning."
JAPANESE = "明日の朝、駅で会いましょう。"
HINDI = "कल सुबह स्टेशन पर मिलते हैं।"
GREETING = "Good morning, and welcome to the meeting."
GREETING_JA = "おはようございます、会議へようこそ。"
NUMBERS = "Order 1042: 3 x 250 ml"


class Answers:
    """A translator that answers each source text with its answers in turn, the last one from
    then on (a text it was not given comes back as it is)."""

    def __init__(self, answers: dict[str, Sequence[str]]) -> None:
        self.answers = answers
        self.asked: dict[str, int] = {}

    def __call__(self, source: str) -> str:
        turn = self.asked[source] = self.asked.get(source, -1) + 1
        answers = self.answers.get(source, [source])
        return answers[min(turn, len(answers) - 1)]


WRONG_ONCE = {ENGLISH: [HINDI, JAPANESE]}
ALWAYS_WRONG = {ENGLISH: [HINDI]}
RIGHT = {ENGLISH: [JAPANESE], GREETING: [GREETING_JA]}


def service_with(
    answers: dict[str, Sequence[str]], engine: FakeEngine | None = None, **settings: Any
) -> tuple[TranslationService, FakeEngine]:
    engine = engine or FakeEngine()
    engine.translate = Answers(answers)
    raw = {"model_path": "/unused", **settings}
    return TranslationService(engine, Settings.from_mapping(raw, environ={})), engine


def translate(
    service: TranslationService, *bodies: dict[str, Any], sink: StreamSink | None = None
) -> list[dict[str, Any]]:
    outcomes = service.prepare([service.parse(body) for body in bodies])
    ids = [f"r{i}" for i in range(len(bodies))]
    replies = service.render(outcomes, service.generate(outcomes, sink), ids)
    assert all(reply.status == 200 for reply in replies), replies
    return [reply.body for reply in replies]


def to_japanese(text: Any, **fields: Any) -> dict[str, Any]:
    return {"text": text, "source_lang": "en", "target_lang": "ja", **fields}


# --- the three translators -------------------------------------------------------------------


def test_wrong_once_then_right_is_retried_once_sampled() -> None:
    service, engine = service_with(WRONG_ONCE)
    (reply,) = translate(service, to_japanese(ENGLISH))
    assert reply["translation"] == JAPANESE
    assert reply["target_language"] == "retried"
    assert reply["translations"][0]["target_language"] == "retried"
    first, retry = engine.rows
    assert engine.calls == [1, 1]
    assert retry.prompt_ids == first.prompt_ids and retry.max_new_tokens == first.max_new_tokens
    assert first.sampling is None and retry.sampling == SamplingParams()  # the card's defaults


def test_always_wrong_is_a_mismatch_after_exactly_one_retry() -> None:
    service, engine = service_with(ALWAYS_WRONG)
    (reply,) = translate(service, to_japanese(ENGLISH))
    assert reply["target_language"] == "mismatch"
    assert reply["translation"] == HINDI  # the first output stays
    assert engine.calls == [1, 1] and len(engine.rows) == 2  # one retry, no loop


def test_right_is_ok_and_generated_once() -> None:
    service, engine = service_with(RIGHT)
    (reply,) = translate(service, to_japanese(ENGLISH))
    assert (reply["translation"], reply["target_language"]) == (JAPANESE, "ok")
    assert engine.calls == [1]


@pytest.mark.parametrize("text", [NUMBERS, "Angela Merkel", "OK", "print(len(items))"])
def test_copied_and_short_outputs_are_ok_and_never_retried(text: str) -> None:
    service, engine = service_with({})  # every text comes back as it is
    (reply,) = translate(service, to_japanese(text))
    assert (reply["translation"], reply["target_language"]) == (text, "ok")
    assert engine.calls == [1]


def test_a_sampled_request_is_retried_with_its_own_sampling() -> None:
    service, engine = service_with(WRONG_ONCE)
    (reply,) = translate(service, to_japanese(ENGLISH, sampling=True, top_k=5))
    assert reply["target_language"] == "retried"
    assert engine.rows[1].sampling == SamplingParams(top_k=5)


# --- a batch: one retry round ----------------------------------------------------------------


def test_a_batch_retries_its_wrong_rows_together_in_one_round() -> None:
    thanks = "Thank you very much for your help."
    service, engine = service_with(
        {**WRONG_ONCE, GREETING: [GREETING_JA], "See you at nine.": ["Нет"],
         thanks: ["बहुत बहुत धन्यवाद आपकी मदद के लिए"]}
    )  # fmt: skip
    replies = translate(
        service,
        to_japanese([ENGLISH, GREETING]),
        {"text": "See you at nine.", "target_lang": "ru"},  # "Нет" is too short to judge
        to_japanese(thanks),
    )
    assert [t["target_language"] for t in replies[0]["translations"]] == ["retried", "ok"]
    assert "target_language" not in replies[0]  # a list: per translation only
    assert replies[1]["target_language"] == "ok" and replies[1]["translation"] == "Нет"
    assert replies[2]["target_language"] == "mismatch"
    assert engine.calls == [4, 2]  # the first round, then the two wrong rows together


def test_retry_rows_are_fed_in_windows_too() -> None:
    texts = [f"Please check the report number {n} before the meeting." for n in range(5)]
    service, engine = service_with({t: [HINDI, JAPANESE] for t in texts}, document_window_rows=2)
    document = "\n\n".join(texts) + "\n"
    (reply,) = translate(service, {"document": document, "target_lang": "ja"})
    assert reply["target_languages"] == {"ok": 0, "retried": 5, "mismatch": 0}
    assert max(engine.calls) <= 2 and sum(engine.calls) == 10


# --- documents: per segment, an aggregate ----------------------------------------------------


def test_a_document_is_checked_per_segment_and_reports_the_worst() -> None:
    service, engine = service_with({**WRONG_ONCE, GREETING: [HINDI]})
    document = f"# {GREETING}\n\n{ENGLISH}\n\n{NUMBERS}\n"
    # the heading is always wrong, the paragraph wrong once, the numbers copied
    (reply,) = translate(service, {"document": document, "format": "markdown",
                                   "source_lang": "en", "target_lang": "ja"})  # fmt: skip
    assert reply["target_languages"] == {"ok": 1, "retried": 1, "mismatch": 1}
    assert reply["target_language"] == "mismatch"
    assert reply["document"] == f"# {HINDI}\n\n{JAPANESE}\n\n{NUMBERS}\n"
    assert engine.calls == [3, 2]


def test_a_document_of_right_segments_is_ok() -> None:
    service, engine = service_with(RIGHT)
    document = f"{ENGLISH}\n\n{GREETING}\n"
    (reply,) = translate(service, {"document": document, "target_lang": "ja"})
    assert reply["target_language"] == "ok"
    assert reply["target_languages"] == {"ok": 2, "retried": 0, "mismatch": 0}
    assert engine.calls == [2]


# --- streams: checked at the end, never retried ----------------------------------------------


def test_a_stream_is_checked_at_the_end_and_never_retried() -> None:
    service, engine = service_with(WRONG_ONCE)
    events: list[dict[str, Any]] = []
    (reply,) = translate(
        service, to_japanese(ENGLISH, stream=True), sink=lambda i, event: events.append(event)
    )
    assert reply["target_language"] == "mismatch"
    assert "".join(event["delta"] for event in events) == reply["translation"] == HINDI
    assert engine.calls == [1]


# --- the setting -----------------------------------------------------------------------------


def test_report_says_mismatch_without_retrying() -> None:
    service, engine = service_with(WRONG_ONCE, target_language_check="report")
    (reply,) = translate(service, to_japanese(ENGLISH))
    assert (reply["translation"], reply["target_language"]) == (HINDI, "mismatch")
    assert engine.calls == [1]


def test_off_checks_nothing_and_says_nothing() -> None:
    service, engine = service_with(WRONG_ONCE, target_language_check="off")
    (reply,) = translate(service, to_japanese(ENGLISH))
    assert "target_language" not in reply and "target_language" not in reply["translations"][0]
    assert reply["translation"] == HINDI and engine.calls == [1]


def test_the_threshold_is_a_setting() -> None:
    """An answer for Japanese with 87% of its letters Latin: wrong at the default 0.8, unsure
    at 0.9."""
    mixed = "Please come early, we begin soon 明日"
    for confidence, expected in ((0.8, "mismatch"), (0.9, "ok")):
        service, _ = service_with(
            {ENGLISH: [mixed]}, target_language_check="report",
            target_language_confidence=confidence,
        )  # fmt: skip
        (reply,) = translate(service, to_japanese(ENGLISH))
        assert reply["target_language"] == expected


# --- a retry that cannot run leaves the first output -----------------------------------------


class RefusesSampledRows(FakeEngine):
    """An engine whose waiting line is full by the time the retry round comes."""

    def submit(
        self, row: GenerationRow, on_tokens: OnTokens | None = None
    ) -> Future[GenerationResult]:
        if row.sampling is not None:
            raise Overloaded("the engine's waiting line is full")
        return super().submit(row, on_tokens)


class FailsSampledRows(FakeEngine):
    """An engine that fails the retry round's rows (as the scheduler fails a batch)."""

    def run(self, futures: Sequence[Future[Any]]) -> None:
        if any(row.sampling is not None for row, _, _ in self._queued):
            self.failure = RuntimeError("the device was lost")
        super().run(futures)


class RaisesOnTheRetryRound(FakeEngine):
    """An engine that fails as a whole while stepping the retry round."""

    def run(self, futures: Sequence[Future[Any]]) -> None:
        if any(row.sampling is not None for row, _, _ in self._queued):
            raise RuntimeError("the engine broke")
        super().run(futures)


@pytest.mark.parametrize("engine", [RefusesSampledRows(), FailsSampledRows(),
                                    RaisesOnTheRetryRound()])  # fmt: skip
def test_a_retry_that_cannot_run_is_a_mismatch_not_an_error(engine: FakeEngine) -> None:
    service, _ = service_with(WRONG_ONCE, engine)
    (reply,) = translate(service, to_japanese(ENGLISH))  # 200: translate checks it
    assert (reply["translation"], reply["target_language"]) == (HINDI, "mismatch")


# --- async mode ------------------------------------------------------------------------------


class StepsAtOnce(FakeEngine):
    """An engine that generates each row as it is submitted (async mode awaits futures and
    never calls run)."""

    def submit(
        self, row: GenerationRow, on_tokens: OnTokens | None = None
    ) -> Future[GenerationResult]:
        future = super().submit(row, on_tokens)
        self._batch()
        return future


def test_async_mode_retries_texts_and_documents_the_same_way() -> None:
    service, engine = service_with({**WRONG_ONCE, GREETING: [HINDI, GREETING_JA]}, StepsAtOnce())
    bodies = [to_japanese(ENGLISH), {"document": f"{GREETING}\n", "target_lang": "ja"}]
    outcomes = service.prepare([service.parse(body) for body in bodies])
    generated = asyncio.run(service.generate_async(outcomes))
    replies = [reply.body for reply in service.render(outcomes, generated, ["a", "b"])]
    assert replies[0]["translation"] == JAPANESE and replies[0]["target_language"] == "retried"
    assert replies[1]["document"] == f"{GREETING_JA}\n"
    assert replies[1]["target_language"] == "retried"
    assert len(engine.rows) == 4


# --- billing and the metric ------------------------------------------------------------------


def test_usage_counts_one_translation_after_a_retry() -> None:
    """The reply's usage is the prompt once and the output returned: the discarded attempt
    adds nothing a client could be billed for. (The web front end bills a request's
    characters once, when it forwards it: the retry happens behind it, in the handler.)"""
    service, engine = service_with(WRONG_ONCE)
    (reply,) = translate(service, to_japanese(ENGLISH))
    prompt = len(engine.rows[0].prompt_ids)
    assert reply["usage"] == {"input_tokens": prompt, "output_tokens": len(JAPANESE)}
    assert reply["translations"][0]["input_tokens"] == prompt


def test_the_metric_counts_each_outcome_by_target_language(
    fake_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    fake_engine.translate = Answers({**WRONG_ONCE, "Thank you.": ["धन्यवाद आपका बहुत बहुत"],
                                     GREETING: [GREETING_JA]})  # fmt: skip
    handler = HunyuanMTHandler()
    context = make_context({"model_path": "/unused"})
    handler.initialize(context)
    bodies = [to_japanese([ENGLISH, GREETING, "Thank you.", "OK"]),
              {"text": "Angela Merkel", "target_lang": "fr"}]  # fmt: skip
    caplog.set_level(logging.INFO)
    set_batch(context, len(bodies))
    handler.handle([{"body": body} for body in bodies], context)
    lines = [
        r.getMessage() for r in caplog.records if "hymt_target_language_total" in r.getMessage()
    ]
    found = {_labels(line): _value(line) for line in lines}
    assert found == {
        ("ja", "retried"): 1.0,
        ("ja", "ok"): 1.0,
        ("ja", "mismatch"): 1.0,
        ("ja", "unsure"): 1.0,  # "OK": too short to tell
        ("fr", "unsure"): 1.0,  # the name came back as it was: copied, no evidence
    }
    assert "Thank" not in caplog.text and "morning" not in caplog.text  # no user text


def _labels(line: str) -> tuple[str, str]:
    dimensions = dict(pair.split(":", 1) for pair in line.split("|#")[1].split(","))
    return dimensions["Target"], dimensions["Result"]


def _value(line: str) -> float:
    return float(line.split("|#")[0].rsplit(":", 1)[1])


def test_user_text_is_not_logged_when_a_retry_fails(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    service, _ = service_with(WRONG_ONCE, RaisesOnTheRetryRound())
    translate(service, to_japanese(ENGLISH))
    assert "language retry round failed" in caplog.text
    assert "station" not in caplog.text and "स्टेशन" not in caplog.text


# --- the real engine -------------------------------------------------------------------------

TEXTS = ["Good morning.", "See you tomorrow at the station.", "Thanks a lot for the help!",
         "The meeting moved to Friday.", "Please send the invoice again."]  # fmt: skip


@pytest.mark.parametrize("mode", ["batch", "async"])
def test_the_real_engine_generates_each_wrong_row_once_more(tiny_model_dir: Any, mode: str) -> None:
    """The tiny random model answers in no language, and much of it is judged wrong (Latin or
    Han tokens for Korean and Hindi): each wrong row goes back to the engine once, sampled, in
    one round, in batch mode (the engine steps on this thread) and in async mode (its own
    process); the scheduler's count of submitted rows says so."""
    frontend = {"asyncCommunication": True} if mode == "async" else {}
    settings = {"model_path": str(tiny_model_dir), "max_new_tokens": 12, "engine": "hf",
                "max_batch_rows": 8}  # fmt: skip
    handler = HunyuanMTHandler()
    context = make_context(settings, tiny_model_dir, batch_size=1, frontend=frontend)
    handler.initialize(context)
    try:
        replies = [_handle(handler, context, {"text": TEXTS, "target_lang": target}, mode)
                   for target in ("ko", "hi")]  # fmt: skip
        described = handler.describe()["engine"]
    finally:
        if mode == "async":
            # killed after a short wait: the child misses its pipe's close (test_async_handler)
            from test_async_handler import CLOSE_WAIT_S

            handler._service().engine.close(timeout=CLOSE_WAIT_S)  # type: ignore[attr-defined]
    outcomes = [t["target_language"] for reply in replies for t in reply["translations"]]
    wrong = sum(outcome != "ok" for outcome in outcomes)
    assert wrong > 0, outcomes  # else this test exercised nothing
    assert described["scheduler"]["submitted"] == len(outcomes) + wrong


def _handle(handler: HunyuanMTHandler, context: Any, body: Any, mode: str) -> dict[str, Any]:
    if mode == "async":
        from test_async_handler import one_call  # a test module's helper: async calls

        request_id = body["target_lang"]  # its own: the replies sent ahead are kept by id
        status, _, text = asyncio.run(one_call(handler, context, body, request_id))
    else:
        set_batch(context, 1)
        (text,) = handler.handle([{"body": body}], context)  # type: ignore[misc]
        status = context.get_response_status(0)[0]
    assert status == 200, text
    return json.loads(text)  # type: ignore[no-any-return]
