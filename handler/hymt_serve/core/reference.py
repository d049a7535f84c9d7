"""The ``handler:`` key reference of docs/configuration.md, written from the settings' own
definitions (:mod:`hymt_serve.core.config`).

``python -m hymt_serve.core.reference`` (from the repository's root) rewrites the block between
the markers of docs/configuration.md; ``--check`` exits 1 when the file differs from what it
would write.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING
from pathlib import Path

from hymt_serve.core.config import CONCERNS, specs

BEGIN = "<!-- BEGIN GENERATED: python -m hymt_serve.core.reference -->"
END = "<!-- END GENERATED -->"
COMMAND = "python -m hymt_serve.core.reference"
DOC = Path("docs/configuration.md")  # from the repository's root
TITLES = {
    "loading": "Loading and precision",
    "scheduler": "Scheduler",
    "limits": "Request limits",
    "serving": "Serving",
    "checks": "Output checks",
    "memory": "Translation memory",
    "sampling": "Sampling defaults",
}


def reference() -> str:
    """The generated block: one table per concern (key, type, default, accepted values, doc)."""
    parts = [
        BEGIN,
        "",
        "| key | type | default | accepted | |",
        "| --- | --- | --- | --- | --- |",
        "| `model_path` | path | (required) | a model folder | A Hugging Face model folder; "
        "`$HYMT_MODEL_PATH` overrides it; a relative path is read inside the archive. |",
    ]
    for name, title in TITLES.items():
        config = CONCERNS[name]
        parts += ["", f"#### {title}", "", " ".join((config.__doc__ or "").split()), ""]
        parts += ["| key | type | default | accepted | |", "| --- | --- | --- | --- | --- |"]
        for field_, spec in specs(config):
            default = field_.default if field_.default is not MISSING else None
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            parts.append(
                f"| `{field_.name}` | {spec.kind} | `{shown}` | {spec.bounds()} | {spec.doc} |"
            )
    return "\n".join([*parts, "", END])


def render(document: str) -> str:
    """``document`` with the block between its markers replaced by :func:`reference`."""
    head, found, rest = document.partition(BEGIN)
    _, ended, tail = rest.partition(END)
    if not (found and ended):
        raise ValueError(f"no {BEGIN!r} ... {END!r} block to replace")
    return head + reference() + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    parser.add_argument("--doc", type=Path, default=DOC, help=f"the file (default {DOC})")
    args = parser.parse_args(argv)
    current = args.doc.read_text(encoding="utf-8")
    fresh = render(current)
    if args.check:
        if fresh != current:
            print(f"{args.doc} is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    args.doc.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
