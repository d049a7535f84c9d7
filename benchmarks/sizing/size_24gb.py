"""Sizing on paper for 24 GB cards (A10, L4): per card, model and weight form, the bytes the
fast engine keeps, the KV-cache slots its memory plan gives at 1,536 positions, the roofline
decode step at that batch and the requests/s of the sentence mix to expect, calibrated by what
the H100 measured.

A program, not a test, and not a measurement: nothing here ran on an A10 or an L4. The model
(:mod:`card_roofline`): a decode step reads the weights and the live KV cache once at the
datasheet's bandwidth, or computes every token's products (the rows' new tokens and the prompt
tokens that ride along) at its tensor rate; each request takes its output's steps. Calibration,
per served form (bf16, FP8 + head) from two H100 points of the mix through TorchServe: at 64
users the roofline is memory bound, and measured requests/s over those the decode benchmark's
measured step at that batch implies gives the memory share; at 256 users it is compute bound,
and measured over roofline requests/s gives the compute share. A step on another card takes
max(memory roofline x measured step ratio at its batch / memory share, compute roofline /
compute share): both H100 points come back exactly, and the card is assumed to reach the same
fraction of its datasheet as the H100 did. The weight-only forms, never served on the mix, take
bf16's shares with their own measured step ratios. Reads the serving results in this repository
(benchmarks/serving/results.json, benchmarks/serving/engine/*/engine.json).

    python benchmarks/sizing/size_24gb.py --out benchmarks/sizing
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # card_roofline.py beside this file

from card_roofline import (  # (imported after the path above)
    A10,
    FORMS,
    GPU_PROFILE,
    H100,
    HUNYUAN_1_8B,
    HUNYUAN_7B,
    L4,
    Card,
    MemoryPlan,
    Mix,
    Shape,
    cache_bytes,
    free_before_cache,
    interpolate,
    kv_slots,
    roofline_requests,
    roofline_step,
    runs_on,
    weight_bytes,
)

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "benchmarks/serving/engine/{}/engine.json"
SERVING = REPO / "benchmarks/serving/results.json"

# Decode step measured over its roofline (weights + live KV at the measured copy bandwidth) on
# one H100, per batch: bf16 and fp8 + head from benchmarks/decode/results.md (batch 1, 128) and
# ../shared/GPU.md (batch 64), int4 + head from GPU.md, all 2026-12-07; int8 + head at batch 1
# from the H100 run of 2026-12-06 (3.62 ms, roofline 2.48 ms) and at 128 from the H200 run of
# 2026-12-04 (benchmarks/decode/results.md then: 4.04 x roofline). The forms without +head take
# their +head form's ratios (not measured apart on an H100).
STEP_RATIOS = {
    "bf16": {1: 5.775 / 4.965, 64: 6.89 / 5.24, 128: 7.735 / 5.538},
    "fp8+head": {1: 3.792 / 2.485, 64: 4.48 / 2.76, 128: 5.508 / 3.057},
    "int8+head": {1: 3.6235 / 2.48, 128: 4.04},
    "int4+head": {1: 2.60 / 1.40, 64: 7.97 / 1.69, 128: 13.11 / 1.97},
}
MEASURED_SERVING = {"bf16": ("bf16", "continuous"), "fp8+head": ("fp8-head", "continuous-fp8+head")}
# The H100 points where the roofline is memory bound and compute bound.
MEMORY_USERS, COMPUTE_USERS = 64, 256


def step_ratio(form: str, batch: float) -> float:
    """The H100's measured decode step over its memory roofline for ``form`` at ``batch``."""
    base = form if form in STEP_RATIOS else f"{form.split('+')[0]}+head"
    return interpolate(STEP_RATIOS[base], batch)


@dataclass(frozen=True)
class Point:
    """One H100 measurement of the mix: the rows the engine ran a step, requests/s through
    TorchServe (the GPU profile) and from the engine alone."""

    users: int
    rows: float
    measured: float
    engine_alone: float


@dataclass(frozen=True)
class Calibration:
    """What turns the roofline into requests/s, from two H100 points of ``form``: at
    MEMORY_USERS the roofline step is memory bound, and ``memory_share`` is measured
    requests/s over those the decode benchmark's measured step at that batch implies (what
    prefill chunks, host work and admission cost beyond the decode step, and the bandwidth
    reached against the datasheet's); at COMPUTE_USERS it is compute bound, and
    ``compute_share`` is measured requests/s over the compute roofline's. A step then takes
    ``max(memory roofline x step ratio / memory_share, compute roofline / compute_share)``,
    which gives back both measurements."""

    form: str
    memory: Point
    compute: Point
    memory_share: float
    compute_share: float


def calibrate(form: str, memory: Point, compute: Point, mix: Mix) -> Calibration:
    step = roofline_step(H100, HUNYUAN_7B, form, memory.rows, mix)
    implied = memory.rows / (mix.output * step.memory_s * step_ratio(form, memory.rows))
    at_compute = roofline_step(H100, HUNYUAN_7B, form, compute.rows, mix)
    roofline = compute.rows / (mix.output * at_compute.compute_s)
    return Calibration(
        form, memory, compute, memory.measured / implied, compute.measured / roofline
    )


def load_calibrations(mix: Mix) -> dict[str, Calibration]:
    """The H100's calibration per served form from the serving result files."""
    serving = json.loads(SERVING.read_text())["rows"]
    found = {}
    for form, (folder, mode) in MEASURED_SERVING.items():
        engine = json.loads(Path(str(ENGINE).format(folder)).read_text())["rows"]
        points = []
        for users in (MEMORY_USERS, COMPUTE_USERS):
            alone = next(r for r in engine if r["users"] == users)
            through = next(r for r in serving if r["mode"] == mode and r["users"] == users)
            points.append(
                Point(
                    users,
                    alone["rows_per_step"],
                    through["requests_per_s"],
                    alone["requests_per_s"],
                )
            )
        found[form] = calibrate(form, points[0], points[1], mix)
    return found


def load_mix() -> Mix:
    """The sentence mix's mean prompt and output tokens, as the engine alone counted them."""
    row = json.loads(Path(str(ENGINE).format("bf16")).read_text())["rows"][0]
    return Mix(row["prompt_tokens_per_s"] / row["requests_per_s"], row["output_tokens_per_request"])


def expected_requests(
    card: Card,
    shape: Shape,
    form: str,
    batch: float,
    mix: Mix,
    calibrations: dict[str, Calibration],
) -> tuple[float, str]:
    """Requests/s of the mix at ``batch`` rows, calibrated, and which bound sets the step. The
    FP8 forms take FP8 + head's calibration, the others bf16's (the weight-only forms were
    never served on the mix: their own measured step ratios, bf16's shares)."""
    own = calibrations["fp8+head" if form.startswith("fp8") else "bf16"]
    step = roofline_step(card, shape, form, batch, mix)
    memory = step.memory_s * step_ratio(form, batch) / own.memory_share
    compute = step.compute_s / own.compute_share
    seconds = max(memory, compute)
    return batch / (mix.output * seconds), "memory" if memory >= compute else "compute"


def size(
    card: Card,
    shape: Shape,
    form: str,
    mix: Mix,
    calibrations: dict[str, Calibration],
    plan: MemoryPlan = GPU_PROFILE,
) -> dict[str, Any]:
    """One row of the table: ``card`` x ``shape`` x ``form`` under ``plan``."""
    held = weight_bytes(shape, form)
    at_load = weight_bytes(shape, "bf16")  # every form loads as bf16 and is quantized after
    refused = runs_on(card, form)
    today = kv_slots(card, shape, at_load, plan) if refused is None else 0
    after = kv_slots(card, shape, held, plan) if refused is None else 0
    row: dict[str, Any] = {
        "card": card.name,
        "model": shape.name,
        "form": form,
        "prefix_entries": plan.prefix_entries,
        "runs": refused or "yes",
        "weights_gb": held / 1e9,
        "kv_per_token_kib": shape.kv_bytes_per_token() / 1024,
        "slots_today": today,
        "slots_sized_after_quantizing": after,
    }
    for key, rows in (("today", today), ("after", after)):
        if rows < 1:
            row[key] = None
            continue
        step = roofline_step(card, shape, form, rows, mix)
        roofline = roofline_requests(card, shape, form, rows, mix)
        expected, bound = expected_requests(card, shape, form, rows, mix, calibrations)
        # free when the cache is sized, less the cache; today the bf16 copies that quantizing
        # releases come back after it
        left = free_before_cache(card, at_load if key == "today" else held)
        left -= cache_bytes(shape, rows, plan) - (at_load - held if key == "today" else 0)
        row[key] = {
            "batch": rows,
            "step_ms": 1e3 * step.seconds,
            "roofline_bound": "memory" if step.memory_s >= step.compute_s else "compute",
            "calibrated_bound": bound,
            "roofline_requests_per_s": roofline,
            "ratio": expected / roofline,
            "requests_per_s": expected,
            "seconds_in_engine": rows / expected,
            "left_after_cache_gb": left / 1e9,
        }
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = (
        "| card | model | precision | runs | weights GB | KV slots today / sized after "
        "quantizing | batch | roofline step ms | roofline req/s | calibrated / roofline "
        "| expected req/s | s in engine | left GB | expected req/s, sized after quantizing |"
    )
    lines = [head, "|" + " --- |" * 3 + " :--- |" + " ---: |" * 10]
    for row in rows:
        now, after = row["today"], row["after"]
        cells = [row["card"].removeprefix("NVIDIA "), row["model"], row["form"]]
        cells.append("yes" if row["runs"] == "yes" else "no (FP8 needs 8.9+)")
        cells.append(f"{row['weights_gb']:.2f}")
        cells.append(f"{row['slots_today']} / {row['slots_sized_after_quantizing']}")
        if now is None:
            lines.append("| " + " | ".join(cells + ["-"] * 8) + " |")
            continue
        cells += [
            str(now["batch"]),
            f"{now['step_ms']:.1f}",
            f"{now['roofline_requests_per_s']:.0f}",
        ]
        cells += [f"{now['ratio']:.2f}", f"**{now['requests_per_s']:.0f}**"]
        cells += [f"{now['seconds_in_engine']:.2f}", f"{now['left_after_cache_gb']:.1f}"]
        cells.append(f"{after['requests_per_s']:.0f} ({after['batch']} rows)")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def slots_table(rows: list[dict[str, Any]]) -> list[str]:
    """The forms that run, under another memory plan: slots and requests/s only."""
    lines = [
        "| card | model | precision | KV slots today / sized after quantizing | expected req/s "
        "today / sized after quantizing |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for row in rows:
        if row["today"] is None:
            continue
        now, after = row["today"]["requests_per_s"], row["after"]["requests_per_s"]
        lines.append(
            f"| {row['card'].removeprefix('NVIDIA ')} | {row['model']} | {row['form']} | "
            f"{row['slots_today']} / {row['slots_sized_after_quantizing']} | "
            f"{now:.0f} / {after:.0f} |"
        )
    return lines


def report(
    mix: Mix,
    calibrations: dict[str, Calibration],
    rows: list[dict[str, Any]],
    fewer_prefixes: list[dict[str, Any]],
) -> str:
    plan = GPU_PROFILE
    parts = [
        "# Sizing on paper: 24 GB cards (A10, L4)",
        "",
        "`python benchmarks/sizing/size_24gb.py --out benchmarks/sizing` (no GPU: arithmetic "
        "over datasheet figures, calibrated by the H100's measurements; nothing here ran on an "
        'A10 or an L4). Sources and the recommendation: docs/sizing.md, "24 GB cards".',
        "",
        f"The mix: {mix.prompt:.1f} prompt and {mix.output:.1f} output tokens a request (the "
        "engine alone counted them on the H100). Memory plan: the GPU profile's "
        f"{plan.positions} positions a slot, {plan.prefix_entries} kept prefixes of "
        f"{plan.prefix_tokens} tokens, {plan.wanted} rows wanted, {plan.kv_share:.0%} of the "
        'free memory. "Today": every form loads as bf16 and the slots are sized before it is '
        'quantized; "sized after quantizing": what the slots would be if they were sized '
        "once the quantized weights alone are resident (not what the engine does yet).",
        "",
        "Calibration (one H100, 2026-12-07, the mix through TorchServe; rows a step from the "
        "engine alone at the same users): a step takes max(memory roofline x the decode "
        "benchmark's measured step ratio / memory share, compute roofline / compute share).",
        "",
        "| form | users | rows a step | measured req/s | engine alone | bound | share |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for cal in calibrations.values():
        for point, bound, share in (
            (cal.memory, "memory", cal.memory_share),
            (cal.compute, "compute", cal.compute_share),
        ):
            parts.append(
                f"| {cal.form} | {point.users} | {point.rows:.1f} | {point.measured:.1f} | "
                f"{point.engine_alone:.1f} | {bound} | {share:.3f} |"
            )
    parts += ["", *table(rows), ""]
    parts.append(
        '"left GB": free memory after the weights, the KV slots and the kept prefixes, for '
        "CUDA graphs, activations and buffers (the H100 used about 4.4 GB for these and the CUDA "
        'context at 256 rows); "s in engine": rows over requests/s at saturation (Little\'s law).'
    )
    entries = fewer_prefixes[0]["prefix_entries"]
    parts += [
        "",
        f"## With prefix_cache_entries {entries}",
        "",
        f"The GPU profile keeps 64 prompt beginnings of 256 positions: on a 24 GB card their "
        f"reservation costs slots. The mix kept 9 on the H100; with {entries}:",
        "",
        *slots_table(fewer_prefixes),
    ]
    return "\n".join(parts) + "\n"


FEWER_PREFIXES = MemoryPlan(prefix_entries=16)


def run(out: Path) -> list[dict[str, Any]]:
    mix = load_mix()
    calibrations = load_calibrations(mix)
    grid = [
        (card, shape, form)
        for card in (A10, L4)
        for shape in (HUNYUAN_7B, HUNYUAN_1_8B)
        for form in FORMS
    ]
    rows = [size(card, shape, form, mix, calibrations) for card, shape, form in grid]
    fewer = [size(c, s, f, mix, calibrations, FEWER_PREFIXES) for c, s, f in grid]
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "mix": asdict(mix),
        "memory_plan": asdict(GPU_PROFILE),
        "cards": [asdict(card) for card in (A10, L4, H100)],
        "calibration": {k: asdict(c) for k, c in calibrations.items()},
        "step_ratios_h100": {k: {str(b): r for b, r in v.items()} for k, v in STEP_RATIOS.items()},
        "rows": rows,
        "rows_with_fewer_prefixes": fewer,
    }
    (out / "results.json").write_text(json.dumps(document, indent=1) + "\n")
    text = report(mix, calibrations, rows, fewer)
    (out / "results.md").write_text(text)
    print(text)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    run(parser.parse_args().out)


if __name__ == "__main__":
    main()
