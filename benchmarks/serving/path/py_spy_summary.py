"""Where a process's samples went, from ``py-spy record --format raw`` (collapsed stacks): the
functions that ran themselves (self) and those below which the samples fell (inclusive), as
Markdown tables of their shares.

    py-spy record -p WORKER_PID -d 12 -r 200 --format raw -o worker.txt --nonblocking
    python benchmarks/serving/path/py_spy_summary.py worker.txt [--top 25] > profile.md
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path


def frame_name(frame: str) -> str:
    """``function (file:line)`` without the line: one entry per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def summarise(raw: str, top: int) -> str:
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples, frames = int(count), stack.split(";")
        total += samples
        self_time[frame_name(frames[-1])] += samples
        for name in {frame_name(frame) for frame in frames}:
            inclusive[name] += samples
    parts = [f"{total} samples\n"]
    for title, counter in (("self", self_time), ("inclusive", inclusive)):
        parts.append(f"\n| {title} | share |\n| --- | ---: |")
        parts += [f"| `{name}` | {n / total:.1%} |" for name, n in counter.most_common(top)]
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("raw", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summarise(args.raw.read_text(), args.top), end="")


if __name__ == "__main__":
    main()
