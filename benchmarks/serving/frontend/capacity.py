"""The front end's own cost, without a GPU: ``hymt web`` in front of a stub TorchServe that
answers every translation after a fixed delay, against the stub called directly.

What it isolates: the CPU that ``hymt web``'s one event loop spends per request (parsing the
client's request, keys and quotas, the call to TorchServe, the answer), which bounds the
requests/s the front end can pass on (about 1,000 / that many ms on one core). The stub
answers ``/predictions/<model>`` after ``--delay-ms`` (TorchServe's p50 at 256 users on the
GPU, by default) with a fixed request API reply, or a chat reply when the body has
``messages``, and the describe API with a job queue of ``--queue``. Everything runs on this
machine's cores, the load generator and the stub included: the requests/s are those of this
machine, the CPU per request is the front end's own.

Per front end (this tree's, and with ``--baseline-tree DIR`` an earlier commit's ``handler/``,
``git archive``) and per path (``direct``: the stub itself; ``web``: ``/api/translate``;
``openai``: ``/v1/chat/completions``), closed-loop users for ``--duration`` s at each of
``--users``: requests/s, p50 and p99 latency, errors, and the front end's CPU ms per request
(its user + system time from /proc over the requests answered). Printed, and written to
``results.json`` and ``results.md`` under ``--out``.

    mkdir /tmp/before && git archive 7c8d8c5 handler | tar -x -C /tmp/before   # httpx, h11
    python benchmarks/serving/frontend/capacity.py --out benchmarks/serving/frontend/capacity \\
        --baseline-tree /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
MODEL = "hunyuan-mt"
TEXT = "The weather is nice today."
TRANSLATE = {"text": TEXT, "source_lang": "en", "target_lang": "de", "max_new_tokens": 16}
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": TEXT}],
    "max_tokens": 16,
    "temperature": 0,
    "source_lang": "en",
    "target_lang": "de",
}
PATHS = {
    "direct": (f"/predictions/{MODEL}", {**TRANSLATE, "stream": False}),
    "web": ("/api/translate", {**TRANSLATE, "stream": False}),
    "openai": ("/v1/chat/completions", CHAT),
}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# The stub TorchServe: a bare ASGI app on uvicorn (its own process).
STUB = """
import asyncio, json, sys
import uvicorn
delay, queue = float(sys.argv[2]), int(sys.argv[3])
reply = json.dumps({"translation": "Das Wetter ist heute schoen.",
    "usage": {"input_tokens": 20, "output_tokens": 9}}).encode()
chat = json.dumps({"choices": [{"index": 0, "text": "Das Wetter ist heute schoen.",
    "finish_reason": "stop"}], "usage": {"input_tokens": 20, "output_tokens": 9}}).encode()
described = json.dumps([{"modelName": "hunyuan-mt", "customizedMetadata": "{}", "workers": [],
    "jobQueueStatus": {"remainingCapacity": queue, "pendingRequests": 0}}]).encode()
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if scope["method"] == "POST":
        await asyncio.sleep(delay)
        answer = chat if b'"messages"' in body else reply
    else:
        answer = described
    await send({"type": "http.response.start", "status": 200,
        "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"{what} ended with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Level:
    """What the users of one level saw."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}


async def user(port: int, request: bytes, stop_at: float, level: Level) -> None:
    """One closed-loop user on one kept-alive connection: post, read the answer, again."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.monotonic() < stop_at:
            begun = time.monotonic()
            writer.write(request)
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            status = int(head.split(" ", 2)[1])
            if "content-length:" in head:
                size = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
                await reader.readexactly(size)
            else:  # chunked
                while size := int((await reader.readline()).strip(), 16):
                    await reader.readexactly(size + 2)
                await reader.readline()
            if status == 200:
                level.latencies.append(time.monotonic() - begun)
            else:
                level.errors[str(status)] = level.errors.get(str(status), 0) + 1
    finally:
        writer.close()


def raw_request(path: str, body: dict[str, Any], key: str | None) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\n"
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    return (head + "\r\n").encode() + data


def run_level(port: int, request: bytes, users: int, duration: float, pid: int | None) -> dict:
    level = Level()

    async def drive() -> None:
        stop_at = time.monotonic() + duration
        await asyncio.gather(*(user(port, request, stop_at, level) for _ in range(users)))

    cpu_before = cpu_seconds(pid) if pid is not None else 0.0
    begun = time.monotonic()
    asyncio.run(drive())
    wall = time.monotonic() - begun
    answered = len(level.latencies)
    result: dict[str, Any] = {
        "users": users,
        "requests_per_s": round(answered / wall, 1),
        "p50_ms": round(statistics.median(level.latencies) * 1000, 1) if answered else None,
        "p99_ms": round(sorted(level.latencies)[int(0.99 * (answered - 1))] * 1000, 1)
        if answered
        else None,
        "errors": level.errors,
    }
    if pid is not None and answered:
        result["front_end_cpu_ms"] = round((cpu_seconds(pid) - cpu_before) * 1000 / answered, 3)
    return result


def start_web(folder: Path, stub_port: int, tree: Path | None, log: Path) -> tuple[Any, int, str]:
    """``hymt web`` (from ``tree``'s handler/ when given) in front of the stub, keys
    required: (process, port, its client key)."""
    workdir = folder / "run"
    workdir.mkdir(parents=True, exist_ok=True)
    stub = f"http://127.0.0.1:{stub_port}"
    (workdir / "config.properties").write_text(
        f"inference_address={stub}\nmanagement_address={stub}\n"
    )
    port = free_port()
    env = dict(os.environ)
    handler = (tree or REPO) / "handler"
    env["PYTHONPATH"] = os.pathsep.join([str(handler), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(workdir)]
    command += ["--port", str(port), "--require-keys", "--requests-per-key", "100000"]
    command += ["--client-keys", str(folder / "keys.json"), "--character-limit", str(10**15)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    wait_listening(port, process, "hymt web")
    key = json.loads((folder / "keys.json").read_text())["keys"][0]["key"]
    return process, port, key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--baseline-tree", type=Path, default=None)
    parser.add_argument("--users", default="64,256")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=250.0)
    parser.add_argument("--queue", type=int, default=2000)
    args = parser.parse_args()
    users = [int(part) for part in args.users.split(",")]
    fronts: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline_tree is not None:
        fronts.append((f"baseline {args.baseline_tree.name}", args.baseline_tree))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as temp:
        stub_port = free_port()
        stub = subprocess.Popen(
            [sys.executable, "-c", STUB, str(stub_port), str(args.delay_ms / 1000), str(args.queue)]
        )
        try:
            wait_listening(stub_port, stub, "the stub")
            webs = []
            for index, (name, tree) in enumerate(fronts):
                folder = Path(temp) / f"front{index}"
                webs.append(
                    (name, *start_web(folder, stub_port, tree, Path(temp) / f"{index}.log"))
                )
            try:
                for round_ in range(1, args.rounds + 1):
                    for count in users:
                        measured = [("direct", None, stub_port, None, "direct")]
                        measured += [
                            (name, process.pid, port, key, path)
                            for name, process, port, key in webs
                            for path in ("web", "openai")
                        ]
                        if round_ % 2 == 0:
                            measured.reverse()
                        for name, pid, port, key, path in measured:
                            request = raw_request(*PATHS[path], key)
                            run_level(port, request, count, 2.0, pid)  # warm-up
                            row = run_level(port, request, count, args.duration, pid)
                            row.update(front_end=name, path=path, round=round_)
                            rows.append(row)
                            print(json.dumps(row), flush=True)
            finally:
                for _, process, _, _ in webs:
                    process.terminate()
                    process.wait(10)
        finally:
            stub.terminate()
            stub.wait(10)
    report(args, rows)
    return 1 if any(row["errors"] for row in rows) else 0


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Medians over the rounds per front end, path and users, beside the stub directly."""
    args.out.mkdir(parents=True, exist_ok=True)
    keys = sorted({(row["front_end"], row["path"], row["users"]) for row in rows})
    lines = [
        "# The front end's own cost against a stub TorchServe (CPU)",
        "",
        f"`python benchmarks/serving/frontend/capacity.py {' '.join(sys.argv[1:])}`",
        "",
        f"{os.cpu_count()} cores shared by the load generator, the stub and the front ends; the "
        f"stub answers after {args.delay_ms:g} ms; {args.rounds} round(s) of {args.duration:g} s "
        "levels, the order reversed every other round. Medians over the rounds; cpu ms/request: "
        "the front end's process (user + system) over the requests answered.",
        "",
        "| front end | path | users | req/s | direct req/s | p50 ms | direct p50 ms | p99 ms "
        "| cpu ms/request | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    summary = []
    for front, path, users in keys:
        if path == "direct":
            continue
        mine = [r for r in rows if (r["front_end"], r["path"], r["users"]) == (front, path, users)]
        direct = [r for r in rows if r["path"] == "direct" and r["users"] == users]

        def median(items: list[dict[str, Any]], name: str) -> float:
            return round(statistics.median(item[name] for item in items), 3)

        entry = {
            "front_end": front,
            "path": path,
            "users": users,
            "requests_per_s": median(mine, "requests_per_s"),
            "direct_requests_per_s": median(direct, "requests_per_s"),
            "p50_ms": median(mine, "p50_ms"),
            "direct_p50_ms": median(direct, "p50_ms"),
            "p99_ms": median(mine, "p99_ms"),
            "front_end_cpu_ms": median(mine, "front_end_cpu_ms"),
            "errors": sum(sum(r["errors"].values()) for r in mine),
        }
        summary.append(entry)
        lines.append(
            f"| {front} | {path} | {users} | {entry['requests_per_s']} | "
            f"{entry['direct_requests_per_s']} | {entry['p50_ms']} | {entry['direct_p50_ms']} | "
            f"{entry['p99_ms']} | {entry['front_end_cpu_ms']} | {entry['errors']} |"
        )
    (args.out / "results.json").write_text(
        json.dumps({"summary": summary, "levels": rows}, indent=1)
    )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
