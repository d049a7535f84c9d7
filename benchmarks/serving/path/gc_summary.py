"""Garbage collection per process under load, from ``gc_probe``'s lines.

For each process it takes the longest stretch of samples in which generation-0 collections
kept happening (the load window), and prints the collections and seconds per generation in
it, the longest single collection in it, and the frozen objects. With ``--requests N`` (the
run's completed requests) it adds milliseconds of collection per request.

    python benchmarks/serving/path/gc_summary.py DIR [--requests N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def busy_window(rows: list[dict]) -> list[dict]:
    """The longest run of samples with new gen-0 collections, with the sample before it."""
    best, start = (0, 0), 0
    for i in range(1, len(rows)):
        if rows[i]["collections"][0] == rows[i - 1]["collections"][0]:
            start = i
        elif i - start > best[1] - best[0]:
            best = (start, i)
    return rows[best[0] : best[1] + 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--requests", type=int, default=0)
    args = parser.parse_args()
    for path in sorted(args.folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        if len(rows) < 2:
            continue
        window = busy_window(rows)
        first, last = window[0], window[-1]
        counts = [b - a for a, b in zip(first["collections"], last["collections"], strict=True)]
        seconds = [b - a for a, b in zip(first["seconds"], last["seconds"], strict=True)]
        summary = {
            "pid": path.stem,
            "process": last["argv"],
            "window_s": round(last["t"] - first["t"], 1),
            "collections": counts,
            "seconds": [round(s, 3) for s in seconds],
            "longest_ms": round(
                1000 * max((row["longest_s"] for row in window[1:]), default=0.0), 1
            ),
            "frozen": last["frozen"],
        }
        if args.requests and sum(counts):
            summary["ms_per_request"] = round(1000 * sum(seconds) / args.requests, 3)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
