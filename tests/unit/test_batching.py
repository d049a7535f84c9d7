from __future__ import annotations

import pytest

from hymt_serve.request.batching import chunks, merge, split


def test_merge_and_split_round_trip_with_failed_requests() -> None:
    groups = [["a1", "a2"], None, ["c1"], [], ["e1", "e2", "e3"]]
    rows, owners = merge(groups)
    assert rows == ["a1", "a2", "c1", "e1", "e2", "e3"]
    assert owners == [0, 0, 2, 4, 4, 4]
    results = [row.upper() for row in rows]
    assert split(results, owners, len(groups)) == [["A1", "A2"], [], ["C1"], [], ["E1", "E2", "E3"]]


def test_split_rejects_a_wrong_number_of_results() -> None:
    with pytest.raises(ValueError, match="2 results for 3 rows"):
        split(["x", "y"], [0, 0, 1], 2)


def test_chunks() -> None:
    assert [list(c) for c in chunks([1, 2, 3, 4, 5], 2)] == [[1, 2], [3, 4], [5]]
    assert list(chunks([], 3)) == []
    with pytest.raises(ValueError):
        list(chunks([1], 0))
