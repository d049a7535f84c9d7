"""Fairness of the web front end on the CPU demo: single-sentence users while one client posts
a huge LibreTranslate request.

Starts what the README's demo starts (the tiny model, the CPU profile, TorchServe on loopback,
``hymt web`` under waitress) on free ports in a temporary folder, with a key file of two keys:
``users`` for the single-sentence clients, ``bulk`` for the huge request. Two phases, each
measured from its own start:

1. ``alone``: ``--clients`` closed-loop users, each posting one sentence at a time to
   LibreTranslate's ``/translate``, for ``--seconds``;
2. ``beside bulk``: the same users while one more client posts ``--texts`` short texts in one
   ``/translate`` request; the users stop when it is answered (at least ``--seconds``).

The users' requests, errors and latency percentiles per phase, the ratio of their p50s and the
huge request's status and time are printed and saved (``results.json``, ``results.md``,
``latency.png``) under ``--out``. Goal (issue "the public face"): no user error, the users' p50
at most 2x, the huge request answered.

    python benchmarks/fairness/fairness.py --out benchmarks/fairness/results
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests

from hymt_serve.ops.archive import build_archive
from hymt_serve.ops.launcher import Server, free_port_overrides, start, stop, wait_ready
from hymt_serve.ops.tiny_model import build_tiny_model, default_tokenizer_dir

REPO = Path(__file__).resolve().parents[2]
SENTENCES = [
    "The weather is nice today.",
    "Where is the railway station?",
    "Please send me the report by Friday.",
    "我们明天早上九点开会。",
    "Das Museum ist montags geschlossen.",
]


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_ms)

        def pct(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

        return {
            "phase": self.name,
            "seconds": round(self.seconds, 1),
            "requests": len(ordered),
            "errors": sum(self.errors.values()),
            "error_kinds": self.errors,
            "req_per_s": round(len(ordered) / self.seconds, 2) if self.seconds else 0.0,
            "p50_ms": round(statistics.median(ordered), 1) if ordered else None,
            "p90_ms": pct(0.9) if ordered else None,
            "p99_ms": pct(0.99) if ordered else None,
        }


def start_stack(folder: Path) -> tuple[Server, subprocess.Popen[bytes], str, dict[str, str]]:
    """The tiny model on TorchServe and ``hymt web`` in front: (server, web process, web URL,
    keys by name)."""
    model = build_tiny_model(folder / "tiny-model", default_tokenizer_dir())
    store = folder / "model_store"
    build_archive(
        model_path=model,
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=store,
    )
    server, _ = start(
        REPO / "config.properties",
        folder / "run",
        model_store=store,
        models=["hunyuan-mt=hunyuan-mt.mar"],
        overrides=free_port_overrides(),
    )
    wait_ready(server, ["hunyuan-mt"], timeout=300)
    keys = {
        "users": "users-key-" + os.urandom(12).hex(),
        "bulk": "bulk-key-" + os.urandom(12).hex(),
    }
    key_file = folder / "web_keys.json"
    entries = [{"name": n, "key": k, "character_limit": 10**9} for n, k in keys.items()]
    key_file.write_text(json.dumps({"keys": entries}))
    hymt = Path(sys.executable).with_name("hymt")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        web = probe.getsockname()[1]
    command = [str(hymt), "web", "--workdir", str(server.workdir), "--port", str(web)]
    command += ["--client-keys", str(key_file)]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=(folder / "web.log").open("wb")
    )
    url = f"http://127.0.0.1:{web}"
    for _ in range(200):
        try:
            requests.get(f"{url}/languages", timeout=1)
            break
        except requests.RequestException:
            time.sleep(0.1)
    return server, process, url, keys


def user(url: str, key: str, index: int, phase: Phase, stop_at: threading.Event) -> None:
    session = requests.Session()
    n = index
    while not stop_at.is_set():
        body = {
            "q": SENTENCES[n % len(SENTENCES)],
            "source": "auto",
            "target": "fr",
            "api_key": key,
        }
        n += 1
        begun = time.perf_counter()
        try:
            answer = session.post(f"{url}/translate", json=body, timeout=120)
            kind = None if answer.status_code == 200 else f"HTTP {answer.status_code}"
        except requests.RequestException as error:
            kind = type(error).__name__
        if kind is None:
            phase.latencies_ms.append((time.perf_counter() - begun) * 1000)
        else:
            phase.errors[kind] = phase.errors.get(kind, 0) + 1


def run_phase(
    url: str, key: str, clients: int, phase: Phase, seconds: float, bulk: threading.Thread | None
) -> None:
    stop_at = threading.Event()
    threads = [
        threading.Thread(target=user, args=(url, key, i, phase, stop_at)) for i in range(clients)
    ]
    begun = time.perf_counter()
    for thread in threads:
        thread.start()
    if bulk is not None:
        bulk.start()
    time.sleep(seconds)
    if bulk is not None:
        bulk.join()
    stop_at.set()
    for thread in threads:
        thread.join()
    phase.seconds = time.perf_counter() - begun


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hymt-fairness-") as tmp:
        server, web, url, keys = start_stack(Path(tmp))
        try:
            alone = Phase("alone")
            run_phase(url, keys["users"], args.clients, alone, args.seconds, None)
            beside = Phase("beside bulk")
            bulk_result: dict[str, Any] = {}

            def bulk() -> None:
                texts = [f"Item {i}: {SENTENCES[i % len(SENTENCES)]}" for i in range(args.texts)]
                body = {"q": texts, "source": "auto", "target": "fr", "api_key": keys["bulk"]}
                begun = time.perf_counter()
                answer = requests.post(f"{url}/translate", json=body, timeout=3600)
                bulk_result["seconds"] = round(time.perf_counter() - begun, 1)
                bulk_result["status"] = answer.status_code
                translated = answer.json().get("translatedText") if answer.ok else None
                bulk_result["texts_answered"] = len(translated or [])
                bulk_result["texts"] = args.texts

            run_phase(
                url,
                keys["users"],
                args.clients,
                beside,
                args.seconds,
                threading.Thread(target=bulk),
            )
        finally:
            web.terminate()
            web.wait(10)
            stop(server)
    report(args, [alone.summary(), beside.summary()], bulk_result, [alone, beside])
    return 0


def report(
    args: argparse.Namespace,
    phases: list[dict[str, Any]],
    bulk: dict[str, Any],
    raw: list[Phase],
) -> None:
    ratio = phases[1]["p50_ms"] / phases[0]["p50_ms"] if phases[0]["p50_ms"] else None
    met = (
        phases[0]["errors"] == 0
        and phases[1]["errors"] == 0
        and ratio is not None
        and ratio <= 2.0
        and bulk.get("status") == 200
    )
    result = {
        "command": " ".join(["python", "benchmarks/fairness/fairness.py", *sys.argv[1:]]),
        "clients": args.clients,
        "bulk": bulk,
        "phases": phases,
        "p50_ratio": round(ratio, 2) if ratio else None,
        "goal_met": met,
    }
    lines = [
        "| phase | s | user requests | errors | req/s | p50 ms | p90 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in phases:
        lines.append(
            f"| {p['phase']} | {p['seconds']} | {p['requests']} | {p['errors']} | "
            f"{p['req_per_s']} | {p['p50_ms']} | {p['p90_ms']} | {p['p99_ms']} |"
        )
    lines += [
        "",
        f"- the users' p50 beside the bulk request: {result['p50_ratio']} x alone (goal: <= 2)",
        f"- the bulk request ({bulk.get('texts')} texts): HTTP {bulk.get('status')}, "
        f"{bulk.get('texts_answered')} texts answered in {bulk.get('seconds')} s",
        f"- goal met: {met}",
    ]
    table = "\n".join(lines)
    print(table)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(f"    {result['command']}\n\n{table}\n")
    (args.out / "raw.json").write_text(json.dumps([asdict(p) for p in raw]) + "\n")
    plot(raw, args.out / "latency.png")


def plot(phases: list[Phase], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axis = plt.subplots(figsize=(7, 4))
    for phase in phases:
        ordered = sorted(phase.latencies_ms)
        if ordered:
            axis.plot(ordered, [i / len(ordered) for i in range(len(ordered))], label=phase.name)
    axis.set_xscale("log")
    axis.set_xlabel("a user's request latency (ms)")
    axis.set_ylabel("fraction of requests")
    axis.set_title("Single-sentence users, alone and beside one huge request (CPU demo)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
