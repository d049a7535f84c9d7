"""Batch merge and split: requests with several texts become several engine rows and back.

TorchServe hands the handler a batch of requests; each request may carry several texts. The
engine sees one flat list of rows. ``merge`` records where each row came from, ``split`` puts
the engine's results back per request, in order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def merge(groups: Sequence[Sequence[T] | None]) -> tuple[list[T], list[int]]:
    """Flatten ``groups`` (None = a request that failed validation and has no rows).

    Returns the rows and, for each row, the index of the group it came from.
    """
    rows: list[T] = []
    owners: list[int] = []
    for index, group in enumerate(groups):
        if group is None:
            continue
        rows.extend(group)
        owners.extend([index] * len(group))
    return rows, owners


def split(results: Sequence[R], owners: Sequence[int], n_groups: int) -> list[list[R]]:
    """Inverse of :func:`merge`: the results of each group, in row order (empty when none)."""
    if len(results) != len(owners):
        raise ValueError(f"engine returned {len(results)} results for {len(owners)} rows")
    grouped: list[list[R]] = [[] for _ in range(n_groups)]
    for result, owner in zip(results, owners, strict=True):
        grouped[owner].append(result)
    return grouped


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of at most ``size`` items."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    for start in range(0, len(items), size):
        yield items[start : start + size]
