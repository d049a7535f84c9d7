"""Can a tree's benchmark scripts import what they name from hymt_serve? Seconds, not minutes.

    PYTHONPATH=TREE/handler python benchmarks/compare/preflight.py TREE STAGE...

For each stage's script (decode: benchmarks/decode/bench_decode.py, engine:
benchmarks/serving/bench_engine.py, serving: loadtest/serving/run_bench.py) every
``from hymt_serve... import name`` in it (at any depth: run_bench imports inside functions) is
imported and each name looked up, without running the script. Prints one line per stage, "ok"
or what is missing; exits 1 if any stage fails. run_compare.sh skips such a stage for both sides
instead of spending GPU time on a run that cannot start.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

SCRIPTS = {
    "decode": "benchmarks/decode/bench_decode.py",
    "engine": "benchmarks/serving/bench_engine.py",
    "serving": "loadtest/serving/run_bench.py",
}


def wanted(script: Path) -> list[tuple[str, str | None]]:
    """(module, name) for each hymt_serve import in ``script``; name None for ``import m``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hymt_serve"):
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("hymt_serve")]
    return found


def check(tree: Path, stage: str) -> list[str]:
    script = tree / SCRIPTS[stage]
    if not script.is_file():
        return [f"no {SCRIPTS[stage]}"]
    missing = []
    for module, name in wanted(script):
        try:
            imported = importlib.import_module(module)
        except Exception as exc:  # any import failure is what we report
            missing.append(f"import {module}: {type(exc).__name__}: {exc}")
            continue
        if name is not None and not hasattr(imported, name):
            try:  # a submodule named in "from package import submodule"
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name} does not exist")
    return sorted(set(missing))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any(stage not in SCRIPTS for stage in argv[1:]):
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    tree = Path(argv[0]).resolve()
    failed = False
    for stage in argv[1:]:
        problems = check(tree, stage)
        failed = failed or bool(problems)
        print(f"{stage}: " + ("ok" if not problems else "; ".join(problems)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
