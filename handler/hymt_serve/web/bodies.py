"""Reading a request's body on the front end: a JSON object, or form and query fields."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

# Form fields one request may carry: DeepL sends each text as a field of its own, and a
# request may carry up to compat.MAX_TEXTS texts (the parser's default is 1,000).
MAX_FORM_FIELDS = 50_100


class BadBody(ValueError):
    """The body cannot be read as the route needs it (a 400 in the route's API's shape)."""


def is_json(request: Request) -> bool:
    """Whether the request says its body is JSON (``application/json`` or ``...+json``)."""
    kind = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


async def json_object(request: Request) -> dict[str, Any] | None:
    """The request's JSON object, or None when the body is not one (or not said to be JSON)."""
    if not is_json(request):
        return None
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


async def fields(request: Request) -> dict[str, Any]:
    """The request's parameters: its JSON object, or its query and form fields (a field given
    several times, or named ``text``, as a list). BadBody for JSON that is not an object or a
    form that cannot be parsed."""
    if is_json(request):
        body = await json_object(request)
        if body is None:
            raise BadBody("the body is not a JSON object")
        return body
    params: dict[str, Any] = {}
    try:
        form = await request.form(max_fields=MAX_FORM_FIELDS)
    except HTTPException as error:  # Starlette's answer to a malformed multipart body
        raise BadBody(f"the form cannot be read: {error.detail}") from None
    for source in (request.query_params, form):
        for name in dict.fromkeys(source.keys()):
            values = source.getlist(name)
            params[name] = values if name == "text" or len(values) > 1 else values[0]
    return params
