"""Ready time per weight form, each in a fresh process with empty compile caches.

A program, not a test. The ready time of a worker is loading the folder plus building the fast
engine (fusing or quantizing the weights, compiling the step functions, capturing the CUDA
graphs). Inside one process, later builds reuse inductor's and Triton's caches, so each form
runs here in its own process with its own empty cache folders (what a new server on a new
machine pays), with the GPU profile's sizes (128 rows of 1,024 + 512 tokens). The 7B-shaped
random-weight folder is written first when ``--checkpoint`` does not exist yet (and its FP8
checkpoint for ``fp8-checkpoint``). Each row also counts the kernels Triton compiled (inductor's,
and ours by name: every specialisation is a compile). ``--serial FORM ...`` runs those forms
once more with none of our weight-only kernels compiled ahead (each at its first launch,
without hymt_serve.engine.kernels.ahead). ``--rounds N`` runs every form N times, each round in
another order (the host's speed moves from run to run): each row's ratio is to bf16's ready time
of its own round, and a second table gives each form's medians. ``--warm-cache`` then runs
each form twice more through the engine's compile cache (hymt_serve.engine.compile_cache) in a
fresh cache root: a cold start that fills it, then a start that reuses it, each in its own
process (what a restarted pod or worker pays with the cache on its volume). Writes
``ready.json`` and ``ready.md`` to ``--out``.

    PYTHONPATH=handler python benchmarks/decode/ready_time.py --out DIR --forms none fp8 int8
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FORMS = (
    "none",
    "fp8",
    "int8",
    "int4",
    "fp8-checkpoint",
    "fp8+head",
    "int8+head",
    "int4+head",
    "fp8-checkpoint+head",
)
ROWS, INPUT_TOKENS, NEW_TOKENS = 128, 1024, 512  # configs/model-config-gpu.yaml
TIMINGS = ("ahead_plan_s", "ahead_wait_s", "warmup_compile_s", "capture_s", "prefill_capture_s")


def folder_for(checkpoint: Path, form: str) -> Path:
    """The folder a form loads: the bf16 one, or the FP8 checkpoint written from it."""
    if form.startswith("fp8-checkpoint"):
        return checkpoint.with_name(checkpoint.name + "-fp8")
    return checkpoint


def prepare(checkpoint: Path, forms: list[str]) -> None:
    """Write the random bf16 folder (and its FP8 checkpoint) where missing."""
    import torch

    from hymt_serve.ops.tiny_model import random_7b_model

    if not checkpoint.is_dir():
        random_7b_model("cuda").save_pretrained(checkpoint)
        torch.cuda.empty_cache()
    fp8 = folder_for(checkpoint, "fp8-checkpoint")
    if any(form.startswith("fp8-checkpoint") for form in forms) and not fp8.is_dir():
        from hymt_serve.ops.quantize import write_fp8_checkpoint

        ids = torch.Generator().manual_seed(0)  # the random folder has no tokenizer
        calibration = [
            tuple(torch.randint(3, 120000, (40,), generator=ids).tolist()) for _ in "12345678"
        ]
        write_fp8_checkpoint(checkpoint, fp8, device="cuda", prompts=calibration)


def measure_one(
    checkpoint: Path, form: str, serial: bool = False, cache_root: Path | None = None
) -> dict[str, Any]:
    """Load and build one form here, as the worker does; the times in seconds. ``serial``:
    no weight-only kernel compiles ahead (each compiles at its first launch). ``cache_root``:
    build through the engine's compile cache there, as the engine does."""
    import torch

    from hymt_serve.engine.kernels import ahead

    if serial:
        ahead.THREADS = 0

    from hymt_serve.core.settings import Settings
    from hymt_serve.engine.checkpoints.loading import load_model
    from hymt_serve.engine.runners.build import build_fast_runner

    base, _, head = form.partition("+")
    start = time.perf_counter()
    settings = {
        "model_path": str(folder_for(checkpoint, form)),
        "quantization": base if base in ("fp8", "int8", "int4") else "none",
        "quantize_lm_head": head == "head",
        "max_input_tokens": INPUT_TOKENS,
        "max_new_tokens": NEW_TOKENS,
    }
    parsed = Settings.from_mapping(settings, environ={})
    loaded = load_model(parsed)
    loaded_at = time.perf_counter()
    opener = None
    if cache_root is not None:  # as the engine opens its compile cache (engine._pick_runner)
        from hymt_serve.engine.compile_cache import engine_inputs, open_cache

        quantization = loaded.plan.quantization.value if loaded.int4 is None else "gptq-int4"
        inputs = engine_inputs(parsed, loaded, quantization)
        opener = functools.partial(open_cache, cache_root, inputs)

    runner = build_fast_runner(
        loaded.model,
        max_batch_size=ROWS,
        max_seq_len=INPUT_TOKENS + NEW_TOKENS,
        quantize=loaded.plan.quantization,
        fp8_scales=loaded.fp8_scales,
        int4=loaded.int4,
        quantize_head=head == "head",
        open_compile_cache=opener,
    )
    torch.cuda.synchronize()
    done = time.perf_counter()
    described = runner.describe()
    return {
        "form": form + (" (serial)" if serial else ""),
        "load_s": round(loaded_at - start, 2),
        "build_s": round(done - loaded_at, 2),
        "ready_s": round(done - start, 2),
        "weight_gb": round(int(described["weight_bytes"]) / 1e9, 3),
        # the build's parts: compiling (with the warm-up), capturing the decode and prefill graphs
        **{key: described[key] for key in TIMINGS if key in described},
        **({"compile_cache": described["compile_cache"]} if cache_root is not None else {}),
    }


def run_fresh(
    checkpoint: Path, form: str, serial: bool = False, cache_root: Path | None = None
) -> dict[str, Any]:
    """``measure_one`` in a new process with empty inductor and Triton caches (with
    ``cache_root``, the engine's compile cache there instead, empty or not)."""
    with tempfile.TemporaryDirectory(prefix="hymt-ready-") as caches:
        environ = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(Path(caches) / "inductor"),
            "TRITON_CACHE_DIR": str(Path(caches) / "triton"),
        }
        command = [sys.executable, __file__, "--one", form, "--checkpoint", str(checkpoint)]
        command += ["--serial-one"] if serial else []
        command += ["--cache-root", str(cache_root)] if cache_root is not None else []
        done = subprocess.run(command, env=environ, capture_output=True, text=True, check=False)
        compiled = triton_compiles(Path(caches) / "triton")
    if done.returncode != 0:
        return {"form": form, "error": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, **compiled}


def triton_compiles(cache: Path) -> dict[str, Any]:
    """How many kernels Triton compiled into ``cache``: inductor's generated ones, and ours by
    name (each specialisation of a kernel is a compile of its own)."""
    names = [path.stem for path in cache.glob("*/*.cubin")]
    ours: dict[str, int] = {}
    for name in names:
        if not name.startswith("triton_"):
            ours[name] = ours.get(name, 0) + 1
    return {"inductor_kernels": len(names) - sum(ours.values()), "our_kernels": ours}


def run_warm_cache(checkpoint: Path, form: str) -> list[dict[str, Any]]:
    """``form`` built twice, each in a new process, through the engine's compile cache in one
    fresh root: cold (empty), then warm (what the first left)."""
    with tempfile.TemporaryDirectory(prefix="hymt-compile-cache-") as root:
        return [
            {"cache": state, **run_fresh(checkpoint, form, cache_root=Path(root))}
            for state in ("cold", "warm")
        ]


def cache_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The ``--warm-cache`` table: each form's cold and warm ready times side by side."""
    pairs: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if "cache" in row:
            pairs.setdefault(row["form"], {})[row["cache"]] = row
    if not pairs:
        return []
    lines = [
        "",
        "Through the engine's compile cache (`--warm-cache`): a start with an empty cache, "
        "then one that reuses it, each in its own process; CUDA graphs are captured at both.",
        "",
        "| form | cold ready s | warm ready s | warm / cold | warm: reused | graphs from the "
        "cache / compiled | warm compile s | warm capture s |",
        "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for form, pair in pairs.items():
        cold, warm = pair.get("cold", {}), pair.get("warm", {})
        if "ready_s" not in cold or "ready_s" not in warm:
            lines.append(f"| {form} | failed: see ready.json | | | | | | |")
            continue
        cache = warm.get("compile_cache", {})
        lines.append(
            f"| {form} | {cold['ready_s']} | {warm['ready_s']} "
            f"| {warm['ready_s'] / cold['ready_s']:.2f} | {cache.get('reused')} "
            f"| {cache.get('fx_graph_hits', '')} / {cache.get('fx_graph_misses', '')} "
            f"| {warm.get('warmup_compile_s', '')} | {warm.get('capture_s', '')} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    rows = [row for row in report["rows"] if "cache" not in row]
    bf16 = {
        r.get("round", 0): r["ready_s"] for r in rows if r["form"] == "none" and "error" not in r
    }
    lines = [
        f"# Ready time per weight form ({report['gpu']}, {report['date']})",
        "",
        f"`{report['command']}`: each form in its own process with empty compile caches; "
        f"{ROWS} rows of {INPUT_TOKENS} + {NEW_TOKENS} tokens (the GPU profile).",
        "",
        "| round | form | weights GB | load s | build s | ready s | x bf16 "
        "| Triton kernels compiled |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    ratios: dict[str, list[float]] = {}
    ready: dict[str, list[float]] = {}
    for row in rows:
        round_ = row.get("round", 0)
        if "error" in row:
            lines.append(f"| {round_} | {row['form']} | failed: see ready.json | | | | | |")
            continue
        ratio = row["ready_s"] / bf16[round_] if round_ in bf16 else None
        ready.setdefault(row["form"], []).append(row["ready_s"])
        if ratio is not None:
            ratios.setdefault(row["form"], []).append(ratio)
        ours = ", ".join(f"{k} {v}" for k, v in sorted(row.get("our_kernels", {}).items()))
        lines.append(
            f"| {round_} | {row['form']} | {row['weight_gb']} | {row['load_s']} "
            f"| {row['build_s']} | {row['ready_s']} | {'' if ratio is None else f'{ratio:.2f}'} "
            f"| {row.get('inductor_kernels', '')}; {ours} |"
        )
    if len(bf16) > 1:
        lines += [
            "",
            "Per form over the rounds: the median ready time, and the median of the ratios to "
            "bf16's ready time in the same round.",
            "",
            "| form | rounds | median ready s | median x bf16 | x bf16 per round |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for form, times in ready.items():
            each = ratios.get(form, [])
            median_ratio = f"{statistics.median(each):.2f}" if each else ""
            lines.append(
                f"| {form} | {len(times)} | {statistics.median(times):.2f} | {median_ratio} "
                f"| {', '.join(f'{r:.2f}' for r in each)} |"
            )
    lines += cache_markdown(report["rows"])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/hymt-7b-random"))
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=["none", "fp8", "int8"])
    parser.add_argument(
        "--serial", nargs="*", choices=FORMS, default=[],
        help="forms to run once more with no kernel compiled ahead (engine.kernels.ahead)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="run every form this many times, each round starting one form later",
    )  # fmt: skip
    parser.add_argument(
        "--warm-cache", action="store_true",
        help="then each form cold and warm through the engine's compile cache",
    )  # fmt: skip
    parser.add_argument("--one", choices=FORMS, help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--serial-one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        measured = measure_one(args.checkpoint, args.one, args.serial_one, args.cache_root)
        print(json.dumps(measured), flush=True)
        return
    if args.out is None:
        parser.error("--out is required")
    import torch

    prepare(args.checkpoint, args.forms)
    rows: list[dict[str, Any]] = []
    report = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(form, False) for form in args.forms] + [(form, True) for form in args.serial]
    for round_ in range(args.rounds):
        shift = round_ % len(runs)
        for form, serial in runs[shift:] + runs[:shift]:
            rows.append({"round": round_, **run_fresh(args.checkpoint, form, serial)})
            print(rows[-1], flush=True)
            # written after every row: a run cut short by a time limit keeps what it measured
            (args.out / "ready.json").write_text(json.dumps(report, indent=2) + "\n")
            (args.out / "ready.md").write_text(markdown(report))
    for form in args.forms if args.warm_cache else []:
        for row in run_warm_cache(args.checkpoint, form):
            rows.append(row)
            print(row, flush=True)
            (args.out / "ready.json").write_text(json.dumps(report, indent=2) + "\n")
            (args.out / "ready.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
