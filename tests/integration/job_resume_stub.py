"""A stub TorchServe in its own process, for the kill-and-resume test of durable jobs
(test_job_resume.py): it answers the chat form (a batch line: its text upper-cased) and the
document form with the resume fields (paragraphs as segments, ``max_segments`` at a time),
and appends one line to a log for every line or segment it translates, before answering.

    python job_resume_stub.py PORT LOG HANG_AFTER

Once HANG_AFTER units are translated every further call hangs before translating anything (a
model server stuck mid-job, until the test kills it); -1: never.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOCK = threading.Lock()
COUNT = [0]


def translate(unit: str, text: str, log_path: str) -> str:
    with LOCK, open(log_path, "a", encoding="utf-8") as log:
        log.write(unit + "\n")
        COUNT[0] += 1
    return text.upper()


def document(body: dict[str, Any], log_path: str) -> dict[str, Any]:
    text = body["document"]
    segments = [part for part in text.split("\n\n") if part]
    fingerprint = hashlib.sha256(text.encode()).hexdigest()
    given = body.get("segments_fingerprint")
    if given is not None and given != fingerprint:
        return {"error": "other split", "field": "segments_fingerprint"}
    done = {int(k): v for k, v in body.get("done_segments", {}).items()}
    todo = [n for n in range(len(segments)) if n not in done][: body.get("max_segments")]
    new = {n: translate(f"segment:{n}", segments[n], log_path) for n in todo}
    merged = done | new
    complete = len(merged) == len(segments)
    return {
        "document": "\n\n".join(merged[n] for n in range(len(segments))) + "\n\n"
        if complete
        else None,
        "segment_translations": {str(n): t for n, t in new.items()},
        "segments_fingerprint": fingerprint,
        "segments_total": len(segments),
        "segments_done": len(merged),
        "format": "text",
    }


def chat(body: dict[str, Any], log_path: str) -> dict[str, Any]:
    content = body["messages"][-1]["content"]
    text = translate(f"line:{content}", content, log_path)
    return {
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "output_tokens": 2}],
        "usage": {"input_tokens": 5, "output_tokens": 2},
        "prompt": "chat",
        "request_id": "stub",
    }


def main() -> None:
    port, log_path, hang_after = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if 0 <= hang_after <= COUNT[0]:
                time.sleep(3600)  # stuck: the test kills this process
            answer = document(body, log_path) if "document" in body else chat(body, log_path)
            status = 400 if "error" in answer else 200
            raw = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
