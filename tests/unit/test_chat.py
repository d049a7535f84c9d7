"""The request API's chat form: parsing, sampling, stop strings and streamed choices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationResult, SamplingParams
from hymt_serve.request.chat import (
    CHOICE_SEED_STEP,
    ChatRequest,
    ChoiceStream,
    parse_body,
    render_chat,
)
from hymt_serve.request.chat_options import apply_stop, cut_at_stop
from hymt_serve.request.errors import InvalidRequest, PayloadTooLarge, ServiceError
from hymt_serve.request.families import HY_MT15
from hymt_serve.request.protocol import TranslationRequest

SETTINGS = Settings.from_mapping(
    {"model_path": "/m", "max_new_tokens": 100, "max_texts_per_request": 3},
    environ={},
)
CARD = SETTINGS.sampling


def chat(body: Any) -> ChatRequest:
    request = parse_body(body, SETTINGS)
    assert isinstance(request, ChatRequest)
    return request


def refused(body: Any, field: str, kind: type[ServiceError] = InvalidRequest) -> str:
    with pytest.raises(kind) as caught:
        parse_body(body, SETTINGS)
    assert caught.value.field == field, caught.value.message
    return caught.value.message


USER = [{"role": "user", "content": "Hello"}]


def text_part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def test_a_conversation_becomes_turns_and_defaults_to_greedy_under_the_cap() -> None:
    request = chat(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": [text_part("Hi"), text_part("there")]},
                {"role": "assistant", "content": "Salut", "refusal": None, "tool_calls": []},
                {"role": "user", "content": "<|startoftext|>Again<|eos|>"},
            ]
        }
    )  # fmt: skip
    assert request.turns == (
        ChatTurn("system", "Be brief.\n\nAnswer in French."),
        ChatTurn("user", "Hi\nthere"),
        ChatTurn("assistant", "Salut"),
        ChatTurn("user", "<|startoftext|>Again<|eos|>"),
    )
    assert not request.completion and request.translation is None
    assert (request.max_new_tokens, request.sampling, request.n, request.stop) == (100, None, 1, ())


def test_the_request_api_body_still_parses_as_before() -> None:
    assert isinstance(parse_body({"text": "x", "target_lang": "fr"}, SETTINGS), TranslationRequest)


def test_a_prompt_is_one_user_turn() -> None:
    request = chat({"prompt": ["Say hi"], "max_tokens": 7})
    assert request.turns == (ChatTurn("user", "Say hi"),) and request.completion
    assert request.max_new_tokens == 7 and request.field == "prompt"


def test_max_tokens_is_a_ceiling_under_the_servers_cap() -> None:
    """Clients send 4096 or 8192 by default (pyvideotrans): the server's cap applies, and a
    cut reply says finish_reason "length"."""
    assert chat({"messages": USER, "max_tokens": 8192}).max_new_tokens == 100
    assert refused({"messages": USER, "max_tokens": 0}, "max_tokens")
    assert refused({"messages": USER, "max_tokens": 2.5}, "max_tokens")


@pytest.mark.parametrize(
    ("options", "sampling"),
    [
        ({}, None),
        ({"temperature": 0}, None),
        ({"temperature": 0.0, "top_p": 0.9}, None),
        ({"top_p": 0}, None),
        ({"seed": 3}, None),  # greedy is reproducible without it
        ({"temperature": 1.0}, SamplingParams(1.0, CARD.top_p, CARD.top_k)),
        ({"temperature": 0.7, "top_p": 1.0, "seed": -5}, SamplingParams(0.7, 1.0, 20, 1.05, -5)),
        ({"top_k": -1, "repetition_penalty": 1.0}, SamplingParams(0.7, 0.6, 0, 1.0)),
        ({"temperature": 2, "top_k": 50}, SamplingParams(2, 0.6, 50, 1.05)),
    ],
)  # fmt: skip
def test_sampling_follows_openai_with_the_model_cards_defaults(
    options: dict[str, Any], sampling: SamplingParams | None
) -> None:
    assert chat({"messages": USER, **options}).sampling == sampling


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": 5000}, "top_k"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"seed": 2**63}, "seed"),
        ({"seed": True}, "seed"),
        ({"n": 4}, "n"),
        ({"n": 0}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"prompt": "x"}, "prompt"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options: dict[str, Any], field: str) -> None:
    refused({"messages": USER, **options}, field)


def test_stop_n_and_stream() -> None:
    request = chat({"messages": USER, "stop": "\n", "n": 3, "stream": True})
    assert (request.stop, request.n, request.stream) == (("\n",), 3, True)
    assert chat({"messages": USER, "stop": ["a", "a", "b"]}).stop == ("a", "b")
    assert chat({"messages": USER, "stop": None}).stop == ()


def test_each_choice_of_a_seeded_request_has_a_seed_of_its_own() -> None:
    request = chat({"messages": USER, "temperature": 1, "seed": 2**63 - 1, "n": 3})
    seeds = [request.choice_sampling(i).seed for i in range(3)]  # type: ignore[union-attr]
    assert seeds[0] == 2**63 - 1 and len(set(seeds)) == 3
    assert all(-(2**63) <= s < 2**63 for s in seeds if s is not None)
    assert (seeds[1] - seeds[0]) % 2**64 == CHOICE_SEED_STEP
    unseeded = chat({"messages": USER, "temperature": 1, "n": 2})
    assert unseeded.choice_sampling(1) == unseeded.sampling


@pytest.mark.parametrize(
    ("messages", "field", "words"),
    [
        ([], "messages", "non-empty"),
        ("hi", "messages", "non-empty"),
        ([{"role": "tool", "content": "x"}, *USER], "messages[0].role", "tools"),
        ([{"role": "user", "content": "x", "name": "bob"}], "messages[0].name", "participant"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "messages[0].content[0]", "text only"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "messages[0].content[0]",
         "text only"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}, *USER],
         "messages[0].tool_calls", "no tools"),
        ([{"role": "user", "content": None}], "messages[0].content", "string"),
        ([*USER, {"role": "assistant", "content": "Hi"}], "messages", "last message"),
        ([*USER, {"role": "system", "content": "late"}, *USER], "messages", "first"),
        (["hi"], "messages[0]", "object"),
        ([{"role": "user", "content": "\ud800"}], "messages[0].content", "surrogate"),
    ],
)  # fmt: skip
def test_messages_the_template_cannot_render_are_refused(
    messages: Any, field: str, words: str
) -> None:
    assert words in refused({"messages": messages}, field)


def test_a_conversation_too_long_is_a_413() -> None:
    long = "x" * (SETTINGS.limits.max_chars_per_text + 1)
    refused({"messages": [{"role": "user", "content": long}]}, "messages", PayloadTooLarge)
    refused({"prompt": long}, "prompt", PayloadTooLarge)


def test_unknown_fields_are_refused() -> None:
    assert "unknown field" in refused({"messages": USER, "document": "x"}, "document")


def test_our_fields_make_the_last_user_message_a_translation() -> None:
    request = chat(
        {
            "messages": [{"role": "system", "content": "ignored"}, *USER],
            "target_lang": "de",
            "src_lang": "en",
            "max_tokens": 20,
            "temperature": 0.5,
        }
    )
    translation = request.translation
    assert translation is not None and translation.texts == ("Hello",) and translation.single
    assert translation.target.code == "de" and translation.source is not None
    assert translation.max_new_tokens == request.max_new_tokens == 20
    assert request.sampling == SamplingParams(0.5, 0.6, 20, 1.05)
    auto = chat({"prompt": "Bonjour tout le monde", "target_lang": "en", "source_lang": "auto"})
    assert auto.translation is not None and auto.translation.detected is not None


def test_translation_errors_name_the_field_the_client_sent() -> None:
    assert "nl-BE" in refused({"messages": USER, "target_lang": "nl-BE"}, "target_lang")
    message = refused(
        {"messages": [{"role": "user", "content": " "}], "target_lang": "de"}, "messages"
    )
    assert message.startswith("the last user message: ")
    assert refused({"prompt": " ", "target_lang": "de"}, "prompt")
    # a feature the loaded family lacks
    refused({"messages": USER, "target_lang": "de", "glossary": [["a", "b"]]}, "glossary")
    glossary = {
        "messages": USER,
        "target_lang": "de",
        "glossary": [{"source": "Hello", "target": "Hallo"}],
    }
    request = parse_body(glossary, SETTINGS, HY_MT15)
    assert isinstance(request, ChatRequest) and request.translation is not None
    assert request.translation.features.options.glossary == (("Hello", "Hallo"),)


def test_cut_at_stop_takes_the_earliest() -> None:
    assert cut_at_stop("one. two\n\nthree", ["\n\n", "."]) == ("one", True)
    assert cut_at_stop("none here", ["###"]) == ("none here", False)


def chars(ids: Sequence[int]) -> str:
    return "".join(map(chr, ids))


def test_apply_stop_counts_the_tokens_through_the_stop_string() -> None:
    text = "Hallo Welt.\n\nExtra"
    result = GenerationResult(text, tuple(map(ord, text)), "length")
    stopped = apply_stop(result, ["\n\n"], chars)
    assert stopped == GenerationResult("Hallo Welt.", tuple(map(ord, "Hallo Welt.\n\n")), "stop")
    assert apply_stop(result, ["zzz"], chars) is result


def test_render_chat_counts_the_prompt_once() -> None:
    request = chat({"messages": USER, "n": 2})
    results = [GenerationResult("a", (1,), "stop"), GenerationResult("bc", (2, 3), "length")]
    body = render_chat(request, results, 9, "chat", "req-1")
    assert body == {
        "choices": [
            {"index": 0, "text": "a", "finish_reason": "stop", "output_tokens": 1},
            {"index": 1, "text": "bc", "finish_reason": "length", "output_tokens": 2},
        ],
        "prompt": "chat",
        "usage": {"input_tokens": 9, "output_tokens": 3},
        "request_id": "req-1",
    }


def stream_of(tokens: str, stop: Sequence[str], final: str | None = None) -> list[str]:
    sent: list[str] = []
    stream = ChoiceStream(chars, sent.append, stop)
    for token in tokens:
        stream.push([ord(token)])
    stream.finish(tokens if final is None else final)
    return sent


def test_a_streamed_choice_never_sends_a_stop_string_or_part_of_one() -> None:
    sent = stream_of("Hi #and ## more", ["##"])
    assert "".join(sent) == "Hi #and "
    assert "#a" in sent  # a "#" waits for the next character: "#a" begins no stop string


def test_a_streamed_choice_sends_held_text_that_was_no_stop_string() -> None:
    sent = stream_of("a\nb\n", ["\n\n"])
    assert "".join(sent) == "a\nb\n"  # the held line break goes out at the end
    assert stream_of("abc", []) == ["a", "b", "c"]
