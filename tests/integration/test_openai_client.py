"""The OpenAI-compatible API of the web front end, driven by the official ``openai`` SDK (sync,
async, streams, errors) and by tools' own request bodies (tests/fixtures/openai_tools) over
HTTP, against the real stack: the tiny model in TorchServe behind ``hymt web``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from web_stub import serving

from hymt_serve.ops.launcher import Server
from hymt_serve.web.app import create_app
from hymt_serve.web.keys import ClientKeys

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tests" / "fixtures" / "openai_tools"
USER: Any = [{"role": "user", "content": "Good morning."}]
POOR_LIMIT = 10


@dataclass(frozen=True)
class Front:
    """The front end in front of the session's TorchServe: its ``/v1`` URL, a key, a key
    with a character limit of ``POOR_LIMIT``, and the key file's usage."""

    base_url: str
    key: str
    poor_key: str
    keys: ClientKeys
    workdir: Path  # holds run/web_keys.json, as a work folder does

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=key or self.key, max_retries=0)

    def used(self) -> int:
        return self.keys.used(self.keys.keys[0])


@pytest.fixture(scope="module")
def front(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    key_file = tmp_path_factory.mktemp("openai") / "run" / "web_keys.json"
    key_file.parent.mkdir()
    key, poor = "main-key-of-the-openai-test", "poor-key-of-the-openai-test"
    entries = [
        {"name": "main", "key": key, "character_limit": 1_000_000},
        {"name": "poor", "key": poor, "character_limit": POOR_LIMIT},
    ]
    key_file.write_text(json.dumps({"keys": entries}))
    keys = ClientKeys.open(key_file)
    with serving(create_app(server, client_keys=keys)) as url:
        yield Front(f"{url}v1", key, poor, keys, key_file.parents[1])


def test_models(front: Front) -> None:
    client = front.client()
    assert [model.id for model in client.models.list()] == ["hunyuan-mt"]
    assert client.models.retrieve("hunyuan-mt").owned_by == "tencent"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_sync_chat_counts_its_characters(front: Front) -> None:
    before = front.used()
    reply = front.client().chat.completions.create(
        model="hunyuan-mt",
        messages=USER,
        max_completion_tokens=8,
        extra_body={"target_lang": "de", "source_lang": "en"},
    )
    assert isinstance(reply, ChatCompletion) and reply.object == "chat.completion"
    [choice] = reply.choices
    assert isinstance(choice.message.content, str) and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert reply.usage.completion_tokens <= 8
    assert front.used() == before + len("Good morning.")


def test_sampled_choices_are_reproducible_with_a_seed(front: Front) -> None:
    def sampled() -> list[str | None]:
        reply = front.client().chat.completions.create(
            model="hunyuan-mt", messages=USER, n=2, temperature=0.9, seed=11
        )
        assert [choice.index for choice in reply.choices] == [0, 1]
        return [choice.message.content for choice in reply.choices]

    assert sampled() == sampled()


def test_a_stream_says_what_the_whole_reply_says(front: Front) -> None:
    """Greedy: the streamed deltas join into the whole reply's text, with the same finish
    reason and usage; the role comes first, the usage last."""
    client = front.client()
    whole = client.chat.completions.create(model="hunyuan-mt", messages=USER)
    chunks = list(
        client.chat.completions.create(
            model="hunyuan-mt",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text and text == whole.choices[0].message.content
    finished = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finished[-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completions(front: Front) -> None:
    client = front.client()
    whole = client.completions.create(model="hunyuan-mt", prompt="Good morning.", max_tokens=6)
    assert whole.object == "text_completion" and isinstance(whole.choices[0].text, str)
    streamed = client.completions.create(
        model="hunyuan-mt", prompt="Good morning.", max_tokens=6, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == whole.choices[0].text


def test_async_client(front: Front) -> None:
    """AsyncOpenAI: four completions at once (they share TorchServe's batches) and a stream."""

    async def main() -> tuple[list[str | None], str]:
        client = openai.AsyncOpenAI(base_url=front.base_url, api_key=front.key, max_retries=0)
        try:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model="hunyuan-mt",
                        messages=[{"role": "user", "content": text}],
                        extra_body={"target_lang": "fr"},
                    )
                    for text in ("One.", "Two.", "Three.", "Four.")
                )
            )
            stream = await client.chat.completions.create(
                model="hunyuan-mt", messages=USER, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        finally:
            await client.close()
        return [reply.choices[0].message.content for reply in replies], text

    contents, text = asyncio.run(main())
    assert len(contents) == 4 and all(isinstance(content, str) for content in contents)
    assert isinstance(text, str)


# --- errors, as the SDK raises them -------------------------------------------------------------


@pytest.mark.parametrize("key", ["not-a-key-of-this-server", "poor-key-of-the-openai-testX"])
def test_a_wrong_key_is_an_authentication_error(front: Front, key: str) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        front.client(key).chat.completions.create(model="hunyuan-mt", messages=USER)
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        front.client(key).models.list()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
         "unsupported_parameter"),
        ({"response_format": {"type": "json_object"}}, "response_format",
         "unsupported_parameter"),
        ({"extra_body": {"temprature": 0.5}}, "temprature", "unknown_parameter"),
        ({"extra_body": {"target_lang": "xx"}}, "target_lang", "unsupported_language"),
        ({"temperature": 5}, "temperature", None),
        ({"messages": [{"role": "user", "content": "x" * 4001}]}, "messages",
         "context_length_exceeded"),
    ],
)  # fmt: skip
def test_a_bad_body_is_a_bad_request_error_and_counts_nothing(
    front: Front, fields: dict[str, Any], param: str, code: str | None, stream: bool
) -> None:
    """Refused by the front end (tools, response_format, an unknown field) or by the handler
    behind TorchServe (a language, a bound, the demo's 4,000 characters), with the field named;
    a stream is refused before it begins."""
    before = front.used()
    with pytest.raises(openai.BadRequestError) as caught:
        front.client().chat.completions.create(
            **{"model": "hunyuan-mt", "messages": USER, "stream": stream, **fields}
        )
    assert caught.value.status_code == 400
    assert (caught.value.param, caught.value.code) == (param, code), caught.value.body
    assert front.used() == before


def test_an_unknown_model_is_not_found(front: Front) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        front.client().chat.completions.create(model="gpt-4o", messages=USER)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        front.client().completions.create(model="gpt-4o", prompt="x")


def test_a_key_past_its_limit_is_a_rate_limit_error_not_retried(front: Front) -> None:
    client = openai.OpenAI(base_url=front.base_url, api_key=front.poor_key)  # SDK's retries on
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model="hunyuan-mt", messages=[{"role": "user", "content": "x" * (POOR_LIMIT + 1)}]
        )
    assert caught.value.code == "insufficient_quota"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert front.keys.used(front.keys.keys[1]) == 0


# --- tools' own bodies over HTTP ----------------------------------------------------------------


def _fixture(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((TOOLS / f"{name}.json").read_text())
    return found


def _post(front: Front, fixture: dict[str, Any], **options: Any) -> requests.Response:
    url = front.base_url.removesuffix("/v1") + fixture["endpoint"]
    auth = {"Authorization": f"Bearer {front.key}"}
    return requests.post(url, json=fixture["request"], headers=auth, timeout=60, **options)


def _zotero_reads(body: str) -> tuple[str, str | None]:
    """What zotero-pdf-translate does with the stream: the body split on 'data:', each piece
    JSON-parsed (those that are not, [DONE], skipped), choices[0].delta.content appended until
    a finish_reason is set."""
    text, finish = "", None
    for piece in body.split("data:"):
        try:
            chunk = json.loads(piece)
        except ValueError:
            continue
        choice = chunk["choices"][0]
        text += choice["delta"].get("content") or ""
        finish = choice["finish_reason"]
        if finish:
            break
    return text, finish


@pytest.mark.parametrize("name", ["zotero-pdf-translate", "zotero-pdf-translate-our-fields"])
def test_zotero_pdf_translates_stream_is_read_its_way(front: Front, name: str) -> None:
    answer = _post(front, _fixture(name), stream=True)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/event-stream")
    text, finish = _zotero_reads(answer.text)
    assert finish in ("stop", "length") and isinstance(text, str)
    assert answer.text.endswith("data: [DONE]\n\n")


def test_pdfmathtranslate_reads_the_first_message(front: Front) -> None:
    answer = _post(front, _fixture("pdfmathtranslate"))
    assert answer.status_code == 200
    content = answer.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)


def test_subtitle_edit_reads_the_first_content_key(front: Front) -> None:
    answer = _post(front, _fixture("subtitleedit"))
    assert answer.status_code == 200
    first = re.search(r'"content"\s*:\s*("(?:[^"\\]|\\.)*")', answer.text)
    assert first is not None
    assert json.loads(first.group(1)) == answer.json()["choices"][0]["message"]["content"]


def test_pyvideotrans_default_prompt_is_past_the_demos_limit(front: Front) -> None:
    """Its prompt (about 4,100 characters) needs max_chars_per_text of 5,000 (docs/openai.md):
    on the demo's 4,000 the error says so the way OpenAI says an input is too long."""
    answer = _post(front, _fixture("pyvideotrans"))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")


# --- the documentation's examples ---------------------------------------------------------------

BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_curl_examples_of_the_docs_run(front: Front) -> None:
    """docs/openai.md's shell blocks, run as written in one shell (the demo's address replaced
    by this front end's, in a folder holding run/web_keys.json): every call answered, none an
    error."""
    blocks = BASH_BLOCK.findall((REPO / "docs/openai.md").read_text())
    assert len(blocks) >= 2
    script = "\n".join(blocks).replace("http://127.0.0.1:8000/", front.base_url[: -len("v1")])
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script.replace(". .venv/bin/activate", "")],
        cwd=front.workdir, env={**os.environ, "PATH": path}, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    objects = re.findall(r'"object": ?"([\w.]+)"', done.stdout)
    assert '"error"' not in done.stdout and done.stdout.count("data: [DONE]") == 1
    assert [kind for kind in objects if kind != "chat.completion.chunk"] == [
        "list", "model", "chat.completion", "text_completion"
    ]  # fmt: skip
    assert objects.count("chat.completion.chunk") >= 3
