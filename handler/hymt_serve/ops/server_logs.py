"""What ``hymt start`` gives TorchServe's logging, and what it reads back from the logs: the
front end's log configuration, failed loads, a refused setting, workers dying of an import
error, the lines worth showing when a start fails."""

from __future__ import annotations

import re
from pathlib import Path

# The front end's logging: TorchServe's files, without its per-request lines (the file says).
LOG_CONFIG = Path(__file__).with_name("log4j2.xml")
GIVE_UP_AFTER = 2  # failed loads of one model: a bad setting or path does not heal


def load_failures(log_dir: Path, name: str) -> int:
    """How many times TorchServe logged that loading model ``name`` failed."""
    path = log_dir / "ts_log.log"
    if not path.is_file():
        return 0
    marker = f"Load model failed: {name},"
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return len({line for line in lines if marker in line})  # the log writes each line twice


_REFUSED = re.compile(r"hymt_serve\.core\.errors\.ConfigurationError: (.*)")


def setting_refused(log_dir: Path) -> str | None:
    """The handler's last ConfigurationError in the model log: a setting, or a missing
    package or compiler, that no retry heals. In async mode TorchServe logs no "Load model
    failed" and restarts the worker only minutes later, so this is what ends the wait there."""
    path = log_dir / "model_log.log"
    if not path.is_file():
        return None
    found = _REFUSED.findall(path.read_text(encoding="utf-8", errors="replace"))
    return found[-1].strip() if found else None


# The last line of a worker's traceback on its stderr, and the front end's word that a worker
# process ended (async mode; sync mode logs a failed load, which load_failures counts).
_IMPORT_FAILED = re.compile(r"-stderr MODEL_LOG - ((?:ModuleNotFoundError|ImportError): .*)$")
_WORKER_ENDED = ("Backend worker error", "Backend worker process died")


def import_failed(log_dir: Path) -> str | None:
    """The import error that workers die of, once it has ended workers GIVE_UP_AFTER times
    (each restart dies the same way: a package missing from the workers' Python does not
    heal); None otherwise. A traceback some library prints and survives does not count: the
    front end must also have logged as many workers ending."""
    model_log, ts_log = log_dir / "model_log.log", log_dir / "ts_log.log"
    if not (model_log.is_file() and ts_log.is_file()):
        return None
    failed: dict[str, set[str]] = {}
    for line in model_log.read_text(encoding="utf-8", errors="replace").splitlines():
        if found := _IMPORT_FAILED.search(line):
            failed.setdefault(found.group(1).strip(), set()).add(line)
    if not failed:
        return None
    lines = ts_log.read_text(encoding="utf-8", errors="replace").splitlines()
    ended = len({line for line in lines if any(text in line for text in _WORKER_ENDED)})
    message, seen = max(failed.items(), key=lambda item: len(item[1]))
    return message if min(len(seen), ended) >= GIVE_UP_AFTER else None


def log_excerpt(log_dir: Path, lines: int = 40) -> str:
    """The last error-looking lines of the model and server logs."""
    parts = []
    for name in ("start.log", "model_log.log", "ts_log.log"):
        path = log_dir / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        wanted = [line for line in text if re.search(r"ERROR|Error:|Exception|raise", line)]
        parts.append(f"--- {path} ---\n" + "\n".join((wanted or text)[-lines:]))
    return "\n".join(parts) or f"(no logs in {log_dir})"
