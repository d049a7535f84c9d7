"""The ``hymt`` command as a user runs it, against a fake TorchServe on loopback that answers
like the real one (JSON replies, NDJSON streams, ``{error, error_type, allowed}`` errors)."""

from __future__ import annotations

import argparse
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hymt_serve.cli import server as server_cli
from hymt_serve.cli.main import build_parser, main

KEY = "inference-key"


class FakeTorchServe(BaseHTTPRequestHandler):
    """``/predictions/hunyuan-mt``: each text comes back as ``<target>:<TEXT>``."""

    bodies: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self._send(401, {"code": 401, "type": "Unauthorized"})
        if body["target_lang"] == "xx":
            error = {
                "error": "target_lang 'xx' is not a supported language code",
                "error_type": "unsupported_language",
                "field": "target_lang",
                "allowed": ["zh", "en"],
            }
            return self._send(400, error)
        texts = [body["text"]] if isinstance(body["text"], str) else body["text"]
        done = [f"{body['target_lang']}:{text.upper()}" for text in texts]
        reply: dict[str, Any] = {"translations": [{"text": text} for text in done]}
        if isinstance(body["text"], str):
            reply["translation"] = done[0]
        if not body.get("stream"):
            return self._send(200, reply)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for delta in (done[0][:3], done[0][3:]):
            self.wfile.write(json.dumps({"delta": delta}).encode() + b"\n")
        self.wfile.write(json.dumps(reply).encode() + b"\n")

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """A work folder that points at the fake server, and the bodies it received."""
    bodies: list[dict[str, Any]] = []
    handler = type("Handler", (FakeTorchServe,), {"bodies": bodies})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    port = httpd.server_address[1]
    (tmp_path / "config.properties").write_text(f"inference_address=http://127.0.0.1:{port}\n")
    (tmp_path / "key_file.json").write_text(json.dumps({"inference": {"key": KEY}}))
    yield tmp_path, bodies
    httpd.shutdown()
    httpd.server_close()


def hymt(workdir: Path, *args: str) -> int:
    return main(["translate", "--workdir", str(workdir), *args])


def test_a_text_prints_its_translation_only(served, capsys) -> None:
    workdir, bodies = served
    assert hymt(workdir, "good morning", "--to", "fr", "--from", "en") == 0
    assert capsys.readouterr().out == "fr:GOOD MORNING\n"
    assert bodies == [{"target_lang": "fr", "source_lang": "en", "text": "good morning"}]


def test_json_prints_the_whole_reply(served, capsys) -> None:
    workdir, _ = served
    assert hymt(workdir, "a", "--to", "de", "--json") == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply == {"translations": [{"text": "de:A"}], "translation": "de:A"}


def test_standard_input_is_a_text_a_line_and_blank_lines_stay(served, capsys, monkeypatch):
    workdir, bodies = served
    monkeypatch.setattr("sys.stdin", io.StringIO("one\n\ntwo\n"))
    assert hymt(workdir, "--to", "fr") == 0
    assert capsys.readouterr().out == "fr:ONE\n\nfr:TWO\n"
    assert [body["text"] for body in bodies] == [["one", "two"]]
    monkeypatch.setattr("sys.stdin", io.StringIO("three\n"))
    assert hymt(workdir, "-", "--to", "fr") == 0
    assert capsys.readouterr().out == "fr:THREE\n"


def test_a_file_goes_in_requests_of_at_most_sixteen_texts(served, capsys, tmp_path) -> None:
    workdir, bodies = served
    lines = [f"line {n}" for n in range(20)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert hymt(workdir, "--file", str(source), "--to", "ja") == 0
    assert capsys.readouterr().out.splitlines() == [f"ja:{line.upper()}" for line in lines]
    assert [len(body["text"]) for body in bodies] == [16, 4]


def test_stream_prints_the_deltas_as_one_line(served, capsys) -> None:
    workdir, bodies = served
    assert hymt(workdir, "hello", "--to", "fr", "--stream") == 0
    assert capsys.readouterr().out == "fr:HELLO\n"
    assert bodies == [{"target_lang": "fr", "text": "hello", "stream": True}]


def test_glossary_context_and_sampling_become_request_fields(served, capsys, tmp_path) -> None:
    workdir, bodies = served
    terms = tmp_path / "terms.txt"
    terms.write_text("# product names\nHunyuan\t混元\n\nTorchServe=TorchServe\n", encoding="utf-8")
    arguments = ["x", "--to", "zh", "--glossary", "GPU=显卡", "--glossary", str(terms)]
    assert hymt(workdir, *arguments, "--context", "a manual", "--sample") == 0
    assert bodies[0]["glossary"] == [
        {"source": "GPU", "target": "显卡"},
        {"source": "Hunyuan", "target": "混元"},
        {"source": "TorchServe", "target": "TorchServe"},
    ]
    assert bodies[0]["context"] == "a manual" and bodies[0]["sampling"] is True


def test_a_malformed_glossary_entry_is_refused_before_any_request(served, capsys) -> None:
    workdir, bodies = served
    assert hymt(workdir, "x", "--to", "zh", "--glossary", "no-pair") == 2
    assert "SOURCE=TARGET" in capsys.readouterr().err
    assert bodies == []


def test_texts_and_a_file_together_are_refused(served, capsys, tmp_path) -> None:
    workdir, _ = served
    assert hymt(workdir, "x", "--file", str(tmp_path / "in.txt"), "--to", "fr") == 2
    assert "not both" in capsys.readouterr().err


def test_a_server_error_prints_its_message_and_what_is_allowed(served, capsys) -> None:
    workdir, _ = served
    assert hymt(workdir, "x", "--to", "xx") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "hymt translate: target_lang 'xx' is not a supported language code (allowed: zh, en)\n"
    )


def test_help_is_written_for_users(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "translate" in text and "scripts/demo.sh" in text
    assert not any(mark in text for mark in (":mod:", "``", "hymt_serve"))


@pytest.mark.parametrize(("workers", "said"), [(1, "1 worker READY"), (3, "3 workers READY")])
def test_scale_counts_its_workers_in_words(monkeypatch, capsys, tmp_path, workers, said):
    monkeypatch.setattr(server_cli, "_worker_ceiling", lambda server, args: 4)
    monkeypatch.setattr(server_cli, "scale", lambda *args: [{"status": "READY"}] * workers)
    args = build_parser().parse_args(["scale", str(workers), "--workdir", str(tmp_path)])
    assert isinstance(args, argparse.Namespace) and args.func(args) == 0
    assert capsys.readouterr().out == f"hunyuan-mt: {said} (at most {workers})\n"
