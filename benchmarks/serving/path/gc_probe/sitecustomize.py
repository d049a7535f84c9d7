"""A measuring probe, not part of the server: put this folder first on PYTHONPATH and every
Python process started under it (TorchServe's workers, the engine process) times its garbage
collections (``gc.callbacks``) and appends, every 3 s, one JSON line to
``$GC_PROBE_OUT/<pid>.jsonl``: collections and seconds per generation, and the frozen
objects, and the longest single collection since the line before. ``gc_summary.py`` reads
them. Python imports ``sitecustomize`` at start-up by itself."""

import gc
import json
import os
import sys
import threading
import time

_OUT = os.environ.get("GC_PROBE_OUT", "/tmp/gc-probe")
_seconds = [0.0, 0.0, 0.0]
_counts = [0, 0, 0]
_longest = [0.0]
_started = [0.0]


def _clock(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    took = time.perf_counter() - _started[0]
    _seconds[info["generation"]] += took
    _counts[info["generation"]] += 1
    _longest[0] = max(_longest[0], took)


def _record() -> None:
    os.makedirs(_OUT, exist_ok=True)
    path = os.path.join(_OUT, f"{os.getpid()}.jsonl")
    while True:
        time.sleep(3)
        line = {
            "t": round(time.time(), 1),
            "argv": " ".join(sys.argv)[-80:],
            "collections": list(_counts),
            "seconds": [round(s, 4) for s in _seconds],
            "longest_s": round(_longest[0], 4),  # since the last line
            "frozen": gc.get_freeze_count(),
        }
        _longest[0] = 0.0
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


gc.callbacks.append(_clock)
threading.Thread(target=_record, name="gc-probe", daemon=True).start()
