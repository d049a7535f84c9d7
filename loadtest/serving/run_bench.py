"""Serving benchmark: our TorchServe deployment against the naive Flask server, same GPU, same load.

In one run: save a 7B-shaped random-weight model to local disk (once), serve it through the real
package (archive, config.properties, token auth on), drive it with closed-loop users at each
concurrency for a fixed time (``--modes``: ``continuous`` is the GPU profile as shipped,
TorchServe's async mode with the handler's continuous batcher; ``batch`` is TorchServe's own
batching, ``--batch-size`` requests per handler call), then do the same with the naive baseline
(``naive_server.py``: fp16, a lock, one ``generate`` per request). Output lengths are fixed by
one rule for both systems: 1.2 x the source text's tokens (random weights never choose EOS).
Writes results.json, results.md and PNG plots to ``--out``.

    PYTHONPATH=handler:loadtest/serving python loadtest/serving/run_bench.py --out DIR
    PYTHONPATH=handler:loadtest/serving python loadtest/serving/run_bench.py --tiny --out DIR

A soak (``--window``) runs each user count as one long level reported per window, with
TorchServe's live heap and the front-end plugin's counts at each window's end; with
``--bad-fraction`` a share of the requests are ones the handler answers 400 (expected errors):

    ... run_bench.py --skip-naive --users 256 --duration 480 --window 30 --bad-fraction 0.1 \
        --out DIR   (benchmarks/serving/frontend_jobs/gpu_soak.sh: on the GPU machine)

The front end's cost (``--paths``, :mod:`frontend`): on the same TorchServe, ``hymt web`` is
started in front of it and each user count is measured through TorchServe directly
(``torchserve``, as always), the page's route ``/api/translate`` (``web``) and OpenAI's
``/v1/chat/completions`` (``openai``), back to back, ``--rounds`` times in a rotated order;
the report adds each front-end path's ratio and p50 difference to TorchServe direct against
the goals. The handler's language check is off there (``--language-check``): a random model's
output is judged wrong often enough to be generated again, so the work would follow its noise:

    ... run_bench.py --skip-naive --paths torchserve,web,openai --users 64,256 --rounds 3 \
        --duration 10 --warmup 5 --client-processes 4 --out DIR
        (benchmarks/serving/frontend/gpu_frontend.sh: on the GPU machine)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import frontend
import yaml
from client import Job, drive, run_closed_loop, send, summarise, windows
from cpu_split import CpuSnapshot, cpu_snapshot, per_request
from flops import bf16_matmul_rate, flops_per_token, utilisation
from latency_split import MetricsSnapshot, metrics_snapshot, split

REPO = Path(__file__).resolve().parents[2]
MODEL = "hunyuan-mt"
# What a mode's "+extra" sets in the handler's settings.
MODE_EXTRAS = {
    "head": ("handler.quantize_lm_head", True),
    "noprefix": ("handler.prefix_cache_entries", 0),
    "nomix": ("handler.mixed_step_tokens", 0),
    "lt": ("handler.blas_library", "cublaslt"),
    "cublas1": ("handler.one_row_kernel", "cublas"),
}


def build_model(out: Path, tokenizer_dir: Path | None, tiny: bool) -> Path:
    """Save the model folder once (random weights + the real tokenizer)."""
    if (out / "config.json").is_file():
        return out
    if tiny:
        from hymt_serve.ops.tiny_model import build_tiny_model

        return Path(build_tiny_model(out, tokenizer_dir))
    import torch
    from transformers import AutoTokenizer

    from hymt_serve.ops.tiny_model import random_7b_model

    model = random_7b_model("cuda")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


def sentence_jobs(
    model_dir: Path,
    cap: int,
    source_tokens: tuple[int, int] | None = None,
    workload: str = "sentences",
) -> list[tuple[dict[str, Any], int]]:
    """The load test's sentence mix (segments under 300 characters) with fixed lengths, or
    (``workload`` "long") inputs of 500-1,000 tokens made from it (:func:`long_jobs`)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if workload == "long":
        return long_jobs(tokenizer, cap)
    return length_rule_jobs(tokenizer, cap, source_tokens)


LONG_CHARS = 3900  # under the server's max_chars_per_text (4,000)


def long_jobs(
    tokenizer: Any, cap: int, low: int = 500, high: int = 1000, count: int = 64, seed: int = 0
) -> list[tuple[dict[str, Any], int]]:
    """The second workload: ``count`` inputs of about ``low``-``high`` source tokens, each the
    mix's segments of one language pair joined by newlines (cycled: the segments are short)
    until a length drawn from that range is reached, never past ``high`` tokens or
    ``LONG_CHARS`` characters; output lengths by the same rule as the sentences (1.2 x source
    tokens, at most ``cap``)."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for line in (REPO / "loadtest/data/segments.jsonl").read_text().splitlines():
        row = json.loads(line)
        pairs.setdefault((row["source_lang"], row["target_lang"]), []).append(row["text"])
    rng = random.Random(seed)
    jobs = []
    for _ in range(count):
        (source, target), texts = rng.choice(sorted(pairs.items()))
        wanted, start = rng.randint(low, high), rng.randrange(len(texts))
        joined = texts[start]
        for step in range(1, 10_000):
            if _tokens(tokenizer, joined) >= wanted:
                break
            more = f"{joined}\n{texts[(start + step) % len(texts)]}"
            if len(more) > LONG_CHARS or _tokens(tokenizer, more) > high:
                break
            joined = more
        n_in = _tokens(tokenizer, joined)
        body = {"source_lang": source, "target_lang": target, "text": joined}
        jobs.append((body, max(8, min(cap, round(1.2 * n_in)))))
    return jobs


def _tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def length_rule_jobs(
    tokenizer: Any, cap: int, source_tokens: tuple[int, int] | None = None
) -> list[tuple[dict[str, Any], int]]:
    """Each segment under 300 characters with its output length: 1.2 x its source tokens,
    at least 8, at most ``cap`` (random weights never choose EOS, so every system does this).
    ``source_tokens`` (low, high) keeps only segments of that many source tokens."""
    jobs = []
    for line in (REPO / "loadtest/data/segments.jsonl").read_text().splitlines():
        row = json.loads(line)
        if len(row["text"]) >= 300:
            continue
        n_in = len(tokenizer(row["text"], add_special_tokens=False)["input_ids"])
        if source_tokens and not source_tokens[0] <= n_in <= source_tokens[1]:
            continue
        jobs.append((row, max(8, min(cap, round(1.2 * n_in)))))
    if not jobs:
        raise SystemExit(f"no segment has {source_tokens} source tokens")
    return jobs


# Requests the handler answers 400 (an empty text, a target language it does not know), half each.
BAD_CHANGES = ({"text": ""}, {"target_lang": "klingon"})


def made_bad(job: Job, rng: random.Random, fraction: float) -> Job:
    """``job``, or with probability ``fraction`` the same made bad on purpose (one of
    ``BAD_CHANGES``, expecting 400). A fraction of 0 draws nothing: the good jobs are those of
    a run without bad ones."""
    if fraction <= 0:
        return job
    draw = rng.random()
    if draw >= fraction:
        return job
    change = BAD_CHANGES[0] if draw < fraction / 2 else BAD_CHANGES[1]
    return job._replace(body={**job.body, **change}, output_tokens=0, expected_status=400)


class GpuSampler:
    """nvidia-smi utilisation and memory every half second, averaged per window over the GPUs
    in use (those holding more than 1 GB: TorchServe may give a one-worker run any GPU)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        query = [
            "nvidia-smi",
            "--query-gpu=utilization.gpu,memory.used",
            "--format=csv,noheader,nounits",
        ]
        while not self._stop.is_set():
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5, check=True)
                lines = out.stdout.strip().splitlines()
                every = [[float(v) for v in line.split(",")] for line in lines]
                gpus = [g for g in every if g[1] > 1024] or every[:1]
                util = sum(g[0] for g in gpus) / len(gpus)  # mean over the GPUs in use
                self.samples.append((time.monotonic(), util, sum(g[1] for g in gpus) / 1024))
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(0.5)

    def window(self, start: float, end: float) -> dict[str, float | None]:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return {"gpu_util_pct": None, "gpu_mem_gb": None}
        return {
            "gpu_util_pct": round(sum(s[1] for s in inside) / len(inside), 1),
            "gpu_mem_gb": round(max(s[2] for s in inside), 2),
        }


def measure_levels(
    labels: dict[str, Any],
    make_job: Callable[[random.Random], Job],
    users: Sequence[int],
    duration: float,
    sampler: GpuSampler,
    processes: int = 1,
    cpu: CpuSnapshot | None = None,
    timeout: float = 600.0,
    metrics: MetricsSnapshot | None = None,
    keep_alive: bool = False,
    on_errors: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per user count, labelled with ``labels`` (system, mode, gpus); each row is also
    printed as one JSON line (``report_from_logs`` rebuilds a report from those lines). With
    ``cpu``, each row says how much CPU time per request TorchServe's front end, its workers
    and their engine processes spent (:mod:`cpu_split`). A request unanswered after
    ``timeout`` seconds counts as an error. With ``metrics`` (TorchServe's metrics port), each
    row also splits the mean latency around the front end and the engine
    (:mod:`latency_split`). ``on_errors`` runs as soon as a level had errors, before its row
    is printed (a run cut short still keeps what it saves)."""
    rows = []
    for count in users:
        start = time.monotonic()
        before = cpu() if cpu is not None else None
        counted = _read(metrics)
        stats = run_closed_loop(
            make_job, count, duration, timeout=timeout, processes=processes, keep_alive=keep_alive
        )
        if cpu is not None and before is not None:
            stats.update(per_request(before, cpu(), stats["requests"]))
        now = _read(metrics)
        if counted is not None and now is not None:
            stats.update(split(counted, now, stats["mean_ms"]))
        stats.update(
            sampler.window(start, time.monotonic()), **labels, client_processes=processes,
            keep_alive=keep_alive,
        )  # fmt: skip
        if stats["errors"] and on_errors is not None:
            on_errors()
        print(json.dumps(stats), flush=True)
        rows.append(stats)
    return rows


SOAK_GRACE_S = 10.0  # the load goes on past the last window until that window's probe is taken
SOAK_MARGIN_S = 30.0 + SOAK_GRACE_S  # after the windows: the grace, the last requests, stopping


def soak_levels(
    labels: dict[str, Any],
    make_job: Callable[[random.Random], Job],
    args: Any,
    sampler: GpuSampler,
    probe: Callable[[], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each user count of ``args.users`` as one long level, reported per ``args.window`` s:
    good requests/s, p50, p99, unexpected and expected errors of the requests that ended in
    the window, and ``probe()`` (the front end's state: :func:`frontend_state`) taken at the
    window's end, before the level and after its last requests. The level lasts
    ``args.duration`` s in whole windows, fewer where ``args.soak_end_by`` (Unix time) comes
    first. Each level's row (the level's totals, ``windows``, ``before``, ``after``) is printed
    and saved to results.json as soon as it ends."""
    rows = []
    for users in args.users:
        count = _windows_that_fit(args)
        before = probe()
        start = time.monotonic()
        probes: list[dict[str, Any]] = []
        ticker = threading.Thread(
            target=_tick, args=(probe, start, args.window, count, probes), daemon=True
        )
        ticker.start()
        outcome = drive(
            make_job, users, count * args.window + SOAK_GRACE_S, timeout=args.request_timeout,
            processes=args.client_processes, keep_alive=args.keep_alive,
        )  # fmt: skip
        elapsed = time.monotonic() - start
        ticker.join()
        row = {**summarise(outcome, users, elapsed), **labels, "window_s": args.window}
        row.update(client_processes=args.client_processes, keep_alive=args.keep_alive)
        per = windows(outcome.finished, start, args.window, count)
        for index, (window, state) in enumerate(zip(per, probes, strict=True)):
            window.update(
                state,
                **sampler.window(start + index * args.window, start + (index + 1) * args.window),
            )
        row.update(windows=per, before=before, after=probe())
        print(json.dumps(row), flush=True)
        rows.append(row)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return rows


def _windows_that_fit(args: Any) -> int:
    count = int(args.duration // args.window)
    if args.soak_end_by:
        left = args.soak_end_by - time.time() - SOAK_MARGIN_S
        count = min(count, int(left // args.window))
    if count < 1:
        raise SystemExit(f"no {args.window} s window fits before --soak-end-by")
    return count


def _tick(
    probe: Callable[[], dict[str, Any]],
    start: float,
    window: float,
    count: int,
    probes: list[dict[str, Any]],
) -> None:
    """``probe()`` at the end of each of ``count`` windows from ``start``, printed as it
    comes (a run cut short still shows the heap it had)."""
    for index in range(1, count + 1):
        time.sleep(max(0.0, start + index * window - time.monotonic()))
        state = probe()
        state["probed_at_s"] = round(time.monotonic() - start, 1)
        probes.append(state)
        print(json.dumps({"window": index, **state}), flush=True)


def _read(metrics: MetricsSnapshot | None) -> dict[str, float] | None:
    """The metrics' sums now; None without a metrics port or when it does not answer."""
    if metrics is None:
        return None
    try:
        return dict(metrics())
    except OSError as error:
        print(json.dumps({"metrics_unreadable": f"{type(error).__name__}: {error}"}), flush=True)
        return None


def wait_first_success(job: Job, started: float, timeout: float = 300) -> float:
    """Seconds from ``started`` until the first successful translation."""
    while time.monotonic() - started < timeout:
        reply = send(job, 60)
        if reply.error is None and not reply.expected_error:
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)
    raise RuntimeError(f"no successful translation within {timeout} s")


def bench_torchserve(
    model_dir: Path,
    jobs: list[tuple[dict[str, Any], int]],
    args: Any,
    sampler: GpuSampler,
    work: Path,
    gpus: int = 1,
    mode: str = "continuous",
) -> tuple[list[dict[str, Any]], float]:
    """One worker per GPU (TorchServe assigns GPUs to workers round robin), or K sharing its
    engine process with ``+sharedK``."""
    from hymt_serve.ops.archive import build_archive
    from hymt_serve.ops.launcher import start, stop, wait_ready
    from hymt_serve.ops.server_logs import log_excerpt

    profile = "cpu" if args.tiny else "gpu"
    template = REPO / f"configs/model-config-{profile}.yaml"
    # e.g. continuous-fp8, continuous-fp8+head, continuous+noprefix
    base, *extras = mode.split("+")
    base, _, quantization = base.partition("-")
    overrides: dict[str, Any] = {}
    if quantization:
        overrides["handler.quantization"] = quantization
    # The profile's workers per GPU (the GPU profile's share one engine process); one in batch
    # mode, which has no shared engine.
    per_gpu = 1
    if base == "continuous":
        per_gpu = 1 if args.tiny else int(yaml.safe_load(template.read_text())["minWorkers"])
    else:
        overrides["handler.share_engine"] = False
    for extra in extras:
        if extra.startswith("rows"):  # rowsN: N KV-cache slots (max_batch_rows)
            overrides["handler.max_batch_rows"] = int(extra.removeprefix("rows"))
        elif extra.startswith("shared"):  # sharedK: K workers per GPU feeding one engine each
            per_gpu = int(extra.removeprefix("shared"))
            overrides["handler.share_engine"] = True
        elif extra == "unshared":  # one worker per GPU with its own engine child process
            per_gpu = 1
            overrides["handler.share_engine"] = False
        else:
            overrides[MODE_EXTRAS[extra][0]] = MODE_EXTRAS[extra][1]
    overrides.update(minWorkers=gpus * per_gpu, maxWorkers=gpus * per_gpu)
    overrides.update(path_overrides(args, template))
    # The mix repeats its sentences: measure the model, not the translation memory's answers.
    overrides["handler.translation_memory"] = False
    if base == "continuous":
        overrides.update({"asyncCommunication": True, "batchSize": 1})
        if args.tiny:
            overrides["handler.engine"] = "fast"
    else:
        overrides.update(
            {
                "asyncCommunication": False,
                "batchSize": args.batch_size,
                "maxBatchDelay": args.batch_delay,
            }
        )
    build_archive(
        model_path=model_dir,
        template=template,
        export_path=work / "model_store",
        overrides=overrides,
    )
    started = time.monotonic()
    server, _ = start(REPO / "config.properties", work / "run", model_store=work / "model_store")
    try:
        wait_ready(server, [MODEL], timeout=900)
        url = f"{server.inference_url()}/predictions/{MODEL}"

        def good_job(rng: random.Random) -> Job:
            row, n = rng.choice(jobs)
            body = {
                "text": row["text"],
                "source_lang": row["source_lang"],
                "target_lang": row["target_lang"],
                "max_new_tokens": n,
            }
            return Job(url, body, server.headers("inference"), n)

        def make_job(rng: random.Random) -> Job:
            return made_bad(good_job(rng), rng, args.bad_fraction)

        cold = wait_first_success(good_job(random.Random(0)), started)
        print(json.dumps({"cold_start": _cold_name(mode, gpus), "seconds": cold}), flush=True)
        labels = {"system": "torchserve", "mode": mode, "gpus": gpus}
        pid = server.pid()
        cpu = cpu_snapshot(pid) if pid is not None else None

        def save_log() -> None:  # what TorchServe logged, beside the report
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"errors-{mode}-{gpus}.log").write_text(
                log_excerpt(server.log_dir, 200) + "\n"
            )

        if args.window:
            rows = soak_levels(labels, make_job, args, sampler, lambda: frontend_state(server))
            if any(row["errors"] for row in rows):
                save_log()
        elif front_end_paths(args):
            rows = measure_paths(server, jobs, args, sampler, labels, cpu, save_log, work)
        else:
            rows = measure_levels(
                labels, make_job, args.users, args.duration, sampler, args.client_processes,
                cpu, timeout=args.request_timeout,
                metrics=metrics_snapshot(server.metrics_url()), keep_alive=args.keep_alive,
                on_errors=save_log,
            )  # fmt: skip
        (work / f"describe-{mode}-{gpus}.json").write_text(describe(server))
        save_server_state(server, args.out, f"{mode}-{gpus}")
        return rows, cold
    finally:
        stop(server)


def front_end_paths(args: Any) -> list[str]:
    """The paths of ``--paths`` through hymt web (none by default)."""
    return [path for path in getattr(args, "paths", ["torchserve"]) if path in frontend.FRONT_END]


def path_overrides(args: Any, template: Path) -> dict[str, Any]:
    """The archive's settings for the front-end paths: the language check as
    ``--language-check`` says (off by default with a front-end path: a random model's output
    is judged wrong often enough to be generated again, so each path's work would follow
    that noise), and a job queue large enough that hymt web's
    upstream slots (``UPSTREAM_SHARE`` of it) hold every user's request."""
    overrides: dict[str, Any] = {}
    check = args.language_check
    if check is None and front_end_paths(args):
        check = "off"
    if check not in (None, "profile"):
        overrides["handler.target_language_check"] = check
    if front_end_paths(args):
        from hymt_serve.web.fairness import DEFAULT_QUEUE, UPSTREAM_SHARE

        queue = int(yaml.safe_load(template.read_text()).get("jobQueueSize", DEFAULT_QUEUE))
        if int(queue * UPSTREAM_SHARE) < max(args.users):
            overrides["jobQueueSize"] = math.ceil(max(args.users) / UPSTREAM_SHARE) + 1
    return overrides


def measure_paths(
    server: Any,
    jobs: list[tuple[dict[str, Any], int]],
    args: Any,
    sampler: GpuSampler,
    labels: dict[str, Any],
    cpu: CpuSnapshot | None,
    save_log: Callable[[], None],
    work: Path,
) -> list[dict[str, Any]]:
    """``hymt web`` in front of ``server``; each user count through each of ``args.paths``
    back to back, ``args.rounds`` times (the paths' order rotated each round), after
    ``args.warmup`` s of every path at the most users. A front-end path's rows add hymt web's
    CPU per request (``web_cpu_ms``) and its share of one core (``web_cpu_pct``)."""
    name = f"{labels['mode']}-{labels['gpus']}"
    web = frontend.WebFrontEnd(
        server.workdir, MODEL, work / f"web-{name}.log",
        requests_per_key=4 * max(args.users), keys_folder=work / f"web-keys-{name}",
    )  # fmt: skip
    torchserve_headers = server.headers("inference")  # read once, as the front end's are
    urls = {
        path: f"{server.inference_url()}/predictions/{MODEL}"
        if path == "torchserve"
        else f"{web.url}{frontend.ROUTES[path]}"
        for path in args.paths
    }

    def job_maker(path: str) -> Callable[[random.Random], Job]:
        headers = torchserve_headers if path == "torchserve" else web.headers()

        def make_job(rng: random.Random) -> Job:
            row, n = rng.choice(jobs)
            return Job(urls[path], frontend.body(path, row, n, MODEL), headers, n)

        return make_job

    def save_logs() -> None:
        save_log()
        (args.out / f"errors-web-{name}.log").write_text(web.tail(20_000) + "\n")

    makers = {path: job_maker(path) for path in args.paths}
    web.start()
    try:
        for path in args.paths:
            first_answer(makers[path](random.Random(0)), path)
        if args.warmup > 0:
            for path in args.paths:
                warm = run_closed_loop(
                    makers[path], max(args.users), args.warmup, timeout=args.request_timeout,
                    processes=args.client_processes, keep_alive=args.keep_alive,
                )  # fmt: skip
                print(json.dumps({"warmup": path, **warm}), flush=True)
        rows = []
        web_pid = web.pid()
        for index in range(args.rounds):
            for users in args.users:
                for path in frontend.ordered(args.paths, index):
                    split = cpu
                    if path != "torchserve" and web_pid is not None:
                        split = _with_web(cpu, frontend.web_cpu(web_pid))
                    [row] = measure_levels(
                        {**labels, "system": path, "path": path, "round": index + 1},
                        makers[path], [users], args.duration, sampler, args.client_processes,
                        split, timeout=args.request_timeout,
                        metrics=metrics_snapshot(server.metrics_url()),
                        keep_alive=args.keep_alive, on_errors=save_logs,
                    )  # fmt: skip
                    if isinstance(row.get("web_cpu_ms"), int | float):
                        row["web_cpu_pct"] = round(
                            row["web_cpu_ms"] * row["requests_per_s"] / 10, 1
                        )
                    rows.append(row)
        return rows
    finally:
        web.stop()


def _with_web(cpu: CpuSnapshot | None, web: CpuSnapshot) -> CpuSnapshot:
    """TorchServe's CPU split (when psutil is there) with hymt web's process beside it."""
    return (lambda: {**cpu(), **web()}) if cpu is not None else web


def first_answer(job: Job, path: str, timeout: float = 60.0) -> None:
    """Wait until ``job`` is answered 200 (TorchServe is ready already: this is the path's
    first call); a refusal of the request itself (a 4xx: a route or body this tree's front
    end does not take) ends the run at once, with the answer."""
    deadline = time.monotonic() + timeout
    while True:
        reply = send(job, 60)
        if reply.error is None:
            return
        refused = re.match(r"HTTP 4\d\d", reply.error) and not reply.error.startswith("HTTP 429")
        if refused or time.monotonic() > deadline:
            raise RuntimeError(f"the {path} path ({job.url}) does not translate: {reply.error}")
        time.sleep(0.5)


def describe(server: Any) -> str:
    """The worker's own description (engine, scheduler counters) after the run."""
    return _get(f"{server.management_url()}/models/{MODEL}?customized=true", server)


def save_server_state(server: Any, out: Path, name: str) -> None:
    """Beside the report, after a mode's levels: the front-end plugin's counts (whether each
    worker's async request map was made thread-safe) and the metrics port's text (TorchServe's
    system metrics, the handler's). A part that cannot be read is written as its error."""
    out.mkdir(parents=True, exist_ok=True)
    from hymt_serve.ops.frontend_guard import URL_PATTERN

    for file, url in (
        (f"guard-{name}.json", f"{server.management_url()}/{URL_PATTERN}"),
        (f"metrics-{name}.txt", f"{server.metrics_url()}/metrics"),
    ):
        try:
            text = _get(url, server)
        except OSError as exc:  # urllib's errors are OSErrors
            text = f"unreadable: {exc}\n"
        (out / file).write_text(text)


def frontend_state(server: Any) -> dict[str, Any]:
    """TorchServe's front end now: its JVM's heap after a full GC (:func:`java_heap`) and the
    front-end plugin's counts (guarded, in_backend, forgotten, late_replies, worker_died). A
    part that cannot be read is given as its error."""
    from hymt_serve.ops.frontend_guard import URL_PATTERN

    state: dict[str, Any] = {}
    try:
        state.update(java_heap(server.pid()))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        state["heap_error"] = f"{type(exc).__name__}: {exc}"
    try:
        state.update(json.loads(_get(f"{server.management_url()}/{URL_PATTERN}", server)))
    except (OSError, ValueError) as exc:
        state["guard_error"] = f"{type(exc).__name__}: {exc}"
    return state


HEAP_LINE = re.compile(r"total (?:reserved \d+K, committed )?(\d+)K, used (\d+)K")


def java_heap(pid: int | None) -> dict[str, Any]:
    """``jcmd`` (beside the java that runs ``pid``): ``GC.class_histogram`` forces a full GC
    and lists the live objects: their total (the live heap) and the ``RestJob`` objects (one
    per HTTP request the front end holds); then ``GC.heap_info``: the heap's used and
    committed sizes after that GC (summed over its generations)."""
    if pid is None:
        raise OSError("TorchServe is not running")
    jcmd = Path(os.readlink(f"/proc/{pid}/exe")).parent / "jcmd"
    began = time.monotonic()
    state = {"live_heap_mib": 0.0, "restjob_objects": 0}
    for words in (line.split() for line in _jcmd(jcmd, pid, "GC.class_histogram")):
        if len(words) >= 4 and words[3] == "org.pytorch.serve.job.RestJob":
            state["restjob_objects"] = int(words[1])
        elif words[:1] == ["Total"]:
            state["live_heap_mib"] = round(int(words[2]) / 2**20, 2)
    sizes = [HEAP_LINE.search(line) for line in _jcmd(jcmd, pid, "GC.heap_info")]
    found = [m for m in sizes if m is not None]
    state["heap_used_mib"] = round(sum(int(m[2]) for m in found) / 1024, 1)
    state["heap_committed_mib"] = round(sum(int(m[1]) for m in found) / 1024, 1)
    state["jcmd_s"] = round(time.monotonic() - began, 2)
    return state


def _jcmd(jcmd: Path, pid: int, command: str) -> list[str]:
    done = subprocess.run(
        [str(jcmd), str(pid), command], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.splitlines()


def _get(url: str, server: Any) -> str:
    import urllib.request

    request = urllib.request.Request(url, headers=server.headers("management"))
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(response.read().decode())


def bench_naive(
    model_dir: Path, jobs: list[tuple[dict[str, Any], int]], args: Any, sampler: GpuSampler
) -> tuple[list[dict[str, Any]], float]:
    port = 5077
    started = time.monotonic()
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("naive_server.py")),
            "--model-path",
            str(model_dir),
            "--port",
            str(port),
        ]
    )
    url = f"http://127.0.0.1:{port}/translate"

    def make_job(rng: random.Random) -> Job:
        row, n = rng.choice(jobs)
        body = {
            "text": row["text"],
            "src_lang": row["source_lang"],
            "tgt_lang": row["target_lang"],
            "max_new_tokens": n,
        }
        return Job(url, body, {}, n)

    try:
        cold = wait_first_success(make_job(random.Random(0)), started)
        print(json.dumps({"cold_start": "naive", "seconds": cold}), flush=True)
        labels = {"system": "naive", "mode": "naive", "gpus": 1}
        return (
            measure_levels(
                labels, make_job, args.naive_users, args.duration, sampler, args.client_processes
            ),
            cold,
        )
    finally:
        process.terminate()
        process.wait(60)


def write_report(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    columns = [
        "system",
        "mode",
        "gpus",
        "users",
        "requests_per_s",
        "prompt_tokens_per_s",
        "output_tokens_per_s",
        "model_tflops",
        "mfu_pct",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "errors",
        "gpu_util_pct",
        "gpu_mem_gb",
    ]
    if any("worker_cpu_ms" in r for r in result["rows"]):  # the path's CPU per request
        columns += ["frontend_cpu_ms", "worker_cpu_ms", "engine_cpu_ms"]
    if any("path" in r for r in result["rows"]):  # the front end's cost (--paths)
        columns[1:1] = ["round"]
        columns += ["web_cpu_ms", "web_cpu_pct", "output_mismatches"]
    if any("machine" in r for r in result["rows"]):  # rows merged from several machines
        columns.append("machine")
    head = "| " + " | ".join(columns) + " |\n| --- |" + " ---: |" * (len(columns) - 1) + "\n"
    lines = ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in result["rows"]]
    cold = ", ".join(f"{k} {v} s" for k, v in result["cold_start_s"].items())
    paths_note = f"{result['paths_note']}\n\n" if result.get("paths_note") else ""
    compared = frontend.comparison_markdown(result.get("frontend_comparison") or [])
    text = (
        f"# Serving benchmark: {result['gpu']}, {result['date']}\n\n`{result['command']}`\n\n"
        f"{result['note']}\n\n{paths_note}Cold start (start command to first translation): "
        f"{cold}.\n\n{_utilisation_note(result)}\n\n"
        + (f"{compared}\n## Every level\n\n" if compared else "")
        + head
        + "\n".join(lines)
        + "\n"
    )
    (out / "results.md").write_text(text)
    title = (
        "Hunyuan-MT 7B-shaped model: TorchServe direct vs through hymt web"
        if result.get("paths_note")
        else "Hunyuan-MT 7B-shaped model: TorchServe deployment vs naive Flask server"
    )
    plot(out, result["rows"], title)


def _utilisation_note(result: dict[str, Any]) -> str:
    """What model_tflops and mfu_pct mean (reports from before they existed say nothing)."""
    flops = result.get("model_flops_per_token")
    if flops is None:
        return ""
    rate = result.get("bf16_matmul_tflops")
    measured = f"{rate} TFLOP/s measured" if rate else "not measured here (no CUDA)"
    return (
        f"model_tflops: (prompt + output tokens/s as the replies count them) x "
        f"{flops / 1e9:.2f} GFLOP per token (2 x the projections' and LM head's weights). "
        f"mfu_pct: that over the card's bf16 matrix rate (an 8192-cubed product: {measured})."
    )


def plot(out: Path, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))

    def key(row: dict[str, Any]) -> tuple[str, str, int, str]:
        return row["system"], row.get("mode", ""), row["gpus"], row.get("machine", "")

    systems = sorted({key(r) for r in rows})
    markers = ("s", "o", "^", "v", "D", "P")
    for index, (name, mode, gpus, machine) in enumerate(systems):
        mine = _medians(
            [r for r in rows if key(r) == (name, mode, gpus, machine) and r["requests"]]
        )
        system = name if mode in ("", "naive") else f"{name} {mode}"
        system = system if gpus == 1 else f"{system} x{gpus} GPUs"
        system = f"{system} ({machine})" if machine else system
        color, marker = f"C{index}", markers[index % len(markers)]
        users = [r["users"] for r in mine]
        left.plot(users, [r["requests_per_s"] for r in mine], marker=marker, color=color,
                  label=system)  # fmt: skip
        right.plot(users, [r["p50_ms"] for r in mine], marker=marker, color=color,
                   label=f"{system} p50")  # fmt: skip
        right.plot(users, [r["p95_ms"] for r in mine], marker=marker, color=color,
                   linestyle=":", alpha=0.6, label=f"{system} p95")  # fmt: skip
    for axis, label in ((left, "requests/s"), (right, "latency ms")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("concurrent users")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "serving.png", dpi=110)


def _medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per user count: the rows themselves, or (rounds of --paths) the medians of
    their requests/s and latencies."""
    by_users: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_users.setdefault(row["users"], []).append(row)
    if all(len(same) == 1 for same in by_users.values()):
        return rows
    keys = ("requests_per_s", "p50_ms", "p95_ms")
    return [
        {"users": users, **{k: statistics.median(r[k] for r in same) for k in keys}}
        for users, same in sorted(by_users.items())
    ]


SOAK_COLUMNS = {  # table heading: a window's key
    "window": "window",
    "end s": "end_s",
    "req/s": "requests_per_s",
    "p50 ms": "p50_ms",
    "p99 ms": "p99_ms",
    "unexpected errors": "errors",
    "400s": "expected_errors",
    "live heap MiB": "live_heap_mib",
    "heap used MiB": "heap_used_mib",
    "RestJob": "restjob_objects",
    "in_backend": "in_backend",
    "forgotten": "forgotten",
    "GPU %": "gpu_util_pct",
}


def write_soak_report(out: Path, result: dict[str, Any]) -> None:
    """results.json; per soak level a table of its windows (soak.md, soak.csv: the front end
    before the level and after its last requests as rows of their own) with the first and last
    windows' ratios, and soak.png."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    texts, lines = [], [",".join(["mode", "users", *SOAK_COLUMNS])]
    for row in result["rows"]:
        table = [{**row["before"], "window": "before"}, *row["windows"]]
        table.append({**row["after"], "window": "after"})
        cells = [[_cell(window.get(key)) for key in SOAK_COLUMNS.values()] for window in table]
        lines += [",".join([row["mode"], str(row["users"]), *line]) for line in cells]
        head = "| " + " | ".join(SOAK_COLUMNS) + " |\n|" + " ---: |" * len(SOAK_COLUMNS)
        body = "\n".join("| " + " | ".join(line) + " |" for line in cells)
        texts.append(
            f"## {row['mode']}, {row['users']} users, {len(row['windows'])} windows of "
            f"{row['window_s']:g} s\n\n{head}\n{body}\n\n{soak_summary(row)}\n"
        )
    (out / "soak.csv").write_text("\n".join(lines) + "\n")
    (out / "soak.md").write_text(
        f"# Soak: {result['gpu']}, {result['date']}\n\n`{result['command']}`\n\n"
        f"{result['note']}\n\n" + "\n".join(texts)
    )
    plot_soak(out, result["rows"])


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def soak_summary(row: dict[str, Any]) -> str:
    """The level's totals and its last window over its first."""
    first, last = row["windows"][0], row["windows"][-1]

    def ratio(key: str) -> str:
        a, b = first.get(key), last.get(key)
        return (
            f"{b / a:.3f}"
            if isinstance(a, int | float) and isinstance(b, int | float) and a
            else "n/a"
        )

    heaps = [w["live_heap_mib"] for w in row["windows"] if "live_heap_mib" in w]
    spread = f"{min(heaps)}-{max(heaps)} MiB" if heaps else "not read"
    return (
        f"Whole level: {row['requests']} good requests ({row['requests_per_s']} /s), "
        f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, {row['errors']} unexpected errors, "
        f"{row['expected_errors']} expected 400s. Last window / first: req/s "
        f"{ratio('requests_per_s')}, p50 {ratio('p50_ms')}, p99 {ratio('p99_ms')}, live heap "
        f"{ratio('live_heap_mib')} (windows' live heap {spread}). Unexpected errors: "
        f"{row['error_samples'] or 'none'}."
    )


def plot_soak(out: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, latency, heap) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    for index, row in enumerate(rows):
        color, name = f"C{index}", f"{row['mode']}, {row['users']} users"
        minutes = [w["end_s"] / 60 for w in row["windows"]]
        rate.plot(minutes, [w["requests_per_s"] for w in row["windows"]], "o-", color=color,
                  label=name)  # fmt: skip
        latency.plot(minutes, [w["p50_ms"] for w in row["windows"]], "o-", color=color,
                     label=f"{name} p50")  # fmt: skip
        latency.plot(minutes, [w["p99_ms"] for w in row["windows"]], "o:", color=color,
                     alpha=0.6, label=f"{name} p99")  # fmt: skip
        heap.plot(minutes, [w.get("live_heap_mib") for w in row["windows"]], "o-", color=color,
                  label=f"{name} live heap")  # fmt: skip
        heap.plot(minutes, [w.get("in_backend") for w in row["windows"]], "x--", color=color,
                  alpha=0.6, label=f"{name} in_backend (requests)")  # fmt: skip
    rate.set_ylabel("good requests/s")
    latency.set_ylabel("latency of good requests, ms")
    heap.set_ylabel("front end: live heap MiB / in_backend")
    heap.set_xlabel("minutes (window ends)")
    for axis in (rate, latency, heap):
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7, loc="lower right")
    fig.suptitle("TorchServe under a long level with bad requests: per window")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/hymt-7b-random"))
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU (smoke test)")
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument(
        "--users", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64, 128]
    )
    parser.add_argument(
        "--naive-users", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="seconds a request to TorchServe may take before it counts as an error (the naive "
        "server's queue is what it measures: its requests may take 600); a level with errors "
        "saves the end of TorchServe's logs as errors-MODE-GPUS.log in --out",
    )
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="each user keeps one connection to TorchServe for all its requests (a client with "
        "a connection pool); by default every request opens its own",
    )
    parser.add_argument(
        "--gpus",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1],
        help="GPU counts for the continuous mode (the profile's workers per GPU), e.g. 1,2; batch "
        "runs on 1",
    )
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["continuous"],
        help="TorchServe modes to run: continuous (the GPU profile), batch (TorchServe "
        "batching); a quantization after a dash serves the model quantized at load, e.g. "
        "continuous-fp8; +head quantizes its LM head too (continuous-fp8+head), +noprefix "
        "turns the kept prompt prefixes off (continuous+noprefix), +sharedK runs K workers "
        "per GPU that share its engine process (continuous+shared3), +unshared one worker per "
        "GPU with its own engine child, +rowsN sets max_batch_rows (continuous+rows128), +lt "
        "sends the dense products to cuBLASLt (blas_library), +cublas1 one row of them to cuBLAS "
        "instead of the tiled Triton kernel (one_row_kernel)",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="split the users over this many client processes (for servers past ~400 req/s)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batch-delay", type=int, default=5)
    parser.add_argument("--cap", type=int, default=512)
    parser.add_argument(
        "--source-tokens",
        type=lambda text: tuple(int(x) for x in text.split("-", 1)),
        default=None,
        help="LOW-HIGH: only segments with that many source tokens (e.g. 28-32)",
    )
    parser.add_argument(
        "--workload",
        choices=("sentences", "long"),
        default="sentences",
        help="the load test's sentence mix, or inputs of 500-1,000 tokens made from it",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/hymt-serving-work"))
    parser.add_argument(
        "--bad-fraction",
        type=float,
        default=0.0,
        help="each request is, with this probability, one the handler answers 400 (an empty "
        "text or an unknown target language, half each): counted apart as expected errors",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=0.0,
        help="soak: each user count is one level of --duration s, reported per window of this "
        "many seconds with TorchServe's live heap after a full GC (jcmd) and the front-end "
        "plugin's counts at each window's end (soak.md, soak.csv, soak.png; no results.md)",
    )
    parser.add_argument(
        "--soak-end-by",
        type=float,
        default=0.0,
        help="Unix time by which a soak level must be over: it keeps only the windows that end "
        f"{SOAK_MARGIN_S:g} s before it (a device call's time limit)",
    )
    parser.add_argument(
        "--paths",
        type=_paths,
        default=["torchserve"],
        help="where the requests go, comma separated (default torchserve): torchserve "
        "(/predictions on TorchServe), web (hymt web's /api/translate, in front of the same "
        "TorchServe), openai (hymt web's /v1/chat/completions with target_lang); with web or "
        "openai each user count is measured through every path back to back and the report "
        "compares each with TorchServe direct (the front end's cost)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --paths: measure every user count through every path this many times, the "
        "paths' order rotated each round (the comparison takes the medians)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="with --paths: seconds of load through each path at the most users before the "
        "first level (not reported)",
    )
    parser.add_argument(
        "--language-check",
        choices=("profile", "retry", "report", "off"),
        default=None,
        help="the handler's target_language_check: the profile's (default), or this; with a "
        "front-end path in --paths off by default (retries of a random model's output would "
        "make each path's work follow its noise)",
    )
    args = parser.parse_args()
    check_paths(parser, args)
    from hymt_serve.ops.tiny_model import default_tokenizer_dir

    model_dir = build_model(args.model_dir, args.tokenizer or default_tokenizer_dir(), args.tiny)
    cap = args.cap if not args.tiny else 32
    jobs = sentence_jobs(model_dir, cap, args.source_tokens, args.workload)
    print(json.dumps({"segments": len(jobs)}), flush=True)
    flops = flops_per_token(json.loads((model_dir / "config.json").read_text()))
    rate = None if args.tiny or args.window else bf16_matmul_rate()  # no MFU in a soak
    print(json.dumps({"model_flops_per_token": flops, "bf16_matmul_flops": rate}), flush=True)
    sampler = GpuSampler()
    work = args.work
    rows: list[dict[str, Any]] = []
    colds: dict[str, float] = {}
    for mode in args.modes:
        for gpus in args.gpus if mode.startswith("continuous") else [1]:
            ts_rows, colds[_cold_name(mode, gpus)] = bench_torchserve(
                model_dir, jobs, args, sampler, work, gpus, mode
            )
            rows += ts_rows
    if not args.skip_naive:
        naive_rows, colds["naive"] = bench_naive(model_dir, jobs, args, sampler)
        rows += naive_rows
    for row in rows:
        row.update(utilisation(row, flops, rate))
    result = report(rows, colds, args, len(jobs), " ".join(["python", *sys.argv]))
    result.update(
        model_flops_per_token=flops,
        bf16_matmul_tflops=None if rate is None else round(rate / 1e12, 1),
    )
    (write_soak_report if args.window else write_report)(args.out, result)


def _paths(text: str) -> list[str]:
    try:
        return frontend.parse_paths(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def check_paths(parser: argparse.ArgumentParser, args: Any) -> None:
    """What the front-end paths cannot be combined with, and the OpenAI route's presence."""
    if not front_end_paths(args):
        return
    if args.window or args.bad_fraction:
        parser.error("--paths with web or openai is not a soak: no --window or --bad-fraction")
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if "openai" in args.paths and importlib.util.find_spec("hymt_serve.web.openai_routes") is None:
        parser.error(
            "the openai path needs hymt web's /v1/chat/completions (hymt_serve/web/"
            "openai_routes.py), which this tree does not have"
        )


def _cold_name(mode: str, gpus: int) -> str:
    name = "torchserve" if mode == "continuous" else f"torchserve_{mode}"
    return name if gpus == 1 else f"{name}_{gpus}gpus"


def report(
    rows: list[dict[str, Any]], colds: dict[str, float], args: Any, segments: int, command: str
) -> dict[str, Any]:
    gpu_profile = yaml.safe_load((REPO / "configs/model-config-gpu.yaml").read_text())
    return {
        "gpu": _gpu_name(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "cold_start_s": colds,
        "rows": rows,
        "duration_s": args.duration,
        "modes": args.modes,
        "batch_size": args.batch_size,
        "max_batch_delay_ms": args.batch_delay,
        "segments": segments,
        "workload": args.workload,
        "note": (
            f"Closed-loop users for {args.duration:.0f} s per level; "
            + (
                f"the load test's sentence mix ({segments} segments under 300 characters, "
                "many language pairs)"
                if args.workload == "sentences"
                else f"{segments} inputs of 500-1,000 tokens joined from the sentence mix"
            )
            + "; output "
            "length 1.2 x source tokens for every system; token auth on. Mode continuous: "
            "the GPU profile as shipped (TorchServe async mode, batchSize 1, "
            f"{gpu_profile['minWorkers']} workers per GPU feeding one engine process whose "
            f"continuous batcher runs {gpu_profile['handler']['max_batch_rows']} KV-cache "
            "slots; +unshared: one worker with its own engine child, +sharedK: K workers, "
            f"+rowsN: N slots); mode batch: one worker per GPU, TorchServe batching, "
            f"batchSize {args.batch_size}, "
            f"maxBatchDelay {args.batch_delay} ms, the fast engine per batch." + _soak_note(args)
        ),
        "bad_fraction": args.bad_fraction,
        "window_s": args.window,
        **_paths_report(rows, args),
    }


def _paths_report(rows: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    """With front-end paths: the paths, rounds, the handler's language check, a note on how
    they were sent and the comparison (:func:`frontend.comparison`); nothing otherwise."""
    if not front_end_paths(args):
        return {}
    routes = ", ".join(f"{path} {frontend.ROUTES[path].format(model=MODEL)}" for path in args.paths)
    return {
        "paths": args.paths,
        "rounds": args.rounds,
        "warmup_s": args.warmup,
        "language_check": args.language_check or "off",
        "paths_note": (
            f"Paths: {routes}. Each user count through each path back to back, "
            f"{args.rounds} round(s), the order rotated each round, after {args.warmup:g} s of "
            "each path at the most users. hymt web (python -m hymt_serve.cli web) on loopback "
            "in front of the same TorchServe, started with --require-keys (every API route "
            "checks and counts the client key: the page's /api/translate as the OpenAI route "
            "does), one client key whose character limit no run reaches, --requests-per-key "
            f"{4 * max(args.users)}. Bodies: the request API's {{text, source_lang, "
            "target_lang, max_new_tokens} (web adds stream false, the request API's default); "
            "openai: the text as the one user message with source_lang and target_lang, "
            "max_tokens the same length, greedy. The handler's target_language_check: "
            f"{args.language_check or 'off'} (the chat form with target_lang is checked too). "
            "output_mismatches: replies with other output tokens than asked for."
        ),
        "frontend_comparison": frontend.comparison(rows),
    }


def _soak_note(args: Any) -> str:
    text = ""
    if args.bad_fraction:
        text += (
            f" Bad requests: each request with probability {args.bad_fraction:g} (half an empty"
            " text, half an unknown target language), which the handler answers 400: counted"
            " as expected errors, apart; requests/s and latencies count good requests only, and"
            " an unexpected error is any other failure (another status, a timeout, a reset)."
        )
    if args.window:
        text += (
            f" Soak: one level per user count, in windows of {args.window:g} s (a request"
            " counts in the window it ended in; those still running at the end in none); at"
            " each window's end TorchServe's front end: a full GC and its live heap (jcmd"
            " GC.class_histogram: the live objects' total and RestJob objects, then"
            " GC.heap_info: used), and the front-end plugin's counts (GET"
            " /hymt-frontend-guard)."
        )
    return text


def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    except ImportError:
        return "unknown"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
