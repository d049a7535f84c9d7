"""Fairness of the web front end on the CPU demo: single-sentence users while one client posts
a huge LibreTranslate request.

Starts what the README's demo starts (the tiny model, the CPU profile, TorchServe on loopback,
``hymt web``) on free ports in a temporary folder, with a key file of two keys:
``users`` for the single-sentence clients, ``bulk`` for the huge request. Phases, each measured
from its own start, on the same TorchServe:

1. ``alone``: ``--clients`` closed-loop users, each posting one sentence at a time to
   LibreTranslate's ``/translate``, for ``--seconds``;
2. ``beside bulk``: the same users while one more client posts ``--texts`` short texts in one
   ``/translate`` request; the users stop when it is answered (at least ``--seconds``);
3. with ``--baseline-tree DIR`` (a ``git worktree`` of an earlier commit), phase 2 again with
   that tree's ``hymt web`` in front.

The users' requests, errors and latency percentiles per phase, the ratio of their p50s (phase 2
against 1) and the huge requests' status and time are printed and saved (``results.json``,
``results.md``, ``latency.png``) under ``--out``. Goal (issue "the public face"): no user
error, the users' p50 at most 2x, the huge request answered.

    git worktree add /tmp/before a0059f0
    python benchmarks/fairness/fairness.py --out benchmarks/fairness/results \
        --baseline-tree /tmp/before
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
from dataclasses import dataclass, field
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


def start_server(folder: Path) -> tuple[Server, dict[str, str], Path]:
    """The tiny model on TorchServe, as the demo serves it: (server, keys by name, key file)."""
    model = build_tiny_model(folder / "tiny-model", default_tokenizer_dir())
    store = folder / "model_store"
    build_archive(
        model_path=model,
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=store,
        # Clients repeat their texts: each must cost model work, not a memory answer.
        overrides={"handler.translation_memory": False},
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
    return server, keys, key_file


def start_web(
    server: Server, key_file: Path, log: Path, tree: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``hymt web`` in front of ``server`` (from ``tree``'s handler/ when given): (process,
    URL)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir"]
    command += [str(server.workdir), "--port", str(port), "--client-keys", str(key_file)]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "handler"), env.get("PYTHONPATH", "")])
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            requests.get(f"{url}/languages", timeout=1)
            break
        except requests.RequestException:
            time.sleep(0.1)
    return process, url


def bulk_request(url: str, key: str, texts: int, result: dict[str, Any]) -> None:
    """One LibreTranslate request of ``texts`` short texts; its outcome into ``result``."""
    body = {
        "q": [f"Item {i}: {SENTENCES[i % len(SENTENCES)]}" for i in range(texts)],
        "source": "auto",
        "target": "fr",
        "api_key": key,
    }
    begun = time.perf_counter()
    answer = requests.post(f"{url}/translate", json=body, timeout=3600)
    result["seconds"] = round(time.perf_counter() - begun, 1)
    result["status"] = answer.status_code
    translated = answer.json().get("translatedText") if answer.ok else None
    result["texts_answered"] = len(translated or [])
    result["texts"] = texts


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
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="a checkout of an earlier front end (git worktree): a third phase runs its hymt web "
        "the same way, on the same TorchServe",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    phases: list[Phase] = []
    bulks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hymt-fairness-") as tmp:
        folder = Path(tmp)
        server, keys, key_file = start_server(folder)
        try:
            fronts = [("this tree", None)]
            if args.baseline_tree is not None:
                fronts.append((f"baseline {args.baseline_tree.name}", args.baseline_tree))
            for index, (name, tree) in enumerate(fronts):
                web, url = start_web(server, key_file, folder / f"web-{index}.log", tree)
                try:
                    if index == 0:
                        phases.append(Phase("alone"))
                        run_phase(url, keys["users"], args.clients, phases[-1], args.seconds, None)
                    phases.append(Phase(f"beside bulk ({name})"))
                    bulks.append({"front_end": name})
                    work = threading.Thread(
                        target=bulk_request, args=(url, keys["bulk"], args.texts, bulks[-1])
                    )
                    run_phase(url, keys["users"], args.clients, phases[-1], args.seconds, work)
                finally:
                    web.terminate()
                    web.wait(10)
        finally:
            stop(server)
    report(args, [phase.summary() for phase in phases], bulks, phases)
    return 0


def report(
    args: argparse.Namespace,
    phases: list[dict[str, Any]],
    bulks: list[dict[str, Any]],
    raw: list[Phase],
) -> None:
    alone, ours = phases[0], phases[1]
    ratio = ours["p50_ms"] / alone["p50_ms"] if alone["p50_ms"] and ours["p50_ms"] else None
    met = (
        alone["errors"] == 0
        and ours["errors"] == 0
        and ratio is not None
        and ratio <= 2.0
        and bulks[0].get("status") == 200
    )
    result = {
        "command": " ".join(["python", "benchmarks/fairness/fairness.py", *sys.argv[1:]]),
        "clients": args.clients,
        "bulk": bulks,
        "phases": phases,
        "p50_ratio": round(ratio, 2) if ratio else None,
        "goal_met": met,
    }
    lines = [
        "| phase | s | user requests | errors | req/s | p50 ms | p90 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in phases:
        errors = p["errors"] if not p["error_kinds"] else f"{p['errors']} {p['error_kinds']}"
        lines.append(
            f"| {p['phase']} | {p['seconds']} | {p['requests']} | {errors} | "
            f"{p['req_per_s']} | {p['p50_ms']} | {p['p90_ms']} | {p['p99_ms']} |"
        )
    lines += ["", f"- the users' p50 beside the bulk request: {result['p50_ratio']} x alone"]
    for bulk in bulks:
        lines.append(
            f"- the bulk request ({bulk.get('texts')} texts, {bulk['front_end']}): HTTP "
            f"{bulk.get('status')}, {bulk.get('texts_answered')} texts answered in "
            f"{bulk.get('seconds')} s"
        )
    lines.append(f"- goal (no user error, p50 <= 2 x, the bulk answered) met: {met}")
    table = "\n".join(lines)
    print(table)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(f"    {result['command']}\n\n{table}\n")
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
    axis.set_title("Single-sentence users beside one huge request (CPU demo)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
