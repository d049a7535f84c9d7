"""Open streams on the web front end: N streamed translations at once through ``hymt web``,
all completed, and what each costs the front end in memory and threads (CPU demo).

Starts what the README's demo starts (the tiny model, the CPU profile, TorchServe on loopback,
``hymt web``) on free ports in a temporary folder, with TorchServe's ``job_queue_size`` raised
to ``--streams`` / 0.75 + 100, so that the front end's upstream slots (three quarters of the
queue) take every stream at once and none waits in the front end. ``--workdir DIR`` uses a
running TorchServe instead (the demo's ``run``, say; its queue of 100 gives the front end 75
slots, the rest of the streams then wait for one, up to 60 s, then 503).

Then: one streamed translation to warm up; the front end's memory (VmRSS) and threads at rest;
``--streams`` clients each open a connection and post one single-text ``/api/translate`` (a
stream: NDJSON deltas, then the whole answer) at once, and read their stream to its end. Every
``--sample-s`` the front end's VmRSS and threads are read beside the number of streams open
(sent, not yet ended) and streaming (their first line received), and TorchServe's queue of the
model (how many calls the front end has passed on). TorchServe generates a batch at a time, so
nearly all streams are open together while the first ones stream. With ``--baseline-tree DIR``
(an earlier commit's files, ``git archive``) that tree's ``hymt web`` runs the same streams
next, on the same TorchServe.

Reported per front end (printed, ``results.json`` and ``results.md`` under ``--out``): the
streams answered whole (HTTP 200, a last line with the translation), the errors by kind, the
wall time, the most streams open at once and for how long (95 % of them), the most calls passed
on to TorchServe at once, threads and RSS at rest, with every stream open and at the highest,
and the memory added per open stream. Exit 1 if any stream failed: a check, not a timing
(nothing here fails on time).

    mkdir /tmp/before && git archive 7a96d06^ handler | tar -x -C /tmp/before
    python benchmarks/streams/streams.py --out benchmarks/streams/results \
        --baseline-tree /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import requests

from hymt_serve.ops.archive import build_archive
from hymt_serve.ops.launcher import Server, free_port_overrides, start, stop, wait_ready
from hymt_serve.ops.tiny_model import build_tiny_model, default_tokenizer_dir

REPO = Path(__file__).resolve().parents[2]
SENTENCES = [
    "The weather is nice today.",
    "Where is the railway station?",
    "Please send me the report by Friday.",
    "The museum is closed on Mondays.",
    "We will meet tomorrow at nine.",
]
UPSTREAM_SHARE = 0.75  # the front end's slots: this share of TorchServe's job queue


@dataclass
class Run:
    """What the streams saw, and the front end's samples: (s, open, streaming, KiB, threads)."""

    open: int = 0
    streaming: int = 0
    done: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    samples: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)  # TorchServe's pending requests

    def failed(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def front_end(pid: int) -> tuple[int, int]:
    """The process's resident memory (KiB) and threads, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.split()[0] if value.split() else ""
    return int(fields["VmRSS"]), int(fields["Threads"])


def start_server(folder: Path, streams: int) -> Server:
    """The tiny model on TorchServe as the demo serves it, its job queue sized for ``streams``."""
    model = build_tiny_model(folder / "tiny-model", default_tokenizer_dir())
    store = folder / "model_store"
    build_archive(
        model_path=model,
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=store,
        # Streams repeat their texts: each must be generated, not answered from the memory.
        overrides={"handler.translation_memory": False},
    )
    queue = int(streams / UPSTREAM_SHARE) + 100
    server, _ = start(
        REPO / "config.properties",
        folder / "run",
        model_store=store,
        models=["hunyuan-mt=hunyuan-mt.mar"],
        overrides={**free_port_overrides(), "job_queue_size": str(queue)},
    )
    wait_ready(server, ["hunyuan-mt"], timeout=300)
    return server


def start_web(
    server: Server, log: Path, tree: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``hymt web`` in front of ``server`` on a free port (from ``tree``'s handler/ when
    given): (process, URL)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(server.workdir)]
    command += ["--port", str(port)]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "handler"), env.get("PYTHONPATH", "")])
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            requests.get(f"{url}/", timeout=1)
            return process, url
        except requests.RequestException:
            time.sleep(0.1)
    raise RuntimeError(f"hymt web did not start: {log.read_text()[-2000:]}")


async def stream(client: httpx.AsyncClient, url: str, index: int, run: Run) -> None:
    """One streamed translation, read to its end; its outcome into ``run``."""
    body = {"text": SENTENCES[index % len(SENTENCES)], "source_lang": "en", "target_lang": "fr"}
    run.open += 1
    started = False
    try:
        async with client.stream("POST", f"{url}/api/translate", json=body) as answer:
            if answer.status_code != 200:
                run.failed(f"HTTP {answer.status_code}")
                return
            last: Any = None
            async for line in answer.aiter_lines():
                if not line.strip():
                    continue
                if not started:
                    started = True
                    run.streaming += 1
                last = json.loads(line)
            if isinstance(last, dict) and isinstance(last.get("translation"), str):
                run.done += 1
            else:
                run.failed("no final translation")
    except httpx.HTTPError as error:
        run.failed(type(error).__name__)
    finally:
        run.open -= 1
        run.streaming -= started


async def sample(pid: int, run: Run, every_s: float, begun: float) -> None:
    while True:
        rss, threads = front_end(pid)
        run.samples.append((time.perf_counter() - begun, run.open, run.streaming, rss, threads))
        await asyncio.sleep(every_s)


async def sample_queue(server: Server, run: Run, every_s: float) -> None:
    """TorchServe's pending requests of the model: the calls the front end has passed on and
    that wait for a batch."""
    url = f"{server.management_url()}/models/hunyuan-mt"
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            try:
                answer = await client.get(url, headers=server.headers("management"))
                run.queued.append(int(answer.json()[0]["jobQueueStatus"]["pendingRequests"]))
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                pass
            await asyncio.sleep(every_s)


async def drive(
    url: str, pid: int, server: Server, streams: int, every_s: float
) -> tuple[Run, float]:
    """``streams`` streams at once against ``url``: (what they saw, seconds to the last end)."""
    run = Run()
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(900, connect=60)) as client:
        begun = time.perf_counter()
        samplers = [
            asyncio.ensure_future(sample(pid, run, every_s, begun)),
            asyncio.ensure_future(sample_queue(server, run, 5 * every_s)),
        ]
        await asyncio.gather(*(stream(client, url, i, run) for i in range(streams)))
        seconds = time.perf_counter() - begun
        for sampler in samplers:
            sampler.cancel()
    return run, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--sample-s", type=float, default=0.1)
    parser.add_argument("--workdir", type=Path, help="a running TorchServe's work folder")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="a checkout of an earlier front end (git archive of a commit): its hymt web "
        "runs the same streams after this tree's, on the same TorchServe",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per stream here
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fronts: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline_tree is not None:
        fronts.append((f"baseline {args.baseline_tree.name}", args.baseline_tree))
    measured = []
    with tempfile.TemporaryDirectory(prefix="hymt-streams-") as tmp:
        folder = Path(tmp)
        own = args.workdir is None
        server = start_server(folder, args.streams) if own else Server(args.workdir.resolve())
        try:
            for index, (name, tree) in enumerate(fronts):
                measured.append(measure(args, name, server, folder / f"web-{index}.log", tree))
        finally:
            if own:
                stop(server)
    return report(args, measured)


def measure(
    args: argparse.Namespace, name: str, server: Server, log: Path, tree: Path | None
) -> dict[str, Any]:
    """One front end's run: its summary (what ``report`` prints)."""
    web, url = start_web(server, log, tree)
    try:
        warm = requests.post(f"{url}/api/translate", json={"text": "Hi", "target_lang": "fr"})
        assert warm.status_code == 200, warm.text
        time.sleep(1.0)
        rest = front_end(web.pid)
        run, seconds = asyncio.run(drive(url, web.pid, server, args.streams, args.sample_s))
        after = front_end(web.pid)
    finally:
        web.terminate()
        web.wait(30)
    most = max(s[1] for s in run.samples)
    held = [s for s in run.samples if s[1] >= 0.95 * most]  # (nearly) all open at once
    top = max(held, key=lambda s: s[3])
    return {
        "front_end": name,
        "answered_whole": run.done,
        "errors": run.errors,
        "seconds": round(seconds, 1),
        "at_rest": {"rss_kib": rest[0], "threads": rest[1]},
        "held": {
            "open_at_most": most,
            "seconds_with_95_percent_open": round(held[-1][0] - held[0][0], 1),
            "streaming_at_most": max(s[2] for s in held),
            "rss_kib": top[3],
            "open_then": top[1],
            "threads_at_most": max(s[4] for s in held),
        },
        "torchserve_queued_at_most": max(run.queued, default=None),
        "peak_rss_kib": max(s[3] for s in run.samples),
        "most_threads": max(s[4] for s in run.samples),
        "after": {"rss_kib": after[0], "threads": after[1]},
        "kib_per_open_stream": round((top[3] - rest[0]) / top[1], 1),
        "kib_per_stream_from_peak": round((max(s[3] for s in run.samples) - rest[0]) / most, 1),
    }


def _passed_on(queued: int | None) -> str:
    """TorchServe's queue at most, plus the batch it generates (the CPU profile's 4)."""
    return "?" if queued is None else f"{queued + 4}"


def report(args: argparse.Namespace, measured: list[dict[str, Any]]) -> int:
    result = {
        "command": " ".join(["python", "benchmarks/streams/streams.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "streams": args.streams,
        "front_ends": measured,
    }
    lines = [
        "| front end | streams answered whole | s | open at once (held s) | passed on to "
        "TorchServe at once | threads at rest / most | RSS MiB at rest / all open / highest | "
        "KiB per open stream |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in measured:
        held = m["held"]
        lines.append(
            f"| {m['front_end']} | {m['answered_whole']} of {args.streams} | {m['seconds']} | "
            f"{held['open_at_most']} ({held['seconds_with_95_percent_open']}) | "
            f"{_passed_on(m['torchserve_queued_at_most'])} | "
            f"{m['at_rest']['threads']} / {m['most_threads']} | "
            f"{m['at_rest']['rss_kib'] / 1024:.1f} / {held['rss_kib'] / 1024:.1f} / "
            f"{m['peak_rss_kib'] / 1024:.1f} | {m['kib_per_open_stream']} |"
        )
    lines.append("")
    for m in measured:
        lines.append(
            f"- {m['front_end']}: errors {m['errors'] or 'none'}; at most "
            f"{m['held']['streaming_at_most']} streaming (TorchServe generates a batch at a "
            f"time, the others wait in its queue); from the highest RSS "
            f"{m['kib_per_stream_from_peak']} KiB per stream"
        )
    table = "\n".join(lines)
    print(table)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(f"    {result['command']}\n\n{table}\n")
    return 0 if all(m["answered_whole"] == args.streams for m in measured) else 1


if __name__ == "__main__":
    sys.exit(main())
