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
