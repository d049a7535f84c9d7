"""hymt scale's checks: TorchServe 0.12.0 itself takes -1, 0 and 100000 workers silently.
hymt health's line on the front-end plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from hymt_serve.ops import operate
from hymt_serve.ops.launcher import Server
from hymt_serve.ops.operate import ScaleRefused, check_scale, guard_report


@pytest.mark.parametrize(
    ("workers", "max_workers", "ceiling", "says"),
    [
        (-1, -1, 4, "at least 1"),
        (0, 0, 4, "at least 1"),
        (2, 1, 4, "must be at least workers"),
        (100_000, 100_000, 4, "at most 4"),
        (1, 3, 2, "at most 2"),
    ],
)
def test_bad_counts_are_refused_naming_the_bound(
    workers: int, max_workers: int, ceiling: int, says: str
) -> None:
    with pytest.raises(ScaleRefused, match=says):
        check_scale(workers, max_workers, ceiling)


def test_counts_within_the_ceiling_pass() -> None:
    check_scale(1, 1, 1)
    check_scale(2, 4, 4)


@pytest.mark.parametrize(
    ("workers", "settings", "ceiling"),
    [
        ([{"gpu": False}], {}, 3),  # on CPUs: --max-cpu-workers
        ([{"gpu": True}], {"share_engine": False}, 2),  # one worker per GPU
        ([{"gpu": True}], {}, 2),  # settings unknown: one per GPU
        ([{"gpu": True}, {"gpu": True}], {"share_engine": True}, 6),  # 3 per GPU
    ],
)
def test_the_worker_ceiling_follows_the_gpus_and_share_engine(
    monkeypatch: pytest.MonkeyPatch,
    workers: list[dict[str, bool]],
    settings: dict[str, bool],
    ceiling: int,
) -> None:
    """hymt scale's ceiling: a GPU takes one worker holding a model copy, or with
    share_engine up to --max-cpu-workers feeding its engine process."""
    import argparse

    import torch

    from hymt_serve.cli import server as server_cli

    monkeypatch.setattr(server_cli, "model_workers", lambda server, name: workers)
    monkeypatch.setattr(
        server_cli, "handler_description", lambda server, name: {"settings": settings}
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    args = argparse.Namespace(model="hunyuan-mt", max_cpu_workers=3)
    assert server_cli._worker_ceiling(object(), args) == ceiling


class _Reply:
    def __init__(self, status: int, body: Any) -> None:
        self.status_code, self._body = status, body

    def json(self) -> Any:
        if isinstance(self._body, Exception):
            raise self._body
        return self._body


COUNTS = {"guarded": 2, "unguarded": 0, "scan_errors": 0, "last_error": "", "in_backend": 3,
          "forgotten": 41, "late_replies": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (
            _Reply(200, COUNTS),
            "front-end guard: active (2 async workers guarded, 0 unguarded, 3 requests in",
        ),
        (_Reply(200, {**COUNTS, "guarded": 0}), "front-end guard: loaded, no async worker"),
        (_Reply(200, {**COUNTS, "unguarded": 1}), "front-end guard: partly active"),
        (_Reply(200, {**COUNTS, "scan_errors": 1, "last_error": "x"}), "last error: x"),
        (_Reply(404, ValueError("not JSON")), "front-end guard: not loaded (HTTP 404)"),
        (requests.ConnectionError("refused"), "unknown (cannot ask: ConnectionError)"),
    ],
)
def test_health_says_whether_the_front_end_guard_is_active(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reply: Any, says: str
) -> None:
    def get(url: str, **_: Any) -> Any:
        assert url.endswith("/hymt-frontend-guard")
        if isinstance(reply, Exception):
            raise reply
        return reply

    monkeypatch.setattr(operate.requests, "get", get)
    monkeypatch.setattr(Server, "management_url", lambda self: "http://127.0.0.1:1")
    assert says in guard_report(Server(tmp_path))
