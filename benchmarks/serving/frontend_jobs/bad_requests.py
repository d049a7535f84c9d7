"""TorchServe's front-end heap under a stream of bad requests, in async mode (the GPU profile's).

Serves the tiny model on the CPU as ``tests/integration/test_async_server.py`` does (async mode,
one worker, the fast engine with 2 slots and a waiting line of 6), then sends bad requests in
rounds: 160 that the handler answers 400 (empty text and an unknown language, in turn) and a
burst of 48 long ones at once, of which the handler answers about 40 with 503 (its waiting line
is full) and translates the rest. After every ``--every`` bad requests it forces a full GC in
the front end's JVM (``jcmd PID GC.class_histogram``) and records the live heap (the
histogram's total) and the live ``RestJob`` objects (one per HTTP request).

    python benchmarks/serving/frontend_jobs/bad_requests.py OUT --plugin on|off [--requests N]

``--plugin off`` runs TorchServe's own request map (``plugins_path`` an empty folder), ``on``
our front-end plugin (handler/hymt_serve/ops/frontend_guard/). Prints one CSV line a sample and
writes them to ``OUT/samples-<plugin>.csv``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from hymt_serve.ops.archive import build_archive
from hymt_serve.ops.launcher import Server, free_port_overrides, start, stop, wait_ready
from hymt_serve.ops.tiny_model import build_tiny_model, default_tokenizer_dir

REPO = Path(__file__).resolve().parents[3]
MODEL = "hunyuan-mt"
ARCHIVE = {
    "asyncCommunication": True,
    "batchSize": 1,
    "minWorkers": 1,
    "maxWorkers": 1,
    "handler.engine": "fast",
    "handler.max_new_tokens": 24,
    "handler.max_batch_rows": 2,
    "handler.max_waiting_rows": 6,
    "handler.translation_memory": False,  # repeated texts must reach the engine each time
}
BAD = ({"text": "", "target_lang": "fr"}, {"text": "x", "target_lang": "klingon"})
LONG = {"text": "Burst", "target_lang": "fr", "max_new_tokens": 24}
ROUND_400S, BURST = 160, 48
FIELDS = ["bad_requests", "answered_400", "answered_503", "torchserve_503", "answered_200",
          "restjob_objects", "live_heap_mib", "seconds"]  # fmt: skip


def serve(out: Path, plugin: bool, archive: dict[str, Any]) -> Server:
    """Build the tiny model's archive and start TorchServe in async mode on free ports."""
    store = out / "model_store"
    build_archive(
        model_path=build_tiny_model(out / "model", default_tokenizer_dir()),
        template=REPO / "configs/model-config-cpu.yaml",
        export_path=store,
        overrides=archive,
        name=MODEL,
    )
    overrides = free_port_overrides()
    if not plugin:
        (out / "no-plugins").mkdir(exist_ok=True)
        overrides["plugins_path"] = str(out / "no-plugins")
    server, _ = start(REPO / "config.properties", out / "run", model_store=store,
                      models=[f"{MODEL}={MODEL}.mar"], overrides=overrides)  # fmt: skip
    wait_ready(server, [MODEL], timeout=240)
    return server


def live(server: Server) -> tuple[int, float]:
    """Live RestJob objects and live heap (MiB) after a full GC in the front end's JVM."""
    pid = server.pid()
    assert pid is not None, "TorchServe is not running"
    jcmd = Path(os.readlink(f"/proc/{pid}/exe")).parent / "jcmd"
    done = subprocess.run([str(jcmd), str(pid), "GC.class_histogram"], capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    jobs, total = 0, 0
    for words in (line.split() for line in done.stdout.splitlines()):
        if len(words) >= 4 and words[3] == "org.pytorch.serve.job.RestJob":
            jobs = int(words[1])
        elif words[:1] == ["Total"]:
            total = int(words[2])
    return jobs, total / 2**20


def post(server: Server, body: dict[str, Any]) -> str:
    """The reply's status; "503ts" for a 503 from TorchServe itself (its job queue full)."""
    response = requests.post(f"{server.inference_url()}/predictions/{MODEL}", json=body,
                             headers=server.headers("inference"), timeout=120)  # fmt: skip
    ours = response.headers.get("content-type", "").startswith("application/json") and (
        "error_type" in response.text or response.status_code == 200
    )
    return str(response.status_code) + ("" if ours else "ts")


def one_round(server: Server, pool: concurrent.futures.ThreadPoolExecutor) -> Counter[str]:
    statuses = Counter(pool.map(lambda i: post(server, BAD[i % 2]), range(ROUND_400S)))
    burst = list(pool.map(lambda _: post(server, LONG), range(BURST)))
    return statuses + Counter(burst)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--plugin", choices=["on", "off"], required=True)
    parser.add_argument("--requests", type=int, default=100_000, help="bad requests to send")
    parser.add_argument("--every", type=int, default=10_000, help="bad requests between samples")
    parser.add_argument(
        "--job-queue",
        type=int,
        default=0,
        help="the model's jobQueueSize (TorchServe answers 503 itself when full)",
    )
    args = parser.parse_args()
    out = args.out / f"plugin-{args.plugin}"
    out.mkdir(parents=True, exist_ok=True)
    archive = {**ARCHIVE, **({"jobQueueSize": args.job_queue} if args.job_queue else {})}
    server = serve(out, args.plugin == "on", archive)
    try:
        with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
            list(pool.map(lambda _: post(server, LONG), range(100)))  # warm up
            run(server, pool, args, args.out / f"samples-{args.plugin}.csv")
    finally:
        stop(server)
    return 0


def run(server: Server, pool: Any, args: argparse.Namespace, path: Path) -> None:
    counts: Counter[str] = Counter()
    began = time.monotonic()
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(FIELDS)
        next_sample = 0
        while True:
            bad = counts["400"] + counts["503"] + counts["503ts"]
            if bad >= next_sample:
                jobs, heap = live(server)
                row = [bad, counts["400"], counts["503"], counts["503ts"], counts["200"], jobs,
                       f"{heap:.1f}", f"{time.monotonic() - began:.0f}"]  # fmt: skip
                writer.writerow(row)
                file.flush()
                print(",".join(map(str, row)), flush=True)
                next_sample += args.every
            if bad >= args.requests:
                break
            counts += one_round(server, pool)
    unexpected = set(counts) - {"200", "400", "503", "503ts"}
    if unexpected:
        print(f"unexpected statuses: {dict(counts)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
