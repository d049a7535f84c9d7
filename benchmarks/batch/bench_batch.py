"""The batch API against the serving path, on the same sentences, and a kill-and-resume run.

One run: serve the model through TorchServe (the GPU profile as shipped, or ``--tiny`` on the
CPU), start ``hymt web`` in front of it through a counting relay (every chat-form call that
TorchServe answers 200 is counted by its text, so a sentence translated twice shows), then:

1. ``serving``: ``--sentences`` of the serving benchmark's mix (loadtest/data/segments.jsonl,
   output lengths by run_bench's rule) as ``/v1/chat/completions`` calls from ``--users``
   closed-loop users: requests per second;
2. ``batch``: the same sentences as one batch (``/v1/files`` + ``/v1/batches``), polled to
   its end: lines per second, and the ratio to ``serving`` (goal: at least 0.9);
3. ``resume`` (``--kill-at F``): the batch again; once a fraction F of its lines is done,
   ``hymt web`` and TorchServe are killed (SIGKILL) and started again; the batch completes and
   the relay's counts give the lines the model translated twice (goal: 0). This run keeps the
   translation memory on, as shipped, with every line's text its own (numbered): a line
   resent after the kill whose translation the worker had kept is answered from the memory,
   no model work (the relay counts only replies without ``usage.memory_segments``).

    PYTHONPATH=handler:loadtest/serving python benchmarks/batch/bench_batch.py \
        --model-dir /tmp/hymt-7b --tokenizer <tokenizer dir> --sentences 100000 --users 256 \
        --kill-at 0.5 --out benchmarks/batch/results/gpu
    ... --tiny --sentences 300 --users 16 --kill-at 0.4 --out benchmarks/batch/results/cpu-tiny
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn
from run_bench import MODEL, build_model, length_rule_jobs
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

REPO = Path(__file__).resolve().parents[2]


class Relay:
    """A counting HTTP relay to TorchServe's inference API (in a thread of this process)."""

    def __init__(self, target: str, port: int) -> None:
        self.target, self.port = target, port
        self.counts: collections.Counter[str] = collections.Counter()
        self._client = httpx.AsyncClient(base_url=target, timeout=None)
        route = Route("/{path:path}", self._relay, methods=["GET", "POST", "PUT", "DELETE"])
        config = uvicorn.Config(Starlette(routes=[route]), port=port, log_level="warning")
        self._server = uvicorn.Server(config)
        threading.Thread(target=self._server.run, daemon=True).start()
        while not self._server.started:
            time.sleep(0.05)

    async def _relay(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        try:
            answer = await self._client.request(
                request.method, request.url.path, content=body, headers=headers,
                params=request.query_params,
            )  # fmt: skip
        except httpx.HTTPError:
            return Response(status_code=502)
        if answer.status_code == 200 and body.startswith(b"{"):
            messages = json.loads(body).get("messages")
            if messages and not _from_memory(answer.content):
                self.counts[messages[-1]["content"]] += 1
        kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type",)}
        return Response(answer.content, answer.status_code, headers=kept)


def _from_memory(content: bytes) -> bool:
    """Whether TorchServe's reply came from the translation memory (no model work)."""
    try:
        usage = json.loads(content).get("usage") or {}
    except (ValueError, AttributeError):
        return False
    return bool(usage.get("memory_segments"))


def uncached(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bodies with the memory skipped: the throughput runs measure the model's work."""
    return [{**body, "cache": False} for body in bodies]


def numbered(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bodies with each sentence numbered, so that every line's text is its own: a text
    the model translates twice is then a line translated twice, whatever the mix repeats."""
    return [
        {
            **body,
            "messages": [{"role": "user", "content": f"{n}. {body['messages'][-1]['content']}"}],
        }
        for n, body in enumerate(bodies)
    ]


def sentences(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    """``--sentences`` chat bodies of the serving benchmark's mix, its lengths rule."""
    from transformers import AutoTokenizer

    mix = length_rule_jobs(AutoTokenizer.from_pretrained(model_dir), args.cap)
    bodies = []
    for n in range(args.sentences):
        row, tokens = mix[n % len(mix)]
        bodies.append(
            {"model": MODEL, "messages": [{"role": "user", "content": row["text"]}],
             "source_lang": row["source_lang"], "target_lang": row["target_lang"],
             "max_tokens": tokens}
        )  # fmt: skip
    return bodies


async def serving(url: str, key: str, bodies: list[dict[str, Any]], users: int) -> dict[str, Any]:
    """Every body through /v1/chat/completions from ``users`` closed-loop users."""
    queue = iter(bodies)
    failures = 0
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as client:

        async def user() -> None:
            nonlocal failures
            for body in queue:
                answer = await client.post("/v1/chat/completions", json=body)
                failures += answer.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(users)))
        seconds = time.perf_counter() - started
    return {"requests": len(bodies), "failures": failures, "seconds": round(seconds, 2),
            "per_s": round((len(bodies) - failures) / seconds, 2)}  # fmt: skip


def batch(client: openai.OpenAI, bodies: list[dict[str, Any]], on_progress: Any = None) -> Any:
    lines = [
        {"custom_id": f"s{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for n, body in enumerate(bodies)
    ]
    data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    started = time.perf_counter()
    upload = client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    made = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while True:
        try:
            found = client.batches.retrieve(made.id)
        except openai.APIConnectionError:  # the front end is being restarted
            time.sleep(0.5)
            continue
        if found.status not in ("validating", "in_progress", "finalizing"):
            break
        if on_progress is not None:
            on_progress(found)
        time.sleep(0.5)
    seconds = time.perf_counter() - started
    counts = found.request_counts
    return {"status": found.status, "lines": len(bodies), "completed": counts.completed,
            "failed": counts.failed, "seconds": round(seconds, 2),
            "per_s": round(counts.completed / seconds, 2)}  # fmt: skip


class Servers:
    """TorchServe (launcher) and ``hymt web`` (a child) behind the relay."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        from hymt_serve.ops.launcher import start, wait_ready

        self.args, self.work = args, work
        self._start, self._ready = start, wait_ready
        self.web_dir = work / "web"
        self.web_dir.mkdir(parents=True, exist_ok=True)
        self.key = secrets.token_urlsafe(24)
        entry = {"name": "bench", "key": self.key, "character_limit": 10**15}
        (self.web_dir / "web_keys.json").write_text(json.dumps({"keys": [entry]}))
        self.web: subprocess.Popen[bytes] | None = None
        self.relay: Relay | None = None

    def start(self) -> None:
        server, _ = self._start(
            REPO / "config.properties", self.work / "run", model_store=self.work / "model_store"
        )
        self._ready(server, [MODEL], timeout=900)
        self.server = server
        if self.relay is None:
            self.relay = Relay(server.inference_url(), self.args.relay_port)
        (self.web_dir / "config.properties").write_text(
            f"inference_address=http://127.0.0.1:{self.args.relay_port}\n"
            f"management_address={server.management_url()}\n"
        )
        (self.web_dir / "key_file.json").write_text((server.workdir / "key_file.json").read_text())
        env = {**os.environ, "HYMT_BATCH_CONCURRENCY": str(self.args.concurrency)}
        command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(self.web_dir)]
        command += ["--port", str(self.args.web_port)]
        # The serving path's users all use the one key: room for them all in progress.
        command += ["--requests-per-key", str(max(32, self.args.users))]
        self.web = subprocess.Popen(command, env=env)
        for _ in range(300):
            try:
                if httpx.get(f"{self.url}/v2/health/live", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit("hymt web did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.args.web_port}"

    def kill(self) -> None:
        """SIGKILL TorchServe (its frontend and workers), then ``hymt web`` at once: what
        TorchServe answered just before can reach the front end and not be stored (counted
        twice), what it had in flight is lost with it."""
        import psutil  # TorchServe's frontend and its workers: the tree of its pid only

        assert self.web is not None
        pid = self.server.pid()
        tree = [psutil.Process(pid)] if pid is not None else []
        tree += tree[0].children(recursive=True) if tree else []
        for process in tree:
            process.kill()
        self.web.send_signal(signal.SIGKILL)
        self.web.wait()
        psutil.wait_procs(tree, timeout=30)
        time.sleep(2)

    def stop(self) -> None:
        from hymt_serve.ops.launcher import stop

        if self.web is not None and self.web.poll() is None:
            self.web.terminate()
            self.web.wait(30)
        stop(self.server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-dir", default="/tmp/hymt-bench-model")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--tiny", action="store_true", help="the tiny model on the CPU")
    parser.add_argument("--sentences", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=256, help="serving: closed-loop users")
    parser.add_argument("--concurrency", type=int, default=256, help="the batch's lines in flight")
    parser.add_argument("--cap", type=int, default=256, help="output tokens at most")
    parser.add_argument("--kill-at", type=float, default=None, metavar="FRACTION")
    parser.add_argument("--web-port", type=int, default=18_000)
    parser.add_argument("--relay-port", type=int, default=18_001)
    parser.add_argument("--work", default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from hymt_serve.ops.archive import build_archive

    work = Path(args.work or tempfile.mkdtemp(prefix="hymt-batchbench-"))
    model_dir = build_model(
        Path(args.model_dir), args.tokenizer and Path(args.tokenizer), args.tiny
    )
    bodies = sentences(args, model_dir)
    overrides: dict[str, Any] = {"asyncCommunication": True, "batchSize": 1,
                                 "handler.max_new_tokens": args.cap,
                                 "handler.target_language_check": "off"}  # fmt: skip
    if args.tiny:
        overrides["handler.engine"] = "fast"
    profile = "cpu" if args.tiny else "gpu"
    build_archive(model_path=model_dir, template=REPO / f"configs/model-config-{profile}.yaml",
                  export_path=work / "model_store", overrides=overrides)  # fmt: skip
    servers = Servers(args, work)
    servers.start()
    results: dict[str, Any] = {"sentences": args.sentences, "users": args.users,
                               "concurrency": args.concurrency, "tiny": args.tiny}  # fmt: skip
    try:
        client = openai.OpenAI(base_url=servers.url + "/v1", api_key=servers.key, max_retries=5)
        # The memory is on (the default) but skipped here: both paths do the model's work.
        plain = uncached(bodies)
        results["serving"] = asyncio.run(serving(servers.url, servers.key, plain, args.users))
        print(json.dumps(results["serving"]), flush=True)
        results["batch"] = batch(client, plain)
        results["batch_to_serving"] = round(
            results["batch"]["per_s"] / results["serving"]["per_s"], 3
        )
        print(json.dumps(results["batch"]), flush=True)
        if args.kill_at is not None:
            results["resume"] = resume_run(servers, client, bodies, args.kill_at)
            print(json.dumps(results["resume"]), flush=True)
    finally:
        servers.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def resume_run(
    servers: Servers, client: openai.OpenAI, bodies: list[dict[str, Any]], kill_at: float
) -> dict[str, Any]:
    """The batch again, both servers killed once ``kill_at`` of it is done, with the memory
    as shipped (on): the sentences the model translated more often than the batch holds them
    (a line resent after the kill that the memory answers costs no model work)."""
    assert servers.relay is not None
    servers.relay.counts.clear()
    killed: dict[str, Any] = {}

    def on_progress(found: Any) -> None:
        done = found.request_counts.completed + found.request_counts.failed
        if not killed and done >= kill_at * len(bodies):
            killed["at_lines"] = done
            servers.kill()
            servers.start()

    lines = numbered(bodies)
    outcome = batch(client, lines, on_progress)
    counts = servers.relay.counts
    twice = sum(count - 1 for count in counts.values() if count > 1)
    return {**outcome, **killed, "translated_twice": twice,
            "translated": sum(counts.values())}  # fmt: skip


if __name__ == "__main__":
    main()
