"""What a translation memory entry is keyed on, and which rows and requests may use it.

A row's key (:func:`row_key`) is a hash of everything that decides its output: the model's
identity (:func:`model_identity`: its files and precision), the namespace (a client key's name
when the memory is isolated per key, else ""), the prompt's token ids (they hold the family's
template, the prompt fields, the target and the glossary), ``max_new_tokens``, the stop strings
and, for a seeded sampled row, every sampling value and the seed. A plain sentence request
(text, languages, limit: nothing else) also gets :func:`plain_key` for each text, which the web
front end computes from the request alone, without a tokenizer, to answer a request whose texts
are all in the memory without TorchServe.

Which rows use the memory (:func:`uses_memory`): a greedy row unless its request says
``"cache": false``; a sampled row only when its request says ``"cache": true`` and it has a
seed (without one a draw is not meant to repeat). ``"cache": true`` on a sampled request
without a seed is refused (400), as the client asked for what cannot be.
"""

from __future__ import annotations

import array
import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hymt_serve.core.types import GenerationRow
from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.features import Features
from hymt_serve.request.protocol import TranslationRequest, decode_body
from hymt_serve.request.values import brief

LAYOUT = 1  # of the keys: a change makes every older entry unreachable (it ages out)
CACHE_FIELD = "cache"
NAMESPACE_FIELD = "cache_namespace"  # set by the web front end: the client key's name
MAX_NAMESPACE_CHARS = 200  # the column's size (a client key's name)
# A model's files read into its identity: the config, the tokenizer and template files whole,
# each weight file's name, size, safetensors header and SAMPLES blocks of its bytes (a model
# trained again keeps its names and shapes; its weights' bytes change everywhere).
WHOLE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "hymt_family.txt",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
SAMPLES, SAMPLE_BYTES = 16, 4096
HEADER_LIMIT = 64 * 1024 * 1024  # a safetensors header past this is not one


@dataclass(frozen=True)
class Choice:
    """A request's own say about the memory: ``cache`` (None: not said) and its namespace
    (None: not named; with the memory isolated per key such a request does not use it)."""

    cache: bool | None = None
    namespace: str | None = None


def take_choice(body: Any) -> tuple[Any, Choice]:
    """The request body without the memory's fields, and what they said. A body that is not
    a JSON object is returned as it is (the request's parser refuses it). Raises
    InvalidRequest for a field of the wrong type (or for bytes that are no JSON object)."""
    if isinstance(body, (bytes, bytearray)):  # a JSON body TorchServe left undecoded
        body = decode_body(bytes(body))
    if not isinstance(body, dict) or not ({CACHE_FIELD, NAMESPACE_FIELD} & body.keys()):
        return body, Choice()
    rest = dict(body)
    cache, namespace = rest.pop(CACHE_FIELD, None), rest.pop(NAMESPACE_FIELD, None)
    if cache is not None and not isinstance(cache, bool):
        raise InvalidRequest(
            f"cache must be true or false, got {brief(cache)}",
            allowed="true, false",
            field=CACHE_FIELD,
        )
    if namespace is not None and (
        not isinstance(namespace, str) or len(namespace) > MAX_NAMESPACE_CHARS
    ):
        raise InvalidRequest(
            f"cache_namespace must be a string of at most {MAX_NAMESPACE_CHARS} characters, "
            f"got {brief(namespace)}",
            allowed=f"a string of at most {MAX_NAMESPACE_CHARS} characters",
            field=NAMESPACE_FIELD,
        )
    return rest, Choice(cache, namespace)


def check_choice(choice: Choice, sampled: bool, seeded: bool) -> None:
    """Refuse ``"cache": true`` on a sampled request without a seed (InvalidRequest)."""
    if choice.cache and sampled and not seeded:
        raise InvalidRequest(
            '"cache": true on a sampled request needs a seed: without one a draw is not meant '
            "to repeat",
            allowed='a "seed", or "cache" left out',
            field=CACHE_FIELD,
        )


def uses_memory(row: GenerationRow, choice: Choice) -> bool:
    """Whether ``row`` is looked up in the memory and kept there (the module's rule)."""
    if choice.cache is False:
        return False
    if row.sampling is None:
        return True
    return choice.cache is True and row.sampling.seed is not None


def row_key(model: str, namespace: str, row: GenerationRow) -> str:
    """The memory key of ``row`` for the model ``model`` (:func:`model_identity`)."""
    sampling = asdict(row.sampling) if row.sampling is not None else None
    head = [LAYOUT, "row", model, namespace, row.max_new_tokens, list(row.stop), sampling]
    digest = hashlib.sha256(json.dumps(head, separators=(",", ":")).encode())
    digest.update(array.array("q", row.prompt_ids).tobytes())
    return digest.hexdigest()


def is_plain(request: TranslationRequest) -> bool:
    """A plain sentence request: texts, named or absent source, target, limit; greedy, no
    document, no family field (what the front end answers from the memory itself)."""
    return (
        request.document is None
        and request.sampling is None
        and request.detected is None
        and request.features == Features()
    )


def plain_key(
    model: str, namespace: str, family: str, request: TranslationRequest, index: int
) -> str:
    """The front end's key of text ``index`` of a plain request (:func:`is_plain`) to the
    model ``model`` served with the prompt family ``family``: the text, the languages and the
    limit decide its prompt for that family, so they decide its translation."""
    source = request.source.code if request.source is not None else None
    head = [LAYOUT, "plain", model, namespace, family, source, request.target.code]
    head += [request.max_new_tokens, request.texts[index]]
    return hashlib.sha256(json.dumps(head, separators=(",", ":")).encode()).hexdigest()


def marker_key(model_name: str) -> str:
    """The key of the entry naming the model a worker of TorchServe's ``model_name`` loaded
    last (its identity as the entry's text): the front end serves only that model's entries."""
    return hashlib.sha256(json.dumps([LAYOUT, "marker", model_name]).encode()).hexdigest()


def model_identity(folder: Path, precision: Mapping[str, Any]) -> str:
    """A hash of what decides a model's outputs, read cheaply: the config, tokenizer and
    template files, each weight file's name, size, safetensors header and sampled bytes, and
    ``precision`` (quantization, dtype). Another model, other weights or another precision
    give another identity, so the memory never serves them the old model's entries."""
    files: dict[str, Any] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name in WHOLE_FILES or path.name.endswith(".index.json"):
            files[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.suffix in WEIGHT_SUFFIXES:
            files[path.name] = _weights_print(path)
    facts = {"layout": LAYOUT, "files": files, "precision": dict(precision)}
    canonical = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _weights_print(path: Path) -> dict[str, Any]:
    """A weight file's size, its safetensors header's hash, and a hash of SAMPLES blocks of
    its bytes spread over the file."""
    size = path.stat().st_size
    sampled = hashlib.sha256()
    header: str | None = None
    with path.open("rb") as file:
        if path.suffix == ".safetensors" and size >= 8:
            (length,) = struct.unpack("<Q", file.read(8))
            if length <= HEADER_LIMIT:
                header = hashlib.sha256(file.read(length)).hexdigest()
        for sample in range(SAMPLES):
            file.seek(size * sample // SAMPLES)
            sampled.update(file.read(SAMPLE_BYTES))
    return {"bytes": size, "header": header, "sampled": sampled.hexdigest()}
