"""Operating a running server: scaling its workers with checks, telling whether it can
translate now, and whether our front-end plugin guards it (``hymt scale``, ``hymt health``).

TorchServe 0.12.0's management API takes any worker count without a word, and its describe
API can report READY for a worker it has lost; these functions do not trust either.
"""

from __future__ import annotations

import time
from typing import Any

import requests

from hymt_serve.engine.process.shared import exists as alive
from hymt_serve.ops.frontend_guard import URL_PATTERN
from hymt_serve.ops.launcher import (
    LaunchError,
    Server,
    all_ready,
    model_status,
    model_workers,
)
from hymt_serve.ops.server_logs import log_excerpt


class ScaleRefused(LaunchError):
    """Worker counts refused before anything is sent to TorchServe."""


def plural(number: int, noun: str) -> str:
    """``1 worker``, ``2 workers``: a count as a user reads it."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def check_scale(workers: int, max_workers: int, ceiling: int) -> None:
    """Refuse worker counts that TorchServe 0.12.0 would take without a word (a negative count
    removes every worker, a huge one starts workers until the host runs out of memory).

    Raises ScaleRefused naming the bound.
    """
    if workers < 1:
        raise ScaleRefused(f"workers must be at least 1, got {workers} (hymt stop stops serving)")
    if max_workers < workers:
        raise ScaleRefused(f"--max-workers ({max_workers}) must be at least workers ({workers})")
    if max_workers > ceiling:
        raise ScaleRefused(f"at most {ceiling} workers here, got {max_workers}")


def scale(
    server: Server, name: str, workers: int, max_workers: int, timeout: float = 300.0
) -> list[str]:
    """Set ``name``'s workers (always both bounds: TorchServe resets a missing max_worker) and
    wait until exactly ``workers`` are READY; their statuses. Raises LaunchError."""
    response = requests.put(
        f"{server.management_url()}/models/{name}",
        params={"min_worker": str(workers), "max_worker": str(max_workers), "synchronous": "true"},
        headers=server.headers("management"),
        timeout=timeout,
    )
    if response.status_code not in (200, 202):
        raise LaunchError(f"TorchServe refused the scaling: {response.status_code} {response.text}")
    deadline = time.monotonic() + timeout
    statuses = model_status(server, name)
    while not (len(statuses) == workers and all_ready(statuses)):
        if time.monotonic() > deadline:
            raise LaunchError(
                f"workers {statuses} after {timeout:.0f} s\n{log_excerpt(server.log_dir)}"
            )
        time.sleep(0.5)
        statuses = model_status(server, name)
    return statuses


HEALTH_BODY = {"text": "health check", "target_lang": "de", "max_new_tokens": 1}


def health(server: Server, name: str, timeout: float = 8.0) -> list[str]:
    """What stops ``name`` on ``server`` from translating now; [] when it can.

    TorchServe 0.12.0's describe API can report a worker READY whose process is gone and whose
    requests hang (a front end that lost the worker), so READY alone proves nothing: the
    workers' processes must exist (the check runs where the server runs) and a one-token
    translation must come back within ``timeout`` seconds.
    """
    if server.drain_marker.exists():
        return ["draining (hymt drain): out of rotation until the next start"]
    workers = model_workers(server, name)
    if not workers:
        return [f"no workers for {name}"]
    problems = [
        f"worker {w.get('id')} is {w.get('status')}" for w in workers if w.get("status") != "READY"
    ]
    problems += [f"worker {w.get('id')}: process {w['pid']} is gone" for w in _dead(workers)]
    return problems or _translation_problem(server, name, timeout)


def liveness(server: Server, name: str, timeout: float = 8.0) -> list[str]:
    """What says ``name``'s server is dead or stuck; [] when it lives. Looser than
    :func:`health` on purpose (a Kubernetes liveness probe): no translation, so a server busy
    with long batches or answering 503 to a full queue is not killed, and a drain is no
    failure. A worker not READY counts (TorchServe 0.12.0 can leave a restarted async worker
    UNLOADING for good); the probe's threshold must outlast a normal worker reload. The
    describe call may take ``timeout`` seconds."""
    if server.pid() is None:
        return ["TorchServe is not running"]
    workers = model_workers(server, name, timeout)
    if not workers:
        return [f"no workers for {name}"]
    problems = [
        f"worker {w.get('id')} is {w.get('status')}" for w in workers if w.get("status") != "READY"
    ]
    return problems + [f"worker {w.get('id')}: process {w['pid']} is gone" for w in _dead(workers)]


def _dead(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    dead = []
    for worker in workers:
        pid = worker.get("pid")
        if isinstance(pid, int) and pid > 0 and not alive(pid):
            dead.append(worker)
    return dead


def _translation_problem(server: Server, name: str, timeout: float) -> list[str]:
    try:
        response = requests.post(
            f"{server.inference_url()}/predictions/{name}",
            json=HEALTH_BODY,
            headers=server.headers("inference"),
            timeout=timeout,
        )
    except requests.Timeout:
        return [f"a one-token translation got no answer within {timeout:g} s"]
    except requests.RequestException as exc:
        return [f"a one-token translation failed: {type(exc).__name__}"]
    if response.status_code != 200:
        return [f"a one-token translation got HTTP {response.status_code}"]
    return []


def guard_report(server: Server, timeout: float = 8.0) -> str:
    """One line on our front-end plugin (async mode's request maps, thread-safe and forgetting
    answered requests; hymt_serve.ops.frontend_guard): active, not loaded, or what it counts.
    Never raises: a health check reports it and does not fail on it."""
    try:
        response = requests.get(
            f"{server.management_url()}/{URL_PATTERN}",
            headers=server.headers("management"),
            timeout=timeout,
        )
        counts = response.json() if response.status_code == 200 else None
    except (OSError, ValueError) as exc:  # requests' errors and an unreadable key file
        return f"front-end guard: unknown (cannot ask: {type(exc).__name__})"
    if not isinstance(counts, dict):
        return (
            f"front-end guard: not loaded (HTTP {response.status_code}): async workers keep"
            " TorchServe's own request maps"
        )
    guarded, unguarded = counts.get("guarded", 0), counts.get("unguarded", 0)
    facts = (
        f"{plural(guarded, 'async worker')} guarded, {unguarded} unguarded, "
        f"{plural(counts.get('in_backend', 0), 'request')} in the backend, "
        f"{counts.get('forgotten', 0)} forgotten after a whole or error reply"
    )
    if counts.get("scan_errors"):
        return f"front-end guard: failing ({facts}; last error: {counts.get('last_error')})"
    if unguarded:
        return f"front-end guard: partly active ({facts})"
    return f"front-end guard: {'active' if guarded else 'loaded, no async worker'} ({facts})"


def compile_cache_line(name: str, described: dict[str, Any]) -> str:
    """One line on model ``name``'s compile cache from its handler's describe output (the fast
    engine's ``compile_cache``, :mod:`hymt_serve.engine.compile_cache`): reused or why not."""
    engine = described.get("engine")
    fast = engine.get("fast") if isinstance(engine, dict) else None
    cache = fast.get("compile_cache") if isinstance(fast, dict) else None
    if not isinstance(cache, dict) or not cache:
        why = "its engine is not the fast engine" if isinstance(engine, dict) else "unknown"
        return f"{name}: compile cache: none ({why})"
    where = f" in {cache['dir']}" if cache.get("dir") else ""
    if cache.get("reused"):
        counts = (
            f" ({cache.get('fx_graph_hits', 0)} graphs from the cache, "
            f"{cache.get('fx_graph_misses', 0)} compiled; "
            f"{cache.get('files_added', 0)} files added)"
        )
        return f"{name}: compile cache reused{where}{counts}"
    return f"{name}: compile cache not reused{where}: {cache.get('why_not')}"
