"""KServe's Open Inference Protocol (v2) on TorchServe's inference port: a v2 request becomes a
body of the request API, and that request's reply becomes a v2 response.

Pure Python. TorchServe 0.12.0 hands ``POST /v2/models/<name>/infer`` to the handler like any
prediction, with the body only (the path is not passed on), so a v2 request is known by its
body: a JSON object with ``inputs`` (the request API has no such field), or bytes with the
binary tensor extension's ``Inference-Header-Content-Length`` header. Request::

    {"id": "42",                                    optional; the response carries it back
     "parameters": {"target_lang": "de", "source_lang": "en", "max_new_tokens": 64},
     "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                 "data": ["Good morning.", "See you."]}],
     "outputs": [{"name": "translation"}]}          optional: only these outputs

Inputs (all BYTES): ``text`` [n] (or [n, 1]); ``document`` [1] instead of text; ``glossary``
[g, 2] (source term, target term); ``preferences`` [p]; ``candidates`` [n, k] (Chimera). The
request parameters are the request API's scalar fields: ``target_lang``, ``source_lang``,
``max_new_tokens``, ``sampling`` and its four settings, ``context``, ``preserve_format``,
``style``, ``delimiters``, ``data_format``, ``format``, ``previous_context``. Texts:
``translation``, ``finish_reason``, ``template`` (BYTES [n]), ``input_tokens``,
``output_tokens`` (INT64 [n]) and ``format_tags_lost`` (INT64 [n], with markup); a
document: ``document`` (BYTES [1]). The response parameters carry the languages, the token
totals and TorchServe's ``request_id``.

Outputs always come as JSON (``binary_data_output`` is accepted; clients read JSON data as
well). Errors keep the request API's JSON body, whose ``error`` the protocol names.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.protocol import decode_body
from hymt_serve.request.values import brief

BINARY_HEADER = "inference-header-content-length"
PARAMETERS = (
    "target_lang",
    "tgt_lang",
    "source_lang",
    "src_lang",
    "max_new_tokens",
    "sampling",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "context",
    "preserve_format",
    "style",
    "delimiters",
    "data_format",
    "format",
    "previous_context",
    "cache",  # the translation memory's switch (docs/translation-memory.md)
)
PROTOCOL_PARAMETERS = ("binary_data_output",)  # the binary extension's: answered in JSON
INPUT_PARAMETERS = ("binary_data_size", "content_type")
# Each input: its rank-2 width (None: a list; 2: pairs; 0: k per text, any k).
INPUTS = {"text": None, "document": None, "glossary": 2, "preferences": None, "candidates": 0}
TEXT_OUTPUTS = (
    "translation",
    "finish_reason",
    "template",
    "input_tokens",
    "output_tokens",
    "format_tags_lost",
    "target_language",
)
DOCUMENT_OUTPUTS = ("document",)


@dataclass(frozen=True)
class Call:
    """What the v2 response of one request needs from its request."""

    id: str | None  # the client's request id, answered back
    outputs: tuple[str, ...] | None  # the outputs asked for (None: every one)

    def response(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """The v2 response for the request API's 200 ``body``."""
        if "document" in body:
            outputs = [_tensor("document", "BYTES", [body["document"]])]
            parameters: dict[str, Any] = {
                "format": body["format"],
                "segments": body["segments"],
                "segments_cut": body["finish_reasons"].get("length", 0),
                "untranslated_segments": body["untranslated_segments"],
                "format_tags_lost": body["format_tags_lost"],
            }
            if "target_languages" in body:  # the language check's outcome, when it ran
                parameters["target_language"] = body["target_language"]
                parameters["segments_retried"] = body["target_languages"]["retried"]
                parameters["segments_mismatched"] = body["target_languages"]["mismatch"]
        else:
            outputs = list(_text_outputs(body["translations"]))
            parameters = {}
        if self.outputs is not None:
            outputs = [tensor for tensor in outputs if tensor["name"] in self.outputs]
        parameters.update(target_lang=body["target_lang"], request_id=body["request_id"])
        if body.get("source_lang") is not None:
            parameters["source_lang"] = body["source_lang"]
        parameters.update(body["usage"])
        return {
            "model_name": model,
            "id": self.id if self.id is not None else body["request_id"],
            "parameters": parameters,
            "outputs": outputs,
        }


def unwrap(body: Any, headers: Mapping[str, Any] | None) -> tuple[Any, Call | None]:
    """``(body of the request API, its Call)`` for a v2 request, ``(body, None)`` for any other.

    Raises InvalidRequest for a v2 request that is malformed or asks for what the API lacks.
    """
    length = _binary_length(headers or {})
    if length is None and not (isinstance(body, dict) and "inputs" in body):
        return body, None
    tail = b""
    if length is not None:
        if not isinstance(body, (bytes, bytearray)) or length > len(body):
            raise InvalidRequest(
                f"{BINARY_HEADER} is {length}, but the body is not that many bytes long",
                allowed="the JSON header's length in bytes, then the binary tensors",
                field=BINARY_HEADER,
            )
        body, tail = decode_body(bytes(body[:length])), bytes(body[length:])
    request = _object(decode_body(body), "the request")
    fields = _parameters(request.get("parameters"))
    fields.update(_inputs(request.get("inputs"), tail))
    outputs = _requested(request.get("outputs"), document="document" in fields)
    call_id = request.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidRequest(f"id must be a string, got {brief(call_id)}", field="id")
    return fields, Call(call_id, outputs)


def holds_document(body: Mapping[str, Any]) -> bool:
    """Whether a v2 request body (JSON) carries a ``document`` input."""
    inputs = body.get("inputs")
    return isinstance(inputs, list) and any(
        isinstance(tensor, dict) and tensor.get("name") == "document" for tensor in inputs
    )


def _binary_length(headers: Mapping[str, Any]) -> int | None:
    for name, value in headers.items():
        if str(name).lower() == BINARY_HEADER:
            if not (isinstance(value, str) and value.isdigit()):
                raise InvalidRequest(
                    f"{BINARY_HEADER} must be a byte count, got {brief(value)}",
                    field=BINARY_HEADER,
                )
            return int(value)
    return None


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object, got {brief(value)}")
    return value


def _parameters(value: Any) -> dict[str, Any]:
    """The request parameters as fields of the request API (scalars only, as v2 has them)."""
    fields: dict[str, Any] = {}
    for name, item in _object(value if value is not None else {}, "parameters").items():
        if name in PROTOCOL_PARAMETERS:
            continue
        if name not in PARAMETERS:
            hint = " (v2 has no streaming: stream over /predictions/<model>)"
            raise InvalidRequest(
                f"unknown parameter {brief(name)}" + (hint if name == "stream" else ""),
                allowed=[*PARAMETERS, *PROTOCOL_PARAMETERS],
                field=f"parameters.{name}",
            )
        if isinstance(item, (dict, list)):
            raise InvalidRequest(
                f"parameter {name} must be a string, number or boolean, got {brief(item)}",
                field=f"parameters.{name}",
            )
        fields[name] = item
    return fields


def _inputs(value: Any, tail: bytes) -> dict[str, Any]:
    """The input tensors as fields of the request API, reading binary data from ``tail``."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "inputs must be a non-empty list of tensors",
            allowed={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": []}]},
            field="inputs",
        )
    fields: dict[str, Any] = {}
    chunks = _Chunks(tail)
    for tensor in value:
        name, strings, shape = _strings(_object(tensor, "each input"), chunks)
        if name in fields:
            raise InvalidRequest(f"input {name!r} is given twice", field=f"inputs.{name}")
        fields[name] = _field(name, strings, shape)
    chunks.check_used()
    if "text" not in fields and "document" not in fields:
        raise InvalidRequest(
            "the inputs hold no 'text' (or 'document') tensor",
            allowed=list(INPUTS),
            field="inputs",
        )
    return fields


def _strings(tensor: Mapping[str, Any], chunks: _Chunks) -> tuple[str, list[str], list[int]]:
    """One BYTES tensor's name, elements (UTF-8 text, row-major) and shape."""
    name = tensor.get("name")
    if name not in INPUTS:
        raise InvalidRequest(
            f"unknown input {brief(name)}", allowed=list(INPUTS), field="inputs.name"
        )
    where = f"inputs.{name}"
    if tensor.get("datatype") != "BYTES":
        raise InvalidRequest(
            f"input {name} must have datatype BYTES, got {brief(tensor.get('datatype'))}",
            allowed="BYTES",
            field=where,
        )
    shape = tensor.get("shape")
    if not (
        isinstance(shape, list)
        and shape
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise InvalidRequest(f"input {name} has shape {brief(shape)}", field=where)
    parameters = _object(tensor.get("parameters") or {}, f"input {name}'s parameters")
    for key in parameters:
        if key not in INPUT_PARAMETERS:
            raise InvalidRequest(
                f"unknown parameter {brief(key)} of input {name}",
                allowed=list(INPUT_PARAMETERS),
                field=where,
            )
    if "binary_data_size" in parameters:
        elements = chunks.strings(parameters["binary_data_size"], where)
    else:
        elements = list(_flat(tensor.get("data"), where))
    if len(elements) != math.prod(shape):
        raise InvalidRequest(
            f"input {name} has {len(elements)} elements for its shape {shape}", field=where
        )
    return name, elements, shape


def _flat(data: Any, where: str) -> Iterator[str]:
    """The strings of a (possibly nested) JSON array, row-major."""
    if not isinstance(data, list):
        raise InvalidRequest(f"{where} needs its data as a JSON array", field=where)
    for item in data:
        if isinstance(item, list):
            yield from _flat(item, where)
        elif isinstance(item, str):
            yield item
        else:
            raise InvalidRequest(f"{where} holds {brief(item)}, not a string", field=where)


def _field(name: str, strings: list[str], shape: Sequence[int]) -> Any:
    """The request API's value for input ``name`` of that shape."""
    width = INPUTS[name]
    where = f"inputs.{name}"
    if width is None and (len(shape) > 2 or (len(shape) == 2 and shape[1] != 1)):
        raise InvalidRequest(
            f"input {name} must have shape [n] or [n, 1], got {list(shape)}", field=where
        )
    if width is not None and (len(shape) != 2 or (width and shape[1] != width)):
        wanted = f"[g, {width}]" if width else "[n, k]"
        raise InvalidRequest(
            f"input {name} must have shape {wanted}, got {list(shape)}", field=where
        )
    if name == "document":
        if len(strings) != 1:
            raise InvalidRequest(f"input document must hold one element, got {len(strings)}")
        return strings[0]
    if name == "glossary":
        return [
            {"source": s, "target": t} for s, t in zip(strings[::2], strings[1::2], strict=True)
        ]
    if name == "candidates":
        k = shape[1]
        return [strings[row * k : (row + 1) * k] for row in range(shape[0])]
    return strings


def _requested(value: Any, document: bool) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = DOCUMENT_OUTPUTS if document else TEXT_OUTPUTS
    if not isinstance(value, list):
        raise InvalidRequest(f"outputs must be a list, got {brief(value)}", field="outputs")
    asked: list[str] = []
    for item in value:
        name = _object(item, "each requested output").get("name")
        if not isinstance(name, str) or name not in names:
            raise InvalidRequest(
                f"unknown output {brief(name)}", allowed=list(names), field="outputs"
            )
        asked.append(name)
    return tuple(asked)


def _text_outputs(items: Sequence[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    yield _tensor("translation", "BYTES", [item["text"] for item in items])
    yield _tensor("finish_reason", "BYTES", [item["finish_reason"] for item in items])
    yield _tensor("template", "BYTES", [item["template"] for item in items])
    yield _tensor("input_tokens", "INT64", [item["input_tokens"] for item in items])
    yield _tensor("output_tokens", "INT64", [item["output_tokens"] for item in items])
    if any("format_tags_lost" in item for item in items):
        lost = [item.get("format_tags_lost", 0) for item in items]
        yield _tensor("format_tags_lost", "INT64", lost)
    if all("target_language" in item for item in items):  # the language check ran
        yield _tensor("target_language", "BYTES", [item["target_language"] for item in items])


def _tensor(name: str, datatype: str, data: list[Any]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [len(data)], "data": data}


class _Chunks:
    """The binary tensor extension's data after the JSON header, taken input by input."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def strings(self, size: Any, where: str) -> list[str]:
        """One BYTES tensor of ``size`` bytes: elements as a 4-byte little-endian length and
        that many bytes of UTF-8."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidRequest(f"{where}'s binary_data_size is {brief(size)}", field=where)
        if self.at + size > len(self.data):
            raise InvalidRequest(
                f"{where}'s binary_data_size ({size}) runs past the body's end", field=where
            )
        raw, self.at = self.data[self.at : self.at + size], self.at + size
        elements, offset = [], 0
        while offset < len(raw):
            if offset + 4 > len(raw):
                raise InvalidRequest(f"{where}'s binary data ends inside a length", field=where)
            (length,) = struct.unpack_from("<I", raw, offset)
            piece = raw[offset + 4 : offset + 4 + length]
            if len(piece) != length:
                raise InvalidRequest(f"{where}'s binary data ends inside an element", field=where)
            try:
                elements.append(piece.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InvalidRequest(
                    f"{where} element {len(elements)} is not UTF-8 text", field=where
                ) from exc
            offset += 4 + length
        return elements

    def check_used(self) -> None:
        if self.at != len(self.data):
            raise InvalidRequest(
                f"{len(self.data) - self.at} bytes after the JSON header belong to no input",
                allowed="binary_data_size on each binary input, adding up to the data sent",
                field=BINARY_HEADER,
            )
