"""Rendering the response of a request whose texts (or document segments) were translated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hymt_serve.core.types import GenerationResult
from hymt_serve.request.detect import Detection
from hymt_serve.request.documents import Document
from hymt_serve.request.language_retry import TargetLanguage, counts, worst
from hymt_serve.request.markup import Markup, restore, unwrap_target
from hymt_serve.request.prompts import Template
from hymt_serve.request.protocol import TranslationRequest


def render_response(
    request: TranslationRequest,
    results: Sequence[GenerationResult],
    input_tokens: Sequence[int],
    templates: Sequence[Template],
    markups: Sequence[Markup | None],
    request_id: str | None,
    document: Document | None = None,
    target_language: Sequence[TargetLanguage] | None = None,
) -> dict[str, Any]:
    """The JSON response for a request whose texts (or document segments) were all translated.

    ``finish_reason`` "length" says max_new_tokens cut the text. The formatted template's
    answer loses its ``<target>`` wrapper; text with markup behind ``<sN>`` tags gets it back
    (with how many tags the model lost; in a document, lost code and URLs are kept at the
    segment's end); a refined text lists the candidates it came from. With ``source_lang``
    "auto" each translation (and a document's reply) says what was ``detected``. With the
    language check on (``target_language``: each row's ok, retried or mismatch) each
    translation says its own, a single text and a document also at the top (a document: the
    worst of its segments', and how many segments had each).
    """
    detections = request.detected
    items = []
    for index, (result, n_in, template, markup) in enumerate(
        zip(results, input_tokens, templates, markups, strict=True)
    ):
        item: dict[str, Any] = {
            "text": result.text,
            "input_tokens": n_in,
            "output_tokens": result.output_tokens,
            "finish_reason": result.finish_reason,
            "template": template,
        }
        if template == "formatted":
            item["text"] = unwrap_target(result.text)
        if markup is not None and (markup.opens or template == "formatted"):
            item["text"], item["format_tags_lost"] = restore(item["text"], markup, keep_lost=True)
        if request.features.candidates:
            item["candidates"] = list(request.features.candidates[index])
        if detections is not None and document is None:
            item["detected"] = _detected(detections[index])
        if target_language is not None and document is None:
            item["target_language"] = target_language[index]
        items.append(item)
    response: dict[str, Any] = {}
    if document is not None:
        response.update(_document_reply(document, items))
    else:
        if request.single:
            response["translation"] = items[0]["text"]
        response["translations"] = items
    if detections is not None and (document is not None or request.single):
        response["detected"] = _detected(detections[0])
    if target_language is not None and (document is not None or request.single):
        response["target_language"] = worst(target_language)
        if document is not None:
            response["target_languages"] = counts(target_language)
    response.update(
        source_lang=request.source.code if request.source else None,
        target_lang=request.target.code,
        usage={
            "input_tokens": sum(input_tokens),
            "output_tokens": sum(r.output_tokens for r in results),
        },
        request_id=request_id,
    )
    return response


def _detected(found: Detection | None) -> dict[str, Any] | None:
    """A detection as the reply shows it: ``{"language", "confidence"}``, or null when unsure."""
    if found is None:
        return None
    return {"language": found.language, "confidence": round(found.confidence, 3)}


def _document_reply(document: Document, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A document's reply: the document rebuilt around its translated segments (a segment the
    model answered with nothing keeps its source text), and counts of how that went."""
    texts = [
        str(item["text"]).strip() or segment
        for item, segment in zip(items, document.segments, strict=True)
    ]
    reasons: dict[str, int] = {}
    for item in items:
        reasons[item["finish_reason"]] = reasons.get(item["finish_reason"], 0) + 1
    return {
        **document.reply_fields(texts),  # a resumed document's: with its segments' texts
        "format": document.format,
        "segments": len(items),
        "finish_reasons": reasons,
        "untranslated_segments": sum(not str(item["text"]).strip() for item in items),
        "format_tags_lost": sum(item.get("format_tags_lost", 0) for item in items),
    }
