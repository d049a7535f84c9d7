"""Tokenising: a valid request's prompts built and tokenised into engine rows.

:class:`Prepared` is a request ready for the engine; :class:`Tokeniser` makes one from a
translation request (a row per text), a document request (a row per segment) or a chat form
request (a row per choice), raising PayloadTooLarge where a prompt is too long.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import ChatTurn, GenerationRow
from hymt_serve.request.chat import CHAT_TEMPLATE, ChatRequest
from hymt_serve.request.document_fields import DocumentInput
from hymt_serve.request.document_resume import resume
from hymt_serve.request.documents import MARKUP_KIND, Document, split_document
from hymt_serve.request.errors import PayloadTooLarge, ServiceError, as_service_error
from hymt_serve.request.families import Profile
from hymt_serve.request.markup import Markup, to_tags
from hymt_serve.request.prompts import PromptOptions, Template, build_prompt
from hymt_serve.request.protocol import TranslationRequest


class Encoder(Protocol):
    """What tokenising needs from the engine."""

    def encode_prompt(self, user_turn: str) -> list[int]:
        """Token ids of ``user_turn`` rendered as one user turn by the chat template."""
        ...

    def encode_chat(self, turns: Sequence[ChatTurn]) -> list[int]:
        """Token ids of a conversation rendered by the chat template (texts as text)."""
        ...


@dataclass(frozen=True)
class Prepared:
    """A valid request with its prompts tokenised (a chat form request: a row per choice)."""

    request: TranslationRequest | ChatRequest
    rows: tuple[GenerationRow, ...]
    templates: tuple[Template, ...]
    markups: tuple[Markup | None, ...]  # per text: its markup behind <sN> tags (preserve_format)
    document: Document | None = None  # a document request: rows are its segments, in order


class Tokeniser:
    """Builds and tokenises a request's prompts for the model family ``profile``."""

    def __init__(self, engine: Encoder, settings: Settings, profile: Profile):
        self.engine = engine
        self.settings = settings
        self.profile = profile

    def prepare_one(
        self, request: TranslationRequest | ChatRequest | ServiceError
    ) -> Prepared | ServiceError:
        """``request`` tokenised, or its failure (a ServiceError given is returned as is)."""
        if isinstance(request, ServiceError):
            return request
        try:
            return self.tokenise(request)
        except Exception as error:  # the boundary: one request's failure stays in its slot
            return as_service_error(error)

    def tokenise(self, request: TranslationRequest | ChatRequest) -> Prepared:
        if isinstance(request, ChatRequest):
            return self._tokenise_chat(request)
        if request.document is not None:
            return self._tokenise_document(request, request.document)
        rows, templates, markups = [], [], []
        options, candidates = request.features.options, request.features.candidates
        for index, text in enumerate(request.texts):
            markup = None
            if options.preserve_format in ("markdown", "html"):
                text, markup = to_tags(text, options.preserve_format)
            row, template = self._row(
                request,
                index,
                text,
                options,
                functools.partial(_text_at, request.single, index, bool(candidates)),
                candidates[index] if candidates else (),
            )
            rows.append(row)
            templates.append(template)
            markups.append(markup)
        return Prepared(request, tuple(rows), tuple(templates), tuple(markups))

    def _tokenise_chat(self, request: ChatRequest) -> Prepared:
        """A row per choice: the conversation through the chat template, or the translation
        of its last user message through the model card's prompt."""
        if request.translation is not None:
            try:
                one = self.tokenise(request.translation)
            except PayloadTooLarge as error:  # name the field the client sent
                error.field = request.field
                raise
            ids, template, markup = one.rows[0].prompt_ids, one.templates[0], one.markups[0]
        else:
            ids, template, markup = (
                tuple(self.engine.encode_chat(request.turns)),
                CHAT_TEMPLATE,
                None,
            )
            if len(ids) > self.settings.limits.max_input_tokens:
                raise PayloadTooLarge(
                    f"the {request.field} make a prompt of {len(ids)} tokens",
                    allowed=f"at most {self.settings.limits.max_input_tokens} prompt tokens",
                    field=request.field,
                )
        # The stop strings go with the rows: the engine ends a row at its first one.
        rows = tuple(
            GenerationRow(
                ids, request.max_new_tokens, request.choice_sampling(choice), request.stop
            )
            for choice in range(request.n)
        )
        return Prepared(request, rows, (template,) * request.n, (markup,) * request.n)

    def _row(
        self,
        request: TranslationRequest,
        index: int,
        text: str,
        options: PromptOptions,
        where: Callable[[], str],
        candidates: Sequence[str] = (),
        max_new_tokens: int | None = None,
    ) -> tuple[GenerationRow, Template]:
        """One text's prompt, tokenised; PayloadTooLarge past max_input_tokens."""
        prompt, template = build_prompt(
            text,
            request.source_for(index),
            request.target,
            profile=self.profile,
            options=options,
            candidates=candidates,
        )
        ids = self.engine.encode_prompt(prompt)
        if len(ids) > self.settings.limits.max_input_tokens:
            raise PayloadTooLarge(
                f"{where()} makes a prompt of {len(ids)} tokens",
                allowed=f"at most {self.settings.limits.max_input_tokens} prompt tokens per text",
                field="text" if request.document is None else "document",
            )
        limit = max_new_tokens or request.max_new_tokens
        return GenerationRow(tuple(ids), limit, request.sampling), template

    def _tokenise_document(self, request: TranslationRequest, spec: DocumentInput) -> Prepared:
        """A document's segments as rows, in order: inline markup as ``<sN>`` tags (with the
        formatted template where the family has one and no other feature is asked for), the
        previous segment as context when asked, output capped by the segment's length."""
        settings = self.settings
        empty = len(self.engine.encode_prompt(""))

        @functools.cache  # a block that is one segment is measured once
        def measure(text: str) -> int:
            return len(self.engine.encode_prompt(text)) - empty

        document = split_document(
            spec.text,
            spec.format,
            budget=settings.limits.document_segment_tokens,
            measure=measure,
            language=request.source.code if request.source else None,
            target=request.target.code,
        )
        if len(document.segments) > settings.limits.max_document_segments:
            raise PayloadTooLarge(
                f"the document splits into {len(document.segments)} segments",
                allowed=f"at most {settings.limits.max_document_segments} segments per document",
                field="document",
            )
        if spec.resume is not None:  # rows for the segments not translated yet only
            document = resume(document, spec.resume)
        segments = document.segments
        options = request.features.options
        plain = options == PromptOptions()
        formatted = plain and "preserve_format" in self.profile.features
        rows, templates, markups = [], [], []
        for index, segment in enumerate(segments):
            text, markup = to_tags(segment, MARKUP_KIND[spec.format], tags_in_text=True)
            context = document.context_of(index)
            chosen = options
            before = document.before(index) if spec.previous_context else None
            if before is not None:
                chosen = PromptOptions(context=before[-settings.limits.max_context_chars :])
            elif formatted and markup.opens:
                chosen = PromptOptions(preserve_format="tags")
            elif plain and context and "context" in self.profile.features:  # a PO msgctxt
                chosen = PromptOptions(context=context[-settings.limits.max_context_chars :])
            limit = 8 + math.ceil(settings.limits.document_length_factor * measure(segment))
            row, template = self._row(
                request,
                index,
                text,
                chosen,
                functools.partial(_segment_at, document, index),
                max_new_tokens=min(request.max_new_tokens, limit),
            )
            rows.append(row)
            templates.append(template)
            markups.append(markup)
        return Prepared(request, tuple(rows), tuple(templates), tuple(markups), document)


def _text_at(single: bool, index: int, candidates: bool) -> str:
    where = "text" if single else f"text[{index}]"
    return where + (" with its candidates" if candidates else "")


def _segment_at(document: Document, index: int) -> str:
    return f"segment {index + 1} (line {document.line_of(index)}) of the document"
