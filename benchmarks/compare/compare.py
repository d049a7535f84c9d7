"""Side-by-side speed of two trees from run_compare.sh's raw outputs: compare.md, compare.json.

    python benchmarks/compare/compare.py OUT_DIR [--tolerance 0.03] [--strict]

Reads ``OUT_DIR/{base,new}/{decode,engine,serving}/r*/`` (``results.json`` of
bench_decode.py, ``engine.json`` of bench_engine.py, ``results.json`` of run_bench.py), takes
the median over repeats of each metric, and writes per metric base, new, new/base and whether
the change is within the tolerance. Gated metrics (the verdict): decode ms/step of the fast
engine at each batch, engine-alone and TorchServe requests/s at each user count; the others are
shown for context. Standard library only (runs on a bare machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIDES = ("base", "new")


@dataclass(frozen=True)
class Spec:
    stage: str
    file: str
    metric: str
    unit: str
    better: str  # "lower" or "higher"
    gated: bool
    values: Callable[[dict[str, Any]], dict[str, float]]  # key (batch/users) -> value


def _fast_rows(report: dict[str, Any], column: str) -> dict[str, float]:
    return {
        f"batch {row['batch_size']}": float(row[column])
        for row in report.get("rows", [])
        if row.get("engine") == "fast" and row.get(column) not in (None, "")
    }


def _engine_rows(report: dict[str, Any], column: str) -> dict[str, float]:
    return {
        f"{row['users']} users": float(row[column])
        for row in report.get("rows", [])
        if row.get(column) is not None
    }


def _serving_rows(report: dict[str, Any], column: str) -> dict[str, float]:
    return {
        f"{row['users']} users": float(row[column])
        for row in report.get("rows", [])
        if row.get("system") == "torchserve"
        and row.get("mode") == "continuous"
        and row.get("gpus") == 1
        and row.get(column) is not None
    }


def _scalar(value: Any, key: str) -> dict[str, float]:
    return {key: float(value)} if isinstance(value, int | float) else {}


SPECS = (
    Spec("decode", "results.json", "ms/step", "ms", "lower", True,
         lambda r: _fast_rows(r, "ms_per_step")),
    Spec("decode", "results.json", "graph ms/step", "ms", "lower", False,
         lambda r: _fast_rows(r, "graph_ms_per_step")),
    Spec("decode", "results.json", "ready (compile, capture)", "s", "lower", False,
         lambda r: _scalar(r.get("ready_s"), "engine")),
    Spec("engine", "engine.json", "requests/s", "req/s", "higher", True,
         lambda r: _engine_rows(r, "requests_per_s")),
    Spec("engine", "engine.json", "output tokens/s", "tok/s", "higher", False,
         lambda r: _engine_rows(r, "output_tokens_per_s")),
    Spec("engine", "engine.json", "p50 latency", "ms", "lower", False,
         lambda r: _engine_rows(r, "p50_ms")),
    Spec("engine", "engine.json", "decode steps/s", "steps/s", "higher", False,
         lambda r: _engine_rows(r, "steps_per_s")),
    Spec("serving", "results.json", "requests/s", "req/s", "higher", True,
         lambda r: _serving_rows(r, "requests_per_s")),
    Spec("serving", "results.json", "p50 latency", "ms", "lower", False,
         lambda r: _serving_rows(r, "p50_ms")),
    Spec("serving", "results.json", "GPU busy", "%", "higher", False,
         lambda r: _serving_rows(r, "gpu_util_pct")),
    Spec("serving", "results.json", "front end CPU per request", "ms", "lower", False,
         lambda r: _serving_rows(r, "frontend_cpu_ms")),
    Spec("serving", "results.json", "worker CPU per request", "ms", "lower", False,
         lambda r: _serving_rows(r, "worker_cpu_ms")),
    Spec("serving", "results.json", "engine process CPU per request", "ms", "lower", False,
         lambda r: _serving_rows(r, "engine_cpu_ms")),
    Spec("serving", "results.json", "cold start", "s", "lower", False,
         lambda r: _scalar(r.get("cold_start_s", {}).get("torchserve"), "torchserve")),
)  # fmt: skip
# Errors must be zero on both sides whatever the speed.
ERROR_SPECS = (
    ("engine", "engine.json", lambda r: _engine_rows(r, "errors")),
    ("serving", "results.json", lambda r: _serving_rows(r, "errors")),
)


@dataclass
class Loaded:
    """Per side and stage: the parsed reports by repeat folder, and the problems seen."""

    reports: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _round_dirs(stage_dir: Path) -> Iterator[Path]:
    if stage_dir.is_dir():
        yield from sorted(p for p in stage_dir.iterdir() if p.is_dir() and p.name.startswith("r"))


def load(out: Path) -> Loaded:
    loaded = Loaded()
    files = {spec.stage: spec.file for spec in SPECS}
    for side in SIDES:
        for stage, name in files.items():
            found = loaded.reports.setdefault((side, stage), [])
            preflight = out / side / stage / "preflight.txt"
            if preflight.is_file():
                loaded.problems.append(
                    f"{side} {stage}: not run, its script cannot import what it needs: "
                    + preflight.read_text().strip()
                )
            for folder in _round_dirs(out / side / stage):
                path = folder / name
                rc = (folder / "rc").read_text().strip() if (folder / "rc").is_file() else None
                if not path.is_file():
                    loaded.problems.append(
                        f"{side} {stage} {folder.name}: no {name} (exit code {rc or '?'}; "
                        f"see {folder.relative_to(out)}/log.txt)"
                    )
                    continue
                try:
                    found.append((folder.name, json.loads(path.read_text())))
                except (OSError, ValueError) as exc:
                    loaded.problems.append(f"{side} {stage} {folder.name}: {name}: {exc}")
                    continue
                if rc not in (None, "0"):
                    loaded.problems.append(f"{side} {stage} {folder.name}: exit code {rc}")
    return loaded


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _spread_pct(values: list[float]) -> float | None:
    """(max - min) / median in percent: how much the repeats of one side disagree."""
    if len(values) < 2 or not statistics.median(values):
        return None
    return round(100 * (max(values) - min(values)) / statistics.median(values), 2)


def _sort_key(key: str) -> tuple[int, str]:
    number = key.split()[-1] if key.startswith("batch") else key.split()[0]
    return (int(number), key) if number.isdigit() else (1 << 30, key)


def compare(loaded: Loaded, tolerance: float) -> list[dict[str, Any]]:
    metrics = []
    for spec in SPECS:
        per_side: dict[str, dict[str, list[float]]] = {}
        for side in SIDES:
            collected: dict[str, list[float]] = {}
            for _, report in loaded.reports.get((side, spec.stage), []):
                for key, value in spec.values(report).items():
                    collected.setdefault(key, []).append(value)
            per_side[side] = collected
        keys = sorted(set(per_side["base"]) | set(per_side["new"]), key=_sort_key)
        for key in keys:
            base_values = per_side["base"].get(key, [])
            new_values = per_side["new"].get(key, [])
            base = _median(base_values) if base_values else None
            new = _median(new_values) if new_values else None
            ratio = new / base if base and new is not None else None
            within = None if ratio is None else abs(ratio - 1) <= tolerance + 1e-12
            slower = None
            if ratio is not None and ratio != 1:
                slower = ratio > 1 if spec.better == "lower" else ratio < 1
            metrics.append(
                {
                    "stage": spec.stage,
                    "metric": spec.metric,
                    "key": key,
                    "unit": spec.unit,
                    "better": spec.better,
                    "gated": spec.gated,
                    "base": base,
                    "new": new,
                    "ratio": None if ratio is None else round(ratio, 4),
                    "change_pct": None if ratio is None else round(100 * (ratio - 1), 2),
                    "within": within,
                    "worse": slower,
                    "base_values": base_values,
                    "new_values": new_values,
                    "base_spread_pct": _spread_pct(base_values),
                    "new_spread_pct": _spread_pct(new_values),
                }
            )
    return metrics


def error_counts(loaded: Loaded) -> list[str]:
    seen = []
    for stage, _, values in ERROR_SPECS:
        for side in SIDES:
            for folder, report in loaded.reports.get((side, stage), []):
                for key, count in values(report).items():
                    if count:
                        seen.append(f"{side} {stage} {folder} {key}: {int(count)} errors")
    return seen


def verdict(
    metrics: list[dict[str, Any]], errors: list[str], problems: list[str], tolerance: float
) -> tuple[bool, str]:
    gated = [m for m in metrics if m["gated"]]
    pct = f"{100 * tolerance:g}%"
    unpaired = [m for m in gated if m["within"] is None]
    outside = [m for m in gated if m["within"] is False]
    if not gated:
        return False, "NO VERDICT: no gated metric was measured on both sides."
    parts = []
    measured = len(gated) - len(unpaired)
    if outside:
        listed = "; ".join(
            f"{m['stage']} {m['metric']} {m['key']} {m['change_pct']:+.2f}% "
            f"({'worse' if m['worse'] else 'better'})"
            for m in outside
        )
        parts.append(f"NOT within {pct}: {listed}")
    elif unpaired:
        parts.append(f"INCOMPLETE: the {measured} gated metrics measured on both sides are "
                     f"within {pct}, {len(unpaired)} are not measured on both")  # fmt: skip
    else:
        parts.append(f"WITHIN {pct}: all {measured} gated metrics are within {pct} of the base")
    paired = [m for m in gated if m["ratio"] is not None]
    if paired:
        worst = max(paired, key=lambda m: abs(m["ratio"] - 1))
        parts.append(
            f"largest change: {worst['stage']} {worst['metric']} {worst['key']} "
            f"{worst['change_pct']:+.2f}%"
        )
    if unpaired:
        parts.append(
            "measured on one side only: "
            + ", ".join(f"{m['stage']} {m['metric']} {m['key']}" for m in unpaired)
        )
    if errors:
        parts.append(f"{len(errors)} runs had request errors")
    if problems:
        parts.append(f"{len(problems)} runs missing or failed")
    ok = not outside and not unpaired and not errors
    return ok, ". ".join(parts) + "."


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Speed before and after: base vs new",
        "",
        f"**{result['verdict']}**",
        "",
        f"Medians over repeats; ratio = new / base; tolerance {100 * result['tolerance']:g}%. "
        "Gated metrics decide the verdict; spread = (max - min) / median over one side's "
        "repeats (how noisy a metric is on this machine).",
        "",
    ]
    for side in SIDES:
        tree = result["trees"].get(side) or {}
        commit = f", commit {tree['baseline_commit']}" if tree.get("baseline_commit") else ""
        lines.append(
            f"- {side}: `{tree.get('tree', '?')}`{commit}, handler sha256 "
            f"{str(tree.get('handler_sha256', '?'))[:12]} ({tree.get('handler_py_files', '?')} "
            "files)"
        )
    lines += [
        "",
        "| stage | metric | at | gated | base | new | new/base | change | within | n base/new "
        "| spread base/new |",
        "| --- | --- | --- | :---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: |",
    ]
    for m in result["metrics"]:
        within = {None: "-", True: "yes", False: "**no**"}[m["within"]]
        within = within if m["gated"] or m["within"] is None else f"({within})"
        change = "-" if m["change_pct"] is None else f"{m['change_pct']:+.2f}%"
        if m["worse"] is not None and m["change_pct"]:
            change += " worse" if m["worse"] else " better"
        ratio = "-" if m["ratio"] is None else f"{m['ratio']:.4f}"
        spread = "/".join(
            "-" if s is None else f"{s:g}%" for s in (m["base_spread_pct"], m["new_spread_pct"])
        )
        lines.append(
            f"| {m['stage']} | {m['metric']} ({m['unit']}, {m['better']} is better) | {m['key']} "
            f"| {'yes' if m['gated'] else ''} | {_fmt(m['base'])} | {_fmt(m['new'])} "
            f"| {ratio} | {change} | {within} "
            f"| {len(m['base_values'])}/{len(m['new_values'])} | {spread} |"
        )
    if result["errors"]:
        lines += ["", "Request errors:", "", *(f"- {e}" for e in result["errors"])]
    if result["problems"]:
        lines += ["", "Missing or failed runs:", "", *(f"- {p}" for p in result["problems"])]
    same = [result["trees"].get(s, {}).get("handler_sha256") for s in SIDES]
    if same[0] and same[0] == same[1]:
        lines += ["", "Warning: both sides ran identical handler code (same sha256)."]
    return "\n".join(lines) + "\n"


def build(out: Path, tolerance: float) -> dict[str, Any]:
    loaded = load(out)
    metrics = compare(loaded, tolerance)
    errors = error_counts(loaded)
    ok, text = verdict(metrics, errors, loaded.problems, tolerance)
    trees = {}
    for side in SIDES:
        path = out / side / "tree.json"
        try:
            trees[side] = json.loads(path.read_text()) if path.is_file() else None
        except ValueError:
            trees[side] = None
    return {
        "verdict": text,
        "within_tolerance": ok,
        "tolerance": tolerance,
        "trees": trees,
        "runs": {f"{s}/{st}": [f for f, _ in r] for (s, st), r in loaded.reports.items()},
        "metrics": metrics,
        "errors": errors,
        "problems": loaded.problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="run_compare.sh's OUT_DIR")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--strict", action="store_true", help="exit 1 unless within tolerance")
    args = parser.parse_args(argv)
    result = build(args.out, args.tolerance)
    (args.out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "compare.md").write_text(markdown(result))
    print(markdown(result))
    return 1 if args.strict and not result["within_tolerance"] else 0


if __name__ == "__main__":
    sys.exit(main())
