"""``hymt translate``: texts from the arguments, a file or standard input to the running server,
translations to standard output, one line each (``--json``: the server's whole replies).

A file or standard input is one text a line; blank lines come back blank. Texts go in requests
of at most the handler's default ``max_texts_per_request``; with ``--stream`` one text a request,
its words printed as they come.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import requests

from hymt_serve.ops.launcher import Server

TEXTS_PER_REQUEST = 16  # the handler's default max_texts_per_request; a lower one is a 413
TIMEOUT_S = 300


class UsageError(Exception):
    """A command line the command cannot act on; its message is for the user."""


def read_texts(args: argparse.Namespace, stdin: TextIO) -> list[str]:
    """The texts to translate: the arguments, else ``--file``, else standard input (or ``-``)."""
    if args.file is not None and args.text:
        raise UsageError("give texts or --file, not both")
    if args.file is not None:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot read {args.file}: {error.strerror}") from error
        return text.splitlines()
    if not args.text or args.text == ["-"]:
        return stdin.read().splitlines()
    return list(args.text)


def read_glossary(entries: Sequence[str]) -> list[dict[str, str]]:
    """``--glossary`` values as the request's term pairs: ``SOURCE=TARGET``, or a file of such
    lines (``SOURCE<TAB>TARGET`` too; blank lines and ``#`` comments skipped)."""
    pairs: list[dict[str, str]] = []
    for entry in entries:
        path = Path(entry)
        if "=" not in entry and path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            pairs += [_pair(line, f"{entry}:{n}") for n, line in enumerate(lines, 1) if _kept(line)]
        else:
            pairs.append(_pair(entry, "--glossary"))
    return pairs


def _kept(line: str) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith("#")


def _pair(text: str, where: str) -> dict[str, str]:
    source, sep, target = text.partition("\t") if "\t" in text else text.partition("=")
    if not sep or not source.strip() or not target.strip():
        raise UsageError(
            f"{where}: a glossary entry is SOURCE=TARGET (or a file of them), got {text!r}"
        )
    return {"source": source.strip(), "target": target.strip()}


def request_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields of the options, shared by every request of one command."""
    fields: dict[str, Any] = {"target_lang": args.to}
    if args.source:
        fields["source_lang"] = args.source
    if args.glossary:
        fields["glossary"] = read_glossary(args.glossary)
    if args.context is not None:
        fields["context"] = args.context
    if args.sample:
        fields["sampling"] = True
    return fields


def cmd_translate(args: argparse.Namespace) -> int:
    server = Server(args.workdir.resolve())
    try:
        texts = read_texts(args, sys.stdin)
        fields = request_fields(args)
    except UsageError as error:
        print(f"hymt translate: {error}", file=sys.stderr)
        return 2
    if not any(text.strip() for text in texts):
        print("hymt translate: no text to translate", file=sys.stderr)
        return 2
    url = f"{server.inference_url()}/predictions/{args.model}"
    client = Client(url, server.headers("inference"), sys.stdout, as_json=args.json)
    translate = client.stream if args.stream else client.translate
    return 0 if translate(texts, fields) else 1


class Client:
    """Posts texts to one model's predictions URL and prints what comes back."""

    def __init__(self, url: str, headers: dict[str, str], out: TextIO, *, as_json: bool) -> None:
        self.url, self.headers, self.out, self.as_json = url, headers, out, as_json

    def translate(self, texts: Sequence[str], fields: dict[str, Any]) -> bool:
        """Every text, in requests of :data:`TEXTS_PER_REQUEST`; False at the first error."""
        for chunk in _chunks(texts, TEXTS_PER_REQUEST):
            wanted = [text for text in chunk if text.strip()]
            if not wanted:
                self._print("\n" * (len(chunk) - 1))
                continue
            one = len(wanted) == 1  # one text as a string: the reply carries "translation" too
            response = self._post({**fields, "text": wanted[0] if one else wanted}, stream=False)
            if not response.ok:
                return self._failed(response)
            reply = response.json()
            if self.as_json:
                self._print(json.dumps(reply, ensure_ascii=False, indent=2))
                continue
            done = iter(item["text"] for item in reply["translations"])
            for text in chunk:
                self._print(next(done) if text.strip() else "")
        return True

    def stream(self, texts: Sequence[str], fields: dict[str, Any]) -> bool:
        """Every text in its own streamed request, its deltas printed as they come."""
        for text in texts:
            if not text.strip():
                self._print("")
                continue
            response = self._post({**fields, "text": text, "stream": True}, stream=True)
            if not response.ok:
                return self._failed(response)
            for event in _events(response):
                if "error" in event:
                    return self._failed(event)
                if self.as_json:
                    self._print(json.dumps(event, ensure_ascii=False))
                elif "delta" in event:
                    self.out.write(event["delta"])
                    self.out.flush()
            if not self.as_json:
                self._print("")
        return True

    def _post(self, body: dict[str, Any], *, stream: bool) -> requests.Response:
        return requests.post(
            self.url, json=body, headers=self.headers, timeout=TIMEOUT_S, stream=stream
        )

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _failed(self, error: requests.Response | dict[str, Any]) -> bool:
        """The server's error on standard error: its message and what it allows (``--json``:
        the whole body)."""
        body = error if isinstance(error, dict) else _body(error)
        if self.as_json:
            print(json.dumps(body, ensure_ascii=False), file=sys.stderr)
            return False
        allowed = body.get("allowed")
        if isinstance(allowed, list):
            allowed = ", ".join(map(str, allowed))
        more = f" (allowed: {allowed})" if allowed else ""
        print(f"hymt translate: {body.get('error', body)}{more}", file=sys.stderr)
        return False


def _body(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    return (
        body
        if isinstance(body, dict)
        else {"error": f"HTTP {response.status_code}: {response.text}"}
    )


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _events(response: requests.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines(decode_unicode=True):
        if line:
            yield json.loads(line)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "text", nargs="*", help="texts to translate; none or - reads standard input, a text a line"
    )
    parser.add_argument("--to", required=True, help="target language code, e.g. en")
    parser.add_argument(
        "--from", dest="source", help="source language code (optional for most models)"
    )
    parser.add_argument("--file", type=Path, help="translate this file, one text a line")
    parser.add_argument(
        "--glossary",
        action="append",
        default=[],
        metavar="SOURCE=TARGET|FILE",
        help="a term and its translation, or a file of such lines (repeatable; model "
        "families with glossaries only)",
    )
    parser.add_argument("--context", help="text the translation should take into account")
    parser.add_argument(
        "--sample", action="store_true", help="sample with the model card's settings (not greedy)"
    )
    parser.add_argument("--stream", action="store_true", help="print each text as it is made")
    parser.add_argument("--json", action="store_true", help="print the server's whole replies")
