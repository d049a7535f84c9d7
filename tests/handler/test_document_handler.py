"""Documents through the handler with a fake engine: whole documents back byte for byte from an
identity translator, structure untouched by a real one, rows fed in windows, progress
streamed, and every bad document a clear 4xx beside requests that succeed."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeEngine, make_context, set_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from hunyuan_mt_handler import HunyuanMTHandler
from hymt_serve.core.settings import Settings
from hymt_serve.request import door
from hymt_serve.request.errors import ServiceError
from hymt_serve.request.service import TranslationService

SETTINGS: dict[str, Any] = {"model_path": "/unused", "max_new_tokens": 400}

MARKDOWN = """\
# Getting started

Install it with `pip install hunyuan-mt-torchserve`, then open https://example.com/a.b for
the **full** guide. It takes [two minutes](docs/start.md).

```bash
hymt start --model ./models/tiny
```

| Step | What happens |
|------|--------------|
| 1 | The server *starts* |

- Translate a sentence.
- Translate a <b>document</b>.
"""

SRT = (
    "1\r\n00:00:01,000 --> 00:00:02,000\r\nHello there.\r\n\r\n"
    "2\r\n00:00:03,000 --> 00:00:04,500\r\n<i>Bye.</i>\r\n"
)

HTML = (
    "<html><head><title>Title</title><script>var a = 'code';</script></head>"
    "<body><p>One <a href='x'>link</a>.</p></body></html>"
)

TAG = re.compile(r"(</?s\d+>)")


def shout(text: str) -> str:
    """A "translation" that upper-cases the words and keeps the <sN> tags."""
    return "".join(part if TAG.fullmatch(part) else part.upper() for part in TAG.split(text))


def start(engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, **extra: Any) -> HunyuanMTHandler:
    import hymt_serve.engine.engine

    monkeypatch.setattr(hymt_serve.engine.engine, "load_engine", lambda *args, **kw: engine)
    handler = HunyuanMTHandler()
    handler.initialize(make_context({**SETTINGS, **extra}))
    return handler


def run(handler: HunyuanMTHandler, bodies: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    context = handler.context
    set_batch(context, len(bodies))
    out = handler.handle([{"body": body} for body in bodies], context)
    return [(context.get_response_status(i)[0], json.loads(text)) for i, text in enumerate(out)]


@pytest.mark.parametrize(
    ("kind", "document"), [("markdown", MARKDOWN), ("srt", SRT), ("html", HTML), ("text", SRT)]
)
def test_an_identity_translator_gives_every_document_back_byte_for_byte(
    kind: str, document: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine(translate=lambda text: text)
    handler = start(engine, monkeypatch)
    ((status, reply),) = run(handler, [{"document": document, "format": kind, "target_lang": "de"}])
    assert status == 200, reply
    assert reply["document"] == document
    assert reply["format"] == kind and reply["segments"] == len(engine.prompts) > 0
    assert reply["finish_reasons"] == {"stop": reply["segments"]}
    assert reply["format_tags_lost"] == 0 and reply["untranslated_segments"] == 0
    assert engine.calls == [reply["segments"]]  # every segment went to the engine at once


def test_a_translation_changes_the_prose_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = start(FakeEngine(translate=shout), monkeypatch)
    replies = run(
        handler,
        [
            {"document": MARKDOWN, "format": "markdown", "target_lang": "de"},
            {"document": SRT, "format": "srt", "target_lang": "de"},
        ],
    )
    (status, markdown), (srt_status, srt) = replies
    assert status == srt_status == 200
    text = markdown["document"]
    assert text.startswith(
        "# GETTING STARTED\n\nINSTALL IT WITH `pip install hunyuan-mt-torchserve`"
    )
    assert "https://example.com/a.b" in text and "[TWO MINUTES](docs/start.md)" in text
    assert "**FULL**" in text
    assert "```bash\nhymt start --model ./models/tiny\n```" in text
    assert "| STEP | WHAT HAPPENS |\n|------|--------------|\n| 1 | THE SERVER *STARTS* |" in text
    assert "- TRANSLATE A <b>DOCUMENT</b>." in text
    assert srt["document"] == SRT.replace("Hello there.", "HELLO THERE.").replace("Bye.", "BYE.")


def test_code_and_urls_the_model_drops_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = start(FakeEngine(translate=lambda text: TAG.sub("", text).upper()), monkeypatch)
    ((status, reply),) = run(
        handler,
        [
            {
                "document": "Run `make` now, see https://x.org/a.",
                "target_lang": "fr",
                "format": "markdown",
            }
        ],
    )
    assert status == 200
    assert reply["document"] == "RUN `make` NOW, SEE https://x.org/a."  # where they were
    assert reply["format_tags_lost"] == 2


def test_rows_are_fed_in_windows_and_keep_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine(translate=lambda text: text[::-1])
    # Latin letters for Japanese: the language check would retry every row (windows of its
    # own, test_target_language.py); this test counts the first round's.
    handler = start(engine, monkeypatch, document_window_rows=3, target_language_check="off")
    paragraphs = [f"Paragraph {n}." for n in range(10)]
    document = "\n\n".join(paragraphs) + "\n"
    ((status, reply),) = run(handler, [{"document": document, "target_lang": "ja"}])
    assert status == 200
    assert reply["document"] == "\n\n".join(p[::-1] for p in paragraphs) + "\n"
    assert engine.calls[0] == 3 and sum(engine.calls) == 10 and max(engine.calls) <= 3


def test_progress_streams_as_json_lines_then_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        door,
        "send_intermediate_predict_response",
        lambda ret, ids, message, code, context: sent.append(json.loads(ret[0])),
    )
    handler = start(FakeEngine(), monkeypatch, document_window_rows=4)
    document = "\n\n".join(f"Line {n}." for n in range(250))
    context = handler.context
    set_batch(context, 1)
    (final,) = handler.handle(
        [{"body": {"document": document, "target_lang": "fr", "stream": True}}], context
    )
    progress = [event["progress"] for event in sent]
    assert all(event["request_id"] == "req-0" for event in sent)
    assert progress[-1] == {"done": 250, "total": 250}
    done = [p["done"] for p in progress]
    assert done == sorted(done) and len(done) <= 101  # at most one line per percent
    assert final.endswith("\n") and json.loads(final)["document"].startswith("LINE 0.\n\nLINE 1.")


def test_previous_context_puts_the_segment_before_into_each_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = FakeEngine(translate=lambda text: text)
    handler = start(engine, monkeypatch, prompt_family="hy-mt1.5")
    body = {
        "document": "First one.\n\nSecond one.\n",
        "target_lang": "zh",
        "previous_context": True,
    }
    ((status, reply),) = run(handler, [body])
    assert status == 200, reply
    assert "First one." not in engine.prompts[0].split("\n\n", 1)[0]
    assert engine.prompts[1].startswith("First one.\n参考上面的信息")


def test_markup_takes_the_formatted_template_where_the_family_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = FakeEngine(
        translate=lambda text: text.replace("<source>", "<target>").replace(
            "</source>", "</target>"
        )
    )
    handler = start(engine, monkeypatch, prompt_family="hy-mt1.5")
    document = "Plain words.\n\nSome **bold** words.\n"
    ((status, reply),) = run(
        handler, [{"document": document, "format": "markdown", "target_lang": "zh"}]
    )
    assert status == 200 and reply["document"] == document
    assert "<source>" not in engine.prompts[0] and "<source>Some <s1>bold</s1>" in engine.prompts[1]


BAD = [
    ({"document": "x", "text": "y", "target_lang": "de"}, 400, "document"),
    ({"document": "", "target_lang": "de"}, 400, "document"),
    ({"document": ["a"], "target_lang": "de"}, 400, "document"),
    ({"document": "Hi.", "format": "pdf", "target_lang": "de"}, 400, "format"),
    ({"text": "Hi.", "format": "html", "target_lang": "de"}, 400, "format"),
    ({"document": "Hi.", "previous_context": "yes", "target_lang": "de"}, 400, "previous_context"),
    ({"document": "Hi.", "previous_context": True, "target_lang": "de"}, 400, "previous_context"),
    ({"document": "Hi.", "preserve_format": "html", "target_lang": "de"}, 400, "preserve_format"),
    ({"document": "1\nnot a timing\nHi\n", "format": "srt", "target_lang": "de"}, 400, "document"),
    ({"document": "é" * 600, "target_lang": "de"}, 413, "document"),
    ({"document": "w" * 400, "target_lang": "de"}, 413, "document"),
    ({"document": "\n\n".join(["Hi."] * 30), "target_lang": "de"}, 413, "document"),
]


def test_bad_documents_get_clear_4xx_and_the_batch_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler = start(
        FakeEngine(),
        monkeypatch,
        max_document_bytes=1000,
        max_document_segments=20,
        max_input_tokens=300,
    )
    good = {"document": "Good.\n\nAlso good.\n", "target_lang": "de"}
    replies = run(handler, [good, *(body for body, _, _ in BAD), good])
    assert replies[0] == (replies[-1][0], replies[-1][1] | {"request_id": "req-0"})
    assert replies[0][1]["document"] == "GOOD.\n\nALSO GOOD.\n"
    for (status, reply), (body, expected, field) in zip(replies[1:-1], BAD, strict=True):
        assert (status, reply.get("field")) == (expected, field), (body, reply)
        assert reply["error"]
    assert "segment 1 (line 1)" in replies[11][1]["error"]
    assert "cue 1 (line 2)" in replies[9][1]["error"]


def test_a_segment_output_is_capped_by_its_own_length(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = start(
        FakeEngine(translate=lambda text: text * 5), monkeypatch, document_length_factor=1.5
    )
    document = "Short one.\n\n" + "A much longer paragraph of words. " * 3 + "\n"
    ((status, reply),) = run(handler, [{"document": document, "target_lang": "fr"}])
    assert status == 200
    assert reply["finish_reasons"] == {"length": 2}
    short, long = reply["document"].split("\n\n")
    assert len(short) == 8 + 15  # 10 characters (one token each in the fake) x 1.5, plus 8
    paragraph = len(("A much longer paragraph of words. " * 3).strip())
    assert len(long.strip()) == 8 + math.ceil(1.5 * paragraph)


def test_a_document_that_writes_about_sn_tags_keeps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = start(FakeEngine(translate=shout), monkeypatch)
    document = "Tags such as <s1>this</s1> mark **formatting**.\n"
    ((status, reply),) = run(
        handler, [{"document": document, "format": "markdown", "target_lang": "de"}]
    )
    assert status == 200, reply
    assert reply["document"] == "TAGS SUCH AS <s1>THIS</s1> MARK **FORMATTING**.\n"


PIECES = [*"ab Z.!?。\n\r#>-*_`|<>/[]()~:1é字😀", "<b>", "</b>", "<s1>", "```", "http://x.y/ "]
PIECES += ["<code>", "</code>", "**", "[a](b)", "1\n00:00:01,000 --> 00:00:02,000\n", "\n\n"]


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["text", "markdown", "html", "srt"]),
    document=st.lists(st.sampled_from(PIECES), min_size=1, max_size=80).map("".join),
)
def test_any_document_comes_back_byte_for_byte_through_the_service(
    kind: str, document: str
) -> None:
    """Splitting, <sN> tags for inline markup, generation and rebuilding: with an identity
    translator the reply is the document, whatever it holds (or a 400 for a broken SRT)."""
    service = TranslationService(
        FakeEngine(translate=lambda text: text),
        Settings.from_mapping({"model_path": "/unused", "document_segment_tokens": 24}, environ={}),
    )
    body = {"document": document, "format": kind, "target_lang": "de"}
    try:
        request: Any = service.parse(body)
    except ServiceError as error:  # refused at the door: the reply carries the error
        request = error
    outcomes = service.prepare([request])
    replies = service.render(outcomes, service.generate(outcomes), ["r"])
    if not document.strip():
        assert replies[0].status == 400
        return
    if replies[0].status == 400 and kind == "srt":
        assert "SRT" in replies[0].body["error"]
        return
    assert replies[0].status == 200, replies[0].body
    assert replies[0].body["document"] == document


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_a_document_fed_two_rows_at_a_time_through_the_real_scheduler(
    tiny_model_dir: Path, engine: str
) -> None:
    """Batch mode steps the scheduler on the handler's thread: rows that the finishing rows
    submit (from their futures' callbacks) must keep it stepping until the document is done."""
    handler = HunyuanMTHandler()
    context = make_context(
        {"model_path": str(tiny_model_dir), "engine": engine, "max_new_tokens": 6,
         "document_window_rows": 2, "max_batch_rows": 4},
        model_dir=tiny_model_dir,
    )  # fmt: skip
    handler.initialize(context)
    document = "\n\n".join(f"Paragraph {n} here." for n in range(9)) + "\n"
    ((status, reply),) = run(handler, [{"document": document, "target_lang": "de"}])
    assert status == 200, reply
    assert reply["segments"] == 9 and reply["document"].endswith("\n")


ISSUE_56 = [
    (
        "markdown",
        "\ufeff# Title\r\n\r\nOrder [parts](https://example.com/p?id=42) and "
        '![the logo](img/l.png "Logo") from a@b.org.\r\n',
        "\ufeff# TITLE\r\n\r\nORDER [PARTS](https://example.com/p?id=42) AND "
        '![THE LOGO](img/l.png "Logo") FROM a@b.org.\r\n',
    ),
    (
        "html",
        '<p>At <time datetime="2024-05-01">noon</time>, <b>read</b> '
        '<a href="/x" title="T">it</a> or mail me@x.org.</p>',
        '<p>AT <time datetime="2024-05-01">NOON</time>, <b>READ</b> '
        '<a href="/x" title="T">IT</a> OR MAIL me@x.org.</p>',
    ),
    (
        "srt",
        "1\r\n00:00:01,000 --> 00:00:02,000\r\n<i>Hello there.</i>\r\n",
        "1\r\n00:00:01,000 --> 00:00:02,000\r\n<i>HELLO THERE.</i>\r\n",
    ),
    ("text", "\ufeffWrite to a@b.org.\r\n", "\ufeffWRITE TO a@b.org.\r\n"),
]


@pytest.mark.parametrize(("kind", "document", "expected"), ISSUE_56)
def test_markup_the_model_drops_comes_back_where_it_was(
    kind: str, document: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that drops every tag (and would mangle an address it saw) loses nothing."""
    handler = start(FakeEngine(translate=lambda text: TAG.sub("", text).upper()), monkeypatch)
    ((status, reply),) = run(handler, [{"document": document, "format": kind, "target_lang": "de"}])
    assert status == 200, reply
    assert reply["document"] == expected
