"""The front end's cost (issue 59): the same requests through TorchServe directly and through
``hymt web`` in front of the same TorchServe, in one run (``run_bench.py --paths``).

Paths (each sends the sentence mix's segment and its fixed output length):

- ``torchserve``: ``POST /predictions/<model>`` on TorchServe with its inference key, the
  request API's body ``{text, source_lang, target_lang, max_new_tokens}`` (what run_bench
  always sent);
- ``web``: ``POST /api/translate`` on the front end, the page's route: the same body, forwarded
  whole, with ``"stream": false`` (the route streams a single text unless told; the request
  API's own default is false, so TorchServe gets the same request);
- ``openai``: ``POST /v1/chat/completions`` on the front end (docs/openai.md): the text as the
  one user message, our ``source_lang`` and ``target_lang`` (the server writes the model card's
  prompt, as for ``text``), ``max_tokens`` the same length, greedy (no sampling field), not
  streamed.

The front end is started the way an operator starts it (``python -m hymt_serve.cli web``) on a
free loopback port, against TorchServe's work folder, with a key file of its own holding one
client key for the benchmark, its character limit out of reach (``NO_QUOTA``), keys required on
every API route (``--require-keys``: as on any address but loopback, so ``/api/translate``
checks and counts the key as the OpenAI route does), and ``--requests-per-key`` well above the
users, so that no limit of the front end's configuration is what is measured.

:func:`comparison` sets each front-end path beside TorchServe direct at each user count (the
median over rounds of each) against the goals: at most 10 % fewer requests/s at 256 users,
at most 10 ms more p50 at 64 users.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

PATHS = ("torchserve", "web", "openai")
FRONT_END = ("web", "openai")
ROUTES = {
    "torchserve": "/predictions/{model}",
    "web": "/api/translate",
    "openai": "/v1/chat/completions",
}
NO_QUOTA = 10**15  # characters: no run comes near it
KEY_NAME = "bench"
# The goals: (users, what a front-end path may lose against TorchServe direct).
RATE_GOAL = (256, 0.90)  # at least 90 % of direct's requests/s
P50_GOAL = (64, 10.0)  # at most 10 ms more p50
START_TIMEOUT_S = 60.0


def parse_paths(text: str) -> list[str]:
    """``--paths``: names of ``PATHS``, comma separated, each once; a front-end path needs
    ``torchserve`` beside it (what it is compared with)."""
    paths = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [path for path in paths if path not in PATHS]
    if unknown or not paths or len(set(paths)) != len(paths):
        raise ValueError(f"--paths takes some of {', '.join(PATHS)}, each once; got {text!r}")
    if "torchserve" not in paths:
        raise ValueError("--paths needs torchserve: the front-end paths are compared with it")
    return paths


def body(path: str, row: dict[str, Any], output_tokens: int, model: str) -> dict[str, Any]:
    """The JSON body ``path`` sends for the mix's ``row`` with ``output_tokens`` new tokens."""
    if path == "openai":
        return {
            "model": model,
            "messages": [{"role": "user", "content": row["text"]}],
            "source_lang": row["source_lang"],
            "target_lang": row["target_lang"],
            "max_tokens": output_tokens,
        }
    request = {
        "text": row["text"],
        "source_lang": row["source_lang"],
        "target_lang": row["target_lang"],
        "max_new_tokens": output_tokens,
    }
    return {**request, "stream": False} if path == "web" else request


def write_key_file(folder: Path) -> tuple[Path, str]:
    """A key file of the front end's format with one key for the benchmark, no quota to reach:
    (its path, the key)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bench_web_keys.json"
    key = secrets.token_urlsafe(24)
    path.write_text(
        json.dumps({"keys": [{"name": KEY_NAME, "key": key, "character_limit": NO_QUOTA}]})
    )
    path.chmod(0o600)
    (folder / "web_usage.json").unlink(missing_ok=True)  # a former run's counts
    return path, key


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WebFrontEnd:
    """``hymt web`` in front of the TorchServe of ``workdir``, started by :meth:`start` and
    stopped by :meth:`stop` (SIGTERM, then a kill). Its log goes to ``log``."""

    def __init__(
        self, workdir: Path, model: str, log: Path, requests_per_key: int, keys_folder: Path
    ) -> None:
        self.workdir, self.model, self.log = workdir, model, log
        self.requests_per_key = requests_per_key
        self.key_file, self.key = write_key_file(keys_folder)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "hymt_serve.cli", "web",
            "--workdir", str(self.workdir),
            "--model", self.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--client-keys", str(self.key_file),
            "--require-keys",
            "--requests-per-key", str(self.requests_per_key),
        ]  # fmt: skip

    def start(self) -> None:
        """Start it and wait until it answers its liveness probe."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"hymt web exited {self.process.returncode}: {self.tail()}")
            if _answers(f"{self.url}/v2/health/live"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"hymt web did not answer within {START_TIMEOUT_S:g} s: {self.tail()}")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def tail(self, characters: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-characters:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(15)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, its threads included (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def web_cpu(pid: int) -> Callable[[], dict[str, float]]:
    """The front end's CPU seconds so far as a CPU split role (``web``: ``web_cpu_ms``)."""

    def snapshot() -> dict[str, float]:
        try:
            return {"web": cpu_seconds(pid)}
        except (OSError, ValueError, IndexError):
            return {"web": 0.0}

    return snapshot


def ordered(paths: Sequence[str], round_index: int) -> list[str]:
    """``paths`` rotated by the round: each path is measured first in some round."""
    shift = round_index % len(paths)
    return [*paths[shift:], *paths[:shift]]


# The comparison.


def comparison(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each front-end path beside TorchServe direct, per (mode, gpus, users): the medians over
    rounds of requests/s and p50 on each side, their ratio and difference, the per-round
    ratios' spread (each round measures the paths back to back), errors, output mismatches
    and the goal's verdict at the goal's user count."""
    groups: dict[tuple[str, int, int], dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        if row.get("path") not in PATHS:
            continue
        key = (str(row.get("mode", "")), int(row.get("gpus", 1)), int(row["users"]))
        groups.setdefault(key, {}).setdefault(row["path"], []).append(row)
    table = []
    for (mode, gpus, users), by_path in sorted(groups.items()):
        direct = by_path.get("torchserve")
        if not direct:
            continue
        for path in FRONT_END:
            mine = by_path.get(path)
            if mine:
                table.append(_compared(mode, gpus, users, path, mine, direct))
    return table


def _compared(
    mode: str,
    gpus: int,
    users: int,
    path: str,
    mine: list[dict[str, Any]],
    direct: list[dict[str, Any]],
) -> dict[str, Any]:
    rate, direct_rate = _median(mine, "requests_per_s"), _median(direct, "requests_per_s")
    p50, direct_p50 = _median(mine, "p50_ms"), _median(direct, "p50_ms")
    ratio = round(rate / direct_rate, 3) if rate is not None and direct_rate else None
    diff = round(p50 - direct_p50, 1) if p50 is not None and direct_p50 is not None else None
    paired = _per_round(mine, direct)
    entry = {
        "mode": mode,
        "gpus": gpus,
        "users": users,
        "path": path,
        "rounds": len(mine),
        "requests_per_s": rate,
        "torchserve_requests_per_s": direct_rate,
        "ratio": ratio,
        "ratio_spread": _spread([r for r, _ in paired]),
        "p50_ms": p50,
        "torchserve_p50_ms": direct_p50,
        "p50_diff_ms": diff,
        "p50_diff_spread": _spread([d for _, d in paired]),
        "p95_ms": _median(mine, "p95_ms"),
        "torchserve_p95_ms": _median(direct, "p95_ms"),
        "errors": sum(int(r["errors"]) for r in mine),
        "torchserve_errors": sum(int(r["errors"]) for r in direct),
        "output_mismatches": sum(int(r.get("output_mismatches", 0)) for r in [*mine, *direct]),
        "output_tokens_per_request": _per_request(mine, "output_tokens_per_s"),
        "torchserve_output_tokens_per_request": _per_request(direct, "output_tokens_per_s"),
        "prompt_tokens_per_request": _per_request(mine, "prompt_tokens_per_s"),
        "torchserve_prompt_tokens_per_request": _per_request(direct, "prompt_tokens_per_s"),
        "web_cpu_pct": _median(mine, "web_cpu_pct"),
    }
    entry["goal"], entry["verdict"] = _verdict(entry)
    return entry


def _verdict(entry: dict[str, Any]) -> tuple[str, str]:
    """The goal at this user count and whether it was met ("" for neither at others)."""
    value: float | None
    if entry["users"] == RATE_GOAL[0]:
        goal = f"req/s >= {RATE_GOAL[1]:.2f} x TorchServe's"
        value = entry["ratio"]
        met = value is not None and value >= RATE_GOAL[1]
    elif entry["users"] == P50_GOAL[0]:
        goal = f"p50 <= TorchServe's + {P50_GOAL[1]:g} ms"
        value = entry["p50_diff_ms"]
        met = value is not None and value <= P50_GOAL[1]
    else:
        return "", ""
    if entry["errors"] or entry["torchserve_errors"]:
        return goal, "not met (errors)"
    if entry["output_mismatches"]:
        return goal, "no verdict (output lengths differ from those asked for)"
    if value is None:
        return goal, "no verdict (nothing answered)"
    return goal, "goal met" if met else "not met"


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
    return round(statistics.median(values), 3) if values else None


def _per_round(
    mine: list[dict[str, Any]], direct: list[dict[str, Any]]
) -> list[tuple[float, float]]:
    """(ratio, p50 difference) of each round both sides answered in."""
    theirs = {row.get("round", 1): row for row in direct}
    paired = []
    for row in mine:
        other = theirs.get(row.get("round", 1))
        if not other or not other["requests_per_s"] or None in (row["p50_ms"], other["p50_ms"]):
            continue
        ratio = row["requests_per_s"] / other["requests_per_s"]
        paired.append((round(ratio, 3), round(row["p50_ms"] - other["p50_ms"], 1)))
    return paired


def _spread(values: list[float]) -> str:
    return f"{min(values)} to {max(values)}" if len(values) > 1 else ""


def _per_request(rows: list[dict[str, Any]], key: str) -> float | None:
    """Tokens per answered request (tokens/s over requests/s), over all rounds."""
    tokens = sum(r[key] * r["elapsed_s"] for r in rows if isinstance(r.get(key), int | float))
    done = sum(int(r["requests"]) for r in rows)
    return round(tokens / done, 2) if done and tokens else None


def comparison_markdown(table: list[dict[str, Any]]) -> str:
    """The comparison as a Markdown section (empty without front-end paths)."""
    if not table:
        return ""
    head = (
        "| mode | users | path | rounds | req/s | TorchServe req/s | ratio | p50 ms | "
        "TorchServe p50 ms | p50 diff ms | errors | output mismatches | out tokens/req "
        "(path, direct) | front end CPU % | goal | verdict |\n"
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "--- | ---: | --- | --- |\n"
    )
    lines = []
    for e in table:
        ratio = f"{e['ratio']}" + (f" ({e['ratio_spread']})" if e["ratio_spread"] else "")
        diff = f"{e['p50_diff_ms']}" + (
            f" ({e['p50_diff_spread']})" if e["p50_diff_spread"] else ""
        )
        tokens = f"{e['output_tokens_per_request']}, {e['torchserve_output_tokens_per_request']}"
        cells = [
            e["mode"], e["users"], e["path"], e["rounds"], e["requests_per_s"],
            e["torchserve_requests_per_s"], ratio, e["p50_ms"], e["torchserve_p50_ms"], diff,
            f"{e['errors']} / {e['torchserve_errors']}", e["output_mismatches"], tokens,
            _cell(e["web_cpu_pct"]), e["goal"], e["verdict"],
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return (
        "## The front end's cost\n\n"
        "Each front-end path beside TorchServe direct on the same server: medians over the "
        "rounds (in brackets the per-round spread; each round measures the paths back to back, "
        "in an order rotated from round to round). ratio: the path's requests/s over "
        "TorchServe direct's; p50 diff: the path's p50 minus direct's. errors: the path's / "
        "direct's. front end CPU %: hymt web's process, of one core (its event loop is one "
        f"thread). Goals: at {RATE_GOAL[0]} users at most {100 - RATE_GOAL[1] * 100:.0f} % "
        f"fewer requests/s, at {P50_GOAL[0]} users at most {P50_GOAL[1]:g} ms more p50.\n\n"
        + head
        + "\n".join(lines)
        + "\n"
    )


def _cell(value: Any) -> str:
    return "" if value is None else str(value)
