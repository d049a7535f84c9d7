"""hymt scale's checks: TorchServe 0.12.0 itself takes -1, 0 and 100000 workers silently."""

from __future__ import annotations

import pytest

from hymt_serve.ops.operate import ScaleRefused, check_scale


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

    from hymt_serve.ops import launcher, server_cli

    monkeypatch.setattr(launcher, "model_workers", lambda server, name: workers)
    monkeypatch.setattr(
        launcher, "handler_description", lambda server, name: {"settings": settings}
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    args = argparse.Namespace(model="hunyuan-mt", max_cpu_workers=3)
    assert server_cli._worker_ceiling(object(), args) == ceiling
