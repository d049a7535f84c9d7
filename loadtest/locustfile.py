"""Locust load test for the Hunyuan-MT TorchServe endpoint.

Replays realistic translation traffic from ``data/segments.jsonl`` against
``POST /predictions/<model>`` and checks every response against the service contract.
The exit code is the verdict: 1 when any request failed, no request completed, or the p95
latency of all requests exceeded ``HYMT_P95_MS``; 0 otherwise.

Environment (read once, at test start):
    HYMT_TOKEN           inference key; set but empty sends no Authorization header
    HYMT_KEY_FILE        TorchServe key file read when HYMT_TOKEN is unset (run/key_file.json)
    HYMT_MODEL           model name (hunyuan-mt)
    HYMT_MAX_NEW_TOKENS  optional max_new_tokens sent with every request
    HYMT_P95_MS          p95 latency budget in milliseconds (10000)
    HYMT_REJECT_MS       overload tests: a 503 answered within this many ms is an expected
                         rejection (reported as "<name>:rejected"), a slower one a failure
    HYMT_DATA            segments file (data/segments.jsonl beside this file)
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import gevent
from locust import FastHttpUser, between, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import WorkerRunner
from locust.stats import StatsEntry

LONG_CHARS = 300  # segments at least this long go to the "long" task
MAX_TEXTS = 8  # most texts in one multi-text request (server allows 16)
OMIT_SOURCE_RATIO = 0.2  # share of requests that leave source_lang out
DEFAULT_DATA = Path(__file__).with_name("data") / "segments.jsonl"
DEFAULT_P95_MS = 10_000.0

Number = TypeVar("Number", int, float)

logger = logging.getLogger("hymt.loadtest")


class ConfigError(Exception):
    """The load test cannot start: bad environment, data file or key file."""


@dataclass(frozen=True)
class Segment:
    source_lang: str
    target_lang: str
    text: str


@dataclass(frozen=True)
class Settings:
    """Everything the users need, resolved once at test start."""

    path: str
    headers: dict[str, str]
    max_new_tokens: int | None
    p95_ms: float
    reject_ms: float | None  # with HYMT_REJECT_MS set, a fast 503 is an expected rejection
    short: list[Segment]
    long: list[Segment]
    groups: list[list[Segment]]  # short segments of one language pair, two or more each


_settings: Settings | None = None


def load_segments(path: Path) -> list[Segment]:
    """Read one JSON object per line; raise ConfigError naming the line on a bad one."""
    segments = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            segments.append(Segment(row["source_lang"], row["target_lang"], row["text"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{number}: not a segment ({exc!r})") from exc
    if not segments:
        raise ConfigError(f"{path}: no segments")
    return segments


def read_token() -> str:
    """The inference key: HYMT_TOKEN, else the 'inference' key of HYMT_KEY_FILE."""
    token = os.environ.get("HYMT_TOKEN")
    if token is not None:
        return token
    key_file = Path(os.environ.get("HYMT_KEY_FILE", "run/key_file.json"))
    try:
        key = json.loads(key_file.read_text(encoding="utf-8"))["inference"]["key"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"no inference key in {key_file} ({exc!r}); set HYMT_TOKEN") from exc
    return str(key)


def env_positive(name: str, parse: Callable[[str], Number]) -> Number | None:
    """A positive int or float from the environment; None when unset or empty."""
    raw = os.environ.get(name, "")
    if not raw:
        return None
    problem = f"{name} must be a positive {parse.__name__}, got {raw!r}"
    try:
        value = parse(raw)
    except ValueError:
        raise ConfigError(problem) from None
    if value <= 0:
        raise ConfigError(problem)
    return value


def load_settings() -> Settings:
    segments = load_segments(Path(os.environ.get("HYMT_DATA", DEFAULT_DATA)))
    short = [s for s in segments if len(s.text) < LONG_CHARS]
    by_pair: defaultdict[tuple[str, str], list[Segment]] = defaultdict(list)
    for s in short:
        by_pair[(s.source_lang, s.target_lang)].append(s)
    groups = [g for g in by_pair.values() if len(g) >= 2]
    if not groups:
        raise ConfigError("no language pair has two short segments for multi-text requests")
    token = read_token()
    return Settings(
        path=f"/predictions/{os.environ.get('HYMT_MODEL', 'hunyuan-mt')}",
        headers={"Authorization": f"Bearer {token}"} if token else {},
        max_new_tokens=env_positive("HYMT_MAX_NEW_TOKENS", int),
        p95_ms=env_positive("HYMT_P95_MS", float) or DEFAULT_P95_MS,
        reject_ms=env_positive("HYMT_REJECT_MS", float),
        short=short,
        long=[s for s in segments if len(s.text) >= LONG_CHARS] or short,
        groups=groups,
    )


def contract_problem(body: Any, n_texts: int, single: bool, target_lang: str) -> str | None:
    """What is wrong with a 200 body for a request of n_texts texts, or None."""
    if not isinstance(body, dict):
        return "body is not a JSON object"
    items = body.get("translations")
    if not isinstance(items, list) or len(items) != n_texts:
        count = len(items) if isinstance(items, list) else "no"
        return f"sent {n_texts} texts, got {count} translations"
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            return f"translations[{i}] has no text"
        if not _positive_int(item.get("output_tokens")):
            return f"translations[{i}].output_tokens is {item.get('output_tokens')!r}"
        if item.get("finish_reason") not in ("stop", "length"):
            return f"translations[{i}].finish_reason is {item.get('finish_reason')!r}"
    usage = body.get("usage")
    if not isinstance(usage, dict) or not all(
        _positive_int(usage.get(k)) for k in ("input_tokens", "output_tokens")
    ):
        return f"usage is {usage!r}"
    if single and not isinstance(body.get("translation"), str):
        return "no 'translation' for a single text"
    if body.get("target_lang") != target_lang:
        return f"target_lang is {body.get('target_lang')!r}, sent {target_lang!r}"
    if not isinstance(body.get("request_id"), str):
        return "no request_id"
    return None


def error_summary(status: int, body: Any) -> str:
    """One line for a non-200 answer: our {error, error_type} or TorchServe's {type, message}."""
    if not isinstance(body, dict):
        return f"HTTP {status} with no JSON error body"
    kind = body.get("error_type") or body.get("type") or "?"
    return f"HTTP {status} {kind}: {body.get('error') or body.get('message')}"


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def verdict(total: StatsEntry, p95_budget_ms: float) -> list[str]:
    """Reasons the run failed; empty when it passed."""
    if total.num_requests == 0:
        return ["no request completed"]
    reasons = []
    if total.num_failures:
        reasons.append(f"{total.num_failures} of {total.num_requests} requests failed")
    p95 = total.get_response_time_percentile(0.95)
    if p95 > p95_budget_ms:
        reasons.append(f"p95 latency {p95} ms is over HYMT_P95_MS={p95_budget_ms:g}")
    return reasons


class TranslationUser(FastHttpUser):
    """A client sending short, long, multi-text and sampled translation requests."""

    wait_time = between(0.5, 2.0)
    network_timeout = 180.0  # long segments on a busy GPU; the server gives up at 120 s
    connection_timeout = 10.0

    @task(6)
    def short_segment(self) -> None:
        s = random.choice(self.settings.short)
        self.translate("translate:short", s.source_lang, s.target_lang, s.text)

    @task(2)
    def long_segment(self) -> None:
        s = random.choice(self.settings.long)
        self.translate("translate:long", s.source_lang, s.target_lang, s.text)

    @task(2)
    def multi_text(self) -> None:
        groups = self.settings.groups
        group = random.choices(groups, weights=[len(g) for g in groups])[0]
        chosen = random.sample(group, random.randint(2, min(MAX_TEXTS, len(group))))
        first = chosen[0]
        texts = [s.text for s in chosen]
        self.translate("translate:multi", first.source_lang, first.target_lang, texts)

    @task(1)
    def sampled_segment(self) -> None:
        s = random.choice(self.settings.short)
        self.translate("translate:sampling", s.source_lang, s.target_lang, s.text, sampling=True)

    @property
    def settings(self) -> Settings:
        if _settings is None:
            raise StopUser  # test_start failed and is quitting the run
        return _settings

    def translate(
        self, name: str, source: str, target: str, text: str | list[str], sampling: bool = False
    ) -> None:
        settings = self.settings
        payload: dict[str, Any] = {"text": text, "target_lang": target}
        if random.random() >= OMIT_SOURCE_RATIO:
            payload["source_lang"] = source
        if settings.max_new_tokens is not None:
            payload["max_new_tokens"] = settings.max_new_tokens
        if sampling:
            payload["sampling"] = True
        with self.rest(
            "POST", settings.path, json=payload, headers=settings.headers, name=name
        ) as resp:
            if resp.status_code == 0 or (resp.js is None and resp.text):
                return  # rest() already recorded the connection error or the unparsable body
            if resp.status_code == 503 and settings.reject_ms is not None:
                self.rejected(resp, name, settings.reject_ms)
                return
            single = isinstance(text, str)
            problem: str | None
            if resp.status_code != 200:
                problem = error_summary(resp.status_code, resp.js)
            else:
                problem = contract_problem(resp.js, 1 if single else len(text), single, target)
            if problem:
                resp.failure(problem)  # type: ignore[no-untyped-call]  # locust is untyped here

    @staticmethod
    def rejected(resp: Any, name: str, budget_ms: float) -> None:
        """Overload tests: a full queue must answer 503 at once, not after a wait."""
        resp.request_meta["name"] = f"{name}:rejected"
        took = resp.request_meta["response_time"]
        if took > budget_ms:
            resp.failure(f"503 after {took:.0f} ms, over HYMT_REJECT_MS={budget_ms:g}")
        else:
            resp.success()


@events.test_start.add_listener  # type: ignore[untyped-decorator]
def on_test_start(environment: Environment, **_: Any) -> None:
    global _settings
    try:
        _settings = load_settings()
    except (ConfigError, OSError) as exc:
        logger.error("cannot start the load test: %s", exc)
        environment.process_exit_code = 1
        if environment.runner is not None:
            # runner.start() is firing this event: quit once it has returned, not from inside
            gevent.spawn(environment.runner.quit)
        return
    logger.info(
        "%d short, %d long segments, %d language pairs for multi-text requests; target %s",
        len(_settings.short),
        len(_settings.long),
        len(_settings.groups),
        _settings.path,
    )


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def on_quitting(environment: Environment, **_: Any) -> None:
    if _settings is None or isinstance(environment.runner, WorkerRunner):
        return  # a start-up error already set the exit code; workers hold partial stats
    reasons = verdict(environment.stats.total, _settings.p95_ms)
    for reason in reasons:
        logger.error("load test failed: %s", reason)
    if reasons:
        environment.process_exit_code = 1  # otherwise locust's own rule: 1 on any error
