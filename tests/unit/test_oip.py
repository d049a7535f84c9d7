"""KServe's Open Inference Protocol (v2) requests as request API bodies, and replies back."""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import pytest

from hymt_serve.core.settings import Settings
from hymt_serve.request import oip
from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.protocol import parse_request

JSON_HEADERS = {"Content-Type": "application/json", "explain": "False"}


def text_input(*texts: str, shape: list[int] | None = None) -> dict[str, Any]:
    return {
        "name": "text",
        "datatype": "BYTES",
        "shape": shape or [len(texts)],
        "data": list(texts),
    }


def v2(*inputs: dict[str, Any], **parameters: Any) -> dict[str, Any]:
    return {"inputs": list(inputs), "parameters": parameters}


def serialized(*texts: str) -> bytes:
    """BYTES elements as the binary tensor extension writes them."""
    return b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)


def test_a_body_without_inputs_is_left_to_the_request_api() -> None:
    body = {"text": "hi", "target_lang": "de"}
    assert oip.unwrap(body, JSON_HEADERS) == (body, None)
    assert oip.unwrap(b"raw", JSON_HEADERS) == (b"raw", None)


def test_texts_and_parameters_become_request_fields() -> None:
    body = v2(
        text_input("Good morning.", "See you.", "早上好"),
        target_lang="de",
        source_lang="en",
        max_new_tokens=32,
        sampling=True,
        top_k=5,
    )
    body["id"] = "call-7"
    fields, call = oip.unwrap(body, JSON_HEADERS)
    assert fields == {
        "text": ["Good morning.", "See you.", "早上好"],
        "target_lang": "de",
        "source_lang": "en",
        "max_new_tokens": 32,
        "sampling": True,
        "top_k": 5,
    }
    assert call == oip.Call("call-7", None)
    request = parse_request(fields, Settings(model_path="/unused"))
    assert request.texts == ("Good morning.", "See you.", "早上好") and not request.single


def test_a_column_of_texts_and_nested_data_are_read_row_major() -> None:
    tensor = {"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], ["b"]]}
    fields, _ = oip.unwrap(v2(tensor, target_lang="fr"), {})
    assert fields["text"] == ["a", "b"]


def test_glossary_preferences_and_candidates_come_as_tensors() -> None:
    glossary = {
        "name": "glossary",
        "datatype": "BYTES",
        "shape": [2, 2],
        "data": ["Hunyuan", "混元", "GPU", "图形处理器"],
    }
    candidates = {"name": "candidates", "datatype": "BYTES", "shape": [1, 3], "data": list("xyz")}
    preferences = {"name": "preferences", "datatype": "BYTES", "shape": [1], "data": ["brief"]}
    fields, _ = oip.unwrap(
        v2(text_input("t"), glossary, candidates, preferences, target_lang="zh"), {}
    )
    assert fields["glossary"] == [
        {"source": "Hunyuan", "target": "混元"},
        {"source": "GPU", "target": "图形处理器"},
    ]
    assert fields["candidates"] == [["x", "y", "z"]]
    assert fields["preferences"] == ["brief"]


def test_binary_tensors_after_the_json_header() -> None:
    raw = serialized("Grüß Gott", "", "你好")
    header = {
        "inputs": [
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [3],
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "parameters": {"target_lang": "en", "binary_data_output": True},
    }
    head = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))}
    fields, call = oip.unwrap(bytearray(head + raw), headers)
    assert fields == {"text": ["Grüß Gott", "", "你好"], "target_lang": "en"}
    assert call is not None and call.outputs is None


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (v2(), {}, "inputs must be a non-empty list"),
        ({"inputs": "text"}, {}, "inputs must be a non-empty list"),
        (v2(text_input("a"), stream=True), {}, "v2 has no streaming"),
        (v2(text_input("a"), target="de"), {}, "unknown parameter 'target'"),
        (v2(text_input("a"), context=["x"]), {}, "must be a string, number or boolean"),
        (v2({**text_input("a"), "datatype": "FP32"}), {}, "must have datatype BYTES"),
        (v2({**text_input("a"), "name": "texts"}), {}, "unknown input 'texts'"),
        (v2(text_input("a", "b", shape=[3])), {}, "has 2 elements for its shape [3]"),
        (v2(text_input("a", "b", shape=[1, 2])), {}, "must have shape [n] or [n, 1]"),
        (v2({**text_input("a"), "shape": [-1]}), {}, "has shape [-1]"),
        (v2({**text_input("a"), "data": [1]}), {}, "holds 1, not a string"),
        (v2({**text_input("a"), "data": "a"}), {}, "needs its data as a JSON array"),
        (v2(text_input("a"), text_input("b")), {}, "input 'text' is given twice"),
        (
            v2({"name": "glossary", "datatype": "BYTES", "shape": [3], "data": ["a", "b", "c"]}),
            {},
            "must have shape [g, 2]",
        ),
        (
            v2({**text_input("a"), "parameters": {"shm_region": "x"}}),
            {},
            "unknown parameter 'shm_region' of input text",
        ),
        ({**v2(text_input("a")), "outputs": [{"name": "logits"}]}, {}, "unknown output 'logits'"),
        ({**v2(text_input("a")), "id": 7}, {}, "id must be a string"),
        (
            v2({"name": "preferences", "datatype": "BYTES", "shape": [1], "data": ["p"]}),
            {},
            "no 'text' (or 'document')",
        ),
        (b"{}", {"inference-header-content-length": "x1"}, "must be a byte count"),
        (b"{}", {"inference-header-content-length": "99"}, "not that many bytes long"),
    ],
)
def test_malformed_v2_requests_are_400s_that_say_what(
    body: Any, headers: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        oip.unwrap(body, headers)


@pytest.mark.parametrize(
    ("raw", "size", "message"),
    [
        (serialized("ab"), 99, "runs past the body's end"),
        (serialized("ab")[:-1], None, "ends inside an element"),
        (serialized("ab") + b"\x01", None, "ends inside a length"),
        (struct.pack("<I", 1) + b"\xff", None, "element 0 is not UTF-8"),
        (serialized("ab") + b"extra", len(serialized("ab")), "5 bytes after the JSON header"),
    ],
)
def test_broken_binary_tensors_are_400s(raw: bytes, size: int | None, message: str) -> None:
    tensor = {
        "name": "text",
        "datatype": "BYTES",
        "shape": [1],
        "parameters": {"binary_data_size": len(raw) if size is None else size},
    }
    head = json.dumps(v2(tensor, target_lang="de")).encode()
    with pytest.raises(InvalidRequest, match=message):
        oip.unwrap(head + raw, {"inference-header-content-length": str(len(head))})


def reply_body(**more: Any) -> dict[str, Any]:
    return {
        "translations": [
            {
                "text": "Bonjour.",
                "input_tokens": 20,
                "output_tokens": 3,
                "finish_reason": "stop",
                "template": "en",
            },
            {
                "text": "À demain",
                "input_tokens": 21,
                "output_tokens": 4,
                "finish_reason": "length",
                "template": "en",
            },
        ],
        "source_lang": None,
        "target_lang": "fr",
        "usage": {"input_tokens": 41, "output_tokens": 7},
        "request_id": "ts-1",
        **more,
    }


def test_translations_become_output_tensors() -> None:
    response = oip.Call(None, None).response(reply_body(), "hunyuan-mt")
    assert response["model_name"] == "hunyuan-mt" and response["id"] == "ts-1"
    assert response["parameters"] == {
        "target_lang": "fr",
        "request_id": "ts-1",
        "input_tokens": 41,
        "output_tokens": 7,
    }
    outputs = {tensor["name"]: tensor for tensor in response["outputs"]}
    assert list(outputs) == [
        "translation",
        "finish_reason",
        "template",
        "input_tokens",
        "output_tokens",
    ]
    assert outputs["translation"] == {
        "name": "translation",
        "datatype": "BYTES",
        "shape": [2],
        "data": ["Bonjour.", "À demain"],
    }
    assert outputs["output_tokens"]["datatype"] == "INT64"
    assert outputs["output_tokens"]["data"] == [3, 4]


def test_the_language_checks_outcome_is_an_output_tensor_and_document_parameters() -> None:
    body = reply_body()
    for item, outcome in zip(body["translations"], ("ok", "retried"), strict=True):
        item["target_language"] = outcome
    outputs = {t["name"]: t for t in oip.Call(None, None).response(body, "m")["outputs"]}
    assert outputs["target_language"]["data"] == ["ok", "retried"]
    assert "target_language" not in {  # the check off: no tensor
        t["name"] for t in oip.Call(None, None).response(reply_body(), "m")["outputs"]
    }
    _, call = oip.unwrap({**v2(text_input("a"), target_lang="fr"),
                          "outputs": [{"name": "target_language"}]}, {})  # fmt: skip
    assert call is not None
    assert [t["name"] for t in call.response(body, "m")["outputs"]] == ["target_language"]
    document = {"document": "x", "format": "text", "segments": 3, "finish_reasons": {"stop": 3},
                "untranslated_segments": 0, "format_tags_lost": 0, "target_language": "mismatch",
                "target_languages": {"ok": 1, "retried": 1, "mismatch": 1}}  # fmt: skip
    parameters = oip.Call(None, None).response(reply_body(**document), "m")["parameters"]
    assert parameters["target_language"] == "mismatch"
    assert (parameters["segments_retried"], parameters["segments_mismatched"]) == (1, 1)


def test_only_the_outputs_asked_for_and_the_clients_id() -> None:
    body = {**v2(text_input("a"), target_lang="fr"), "id": "mine"}
    body["outputs"] = [{"name": "finish_reason"}, {"name": "translation"}]
    _, call = oip.unwrap(body, {})
    assert call is not None
    response = call.response(reply_body(source_lang="en"), "m")
    assert [t["name"] for t in response["outputs"]] == ["translation", "finish_reason"]
    assert response["id"] == "mine" and response["parameters"]["source_lang"] == "en"


def test_a_document_is_one_tensor_each_way() -> None:
    tensor = {"name": "document", "datatype": "BYTES", "shape": [1], "data": ["# Title\n\nText."]}
    body = v2(tensor, target_lang="de", format="markdown")
    assert oip.holds_document(body)
    fields, call = oip.unwrap(body, {})
    assert fields == {"document": "# Title\n\nText.", "target_lang": "de", "format": "markdown"}
    assert call is not None
    reply = {
        "document": "# Titel\n\nText.",
        "format": "markdown",
        "segments": 2,
        "finish_reasons": {"stop": 1, "length": 1},
        "untranslated_segments": 0,
        "format_tags_lost": 0,
        "source_lang": None,
        "target_lang": "de",
        "usage": {"input_tokens": 50, "output_tokens": 9},
        "request_id": "ts-2",
    }
    response = call.response(reply, "m")
    assert response["outputs"] == [
        {"name": "document", "datatype": "BYTES", "shape": [1], "data": ["# Titel\n\nText."]}
    ]
    assert response["parameters"]["segments_cut"] == 1
    assert response["parameters"]["segments"] == 2
    with pytest.raises(InvalidRequest, match="unknown output 'translation'"):
        oip.unwrap({**body, "outputs": [{"name": "translation"}]}, {})
