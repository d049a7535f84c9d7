"""The decode step under engine variants, side by side in one process on a 7B-shaped
random-weight model: the engine's tiles and settings against changed ones.

Each run is ``FORM:VARIANT``. A variant is ``base`` (the engine as it is) or changes joined by
``+``, each read when the engine is built and captured:

- ``int4=B_M,B_N,B_K,WARPS,STAGES,PROGRAMS``: int4's one-row tiles (``ONE_ROW_CONFIGS``);
- ``int8=...``: int8's one-row tiles;
- ``plain=...``, ``plain_wide=...``: a plain (bf16) weight's one-row tiles, below and from
  ``WIDE`` output columns (``PLAIN_ROW_CONFIG``, ``WIDE_PLAIN_ROW_CONFIG``);
- ``unroll=N``: inductor's global ``unroll_reductions_threshold`` (since 2026-12-04 the step
  functions pass their own, ``split_sums``, so this reaches only what else is compiled);
- ``attn_short=N``: the decode attention's ``_SHORT_CACHE_SPLITS`` (1: a cache under 512
  positions runs one split, as before it was added);
- ``int8_shapes=off``: int8's one row on ``ONE_ROW_CONFIGS`` for every shape (no
  ``INT8_ROW_SHAPE_CONFIGS``); ``int8_shape=OUTxIN:B_M,...``: one shape's entry there;
  ``int4_shape=OUTxIN:B_M,...``: one shape's entry in ``INT4_ROW_SHAPE_CONFIGS`` (int4's
  one row with bf16 inputs on the chain kernel);
- ``qkv=one``: q, k and v written by one compiled kernel (``qkv_one_kernel``, tried on
  2026-12-04 and not kept: benchmarks/decode/quantized/qkv-one-kernel/);
- ``norms16=off``: int8 products take the norms' outputs as bf16, as before 2026-12-05
  (``fast.FP16_NORM_INPUTS``; on, they take them as fp16);
- ``int4_row=words``: int4's one row with bf16 inputs in one_row_kernel's ``[words,
  columns]`` tile, on its own tiles (``weight_only.INT4_BF16_ROW``, before 2026-12-06 the
  engine's); the engine's is ``chain``;
- ``split_sums=N``: the step functions' ``unroll_reductions_threshold``
  (``model.SPLIT_SUMS_READ``: sums over fewer than N splits are read by the next kernel
  instead of running as a kernel of their own).

For each form, one engine per variant is loaded from the same checkpoint as the server loads it
(the first variant of a form is its baseline); all must give the same greedy tokens as the
baseline, or the row says they did not (a change of tiles may change the sums' rounding). Then
the replay time of each engine's captured step is taken in turns for each batch; medians and
their ratios to the baseline go to JSON and Markdown, written after each form.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/step_ab.py --out DIR \
        --runs int4+head:base int4+head:int4=1,32,128,1,1,1024 none:base none:attn_short=1
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from bench_decode import _ids, build_model, graph_step_ms, prompts

from hymt_serve.core.settings import Settings
from hymt_serve.core.types import GenerationRow
from hymt_serve.engine.checkpoints.loading import load_model
from hymt_serve.engine.kernels import attention
from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.models import hunyuan_v1_dense as step_model
from hymt_serve.engine.runners import build as fast
from hymt_serve.engine.runners.build import build_fast_runner
from hymt_serve.engine.runners.fast import FastRunner
from hymt_serve.engine.scheduler.loop import Scheduler

PROMPT = 40


def _config(value: str) -> wo.Config:
    return wo.Config(*(int(v) for v in value.split(",")))


def qkv_one_kernel(
    x: torch.Tensor, lw: Any, cos: torch.Tensor, sin: torch.Tensor, shape: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``model.qkv_step`` with RoPE and the QK norm run over v's heads too, each v head then
    taken as it came, so that one compiled kernel writes q, k and v (the engine's leaves v a
    view of the projection's output, which a kernel of its own makes)."""
    qkv = step_model.linear(
        step_model.rms_norm(x, lw.input_norm, shape.eps), lw.qkv, lw.qkv_scale, lw.qkv_input
    )
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    every = qkv.view(-1, heads + 2 * kv_heads, dim)
    k_norm = lw.k_norm.expand(kv_heads, dim)
    norm = torch.cat([lw.q_norm.expand(heads, dim), k_norm, k_norm])
    rotated = step_model._rotate(every, cos[:, None, :], sin[:, None, :])
    normed = step_model.rms_norm(rotated, norm, shape.eps)
    is_v = torch.arange(heads + 2 * kv_heads, device=qkv.device)[:, None] >= heads + kv_heads
    out = torch.where(is_v, every, normed)
    return out[:, :heads], out[:, heads : heads + kv_heads], out[:, heads + kv_heads :]


@contextlib.contextmanager
def applied(variant: str) -> Iterator[None]:
    """The process state of ``variant`` while the engine is built, then the state before."""
    import torch._inductor.config as inductor

    saved = (
        dict(wo.ONE_ROW_CONFIGS),
        attention._SHORT_CACHE_SPLITS,
        inductor.unroll_reductions_threshold,
        wo.PLAIN_ROW_CONFIG,
        wo.WIDE_PLAIN_ROW_CONFIG,
        {kind: dict(configs) for kind, configs in wo.ROW_SHAPE_CONFIGS.items()},
        step_model.SPLIT_SUMS_READ,
        step_model.qkv_step,
        fast.FP16_NORM_INPUTS,
        wo.INT4_BF16_ROW,
    )
    try:
        for change in [] if variant == "base" else variant.split("+"):
            key, _, value = change.partition("=")
            if key in ("int4", "int8"):
                kind = wo.INT4 if key == "int4" else wo.INT8
                wo.ONE_ROW_CONFIGS[kind] = _config(value)
            elif key == "plain":
                wo.PLAIN_ROW_CONFIG = _config(value)
            elif key == "plain_wide":
                wo.WIDE_PLAIN_ROW_CONFIG = _config(value)
            elif key == "unroll":
                inductor.unroll_reductions_threshold = int(value)
            elif key == "attn_short":
                attention._SHORT_CACHE_SPLITS = int(value)
            elif key == "int8_shapes" and value == "off":
                wo.INT8_ROW_SHAPE_CONFIGS.clear()
            elif key in ("int8_shape", "int4_shape"):
                shape, _, tiles = value.partition(":")
                out, _, inputs = shape.partition("x")
                kind = wo.INT4 if key == "int4_shape" else wo.INT8
                wo.ROW_SHAPE_CONFIGS[kind][(int(out), int(inputs))] = _config(tiles)
            elif key == "qkv" and value == "one":
                step_model.qkv_step = qkv_one_kernel
            elif key == "split_sums":
                step_model.SPLIT_SUMS_READ = int(value)
            elif key == "int4_row" and value in wo.INT4_BF16_ROWS:
                wo.INT4_BF16_ROW = value
            elif key == "norms16" and value == "off":
                fast.FP16_NORM_INPUTS = False
            else:
                raise ValueError(f"unknown change {change!r}")
        yield
    finally:
        wo.ONE_ROW_CONFIGS.clear()
        wo.ONE_ROW_CONFIGS.update(saved[0])
        attention._SHORT_CACHE_SPLITS = saved[1]
        inductor.unroll_reductions_threshold = saved[2]
        wo.PLAIN_ROW_CONFIG, wo.WIDE_PLAIN_ROW_CONFIG = saved[3], saved[4]
        for kind, configs in wo.ROW_SHAPE_CONFIGS.items():
            configs.clear()
            configs.update(saved[5][kind])
        step_model.SPLIT_SUMS_READ = saved[6]
        step_model.qkv_step = saved[7]
        fast.FP16_NORM_INPUTS = saved[8]
        wo.INT4_BF16_ROW = saved[9]


def engine(checkpoint: Path, form: str, variant: str, batch: int, length: int) -> FastRunner:
    """The fast engine over ``checkpoint`` in ``form``, built and captured under ``variant``."""
    quantization, _, head = form.partition("+")
    settings = {
        "model_path": str(checkpoint),
        "quantization": quantization,
        "quantize_lm_head": head == "head",
        "max_input_tokens": PROMPT,
        "max_new_tokens": length - PROMPT,
    }
    with applied(variant):
        loaded = load_model(Settings.from_mapping(settings, environ={}))
        return build_fast_runner(
            loaded.model,
            max_batch_size=batch,
            max_seq_len=length,
            quantize=loaded.plan.quantization,
            fp8_scales=loaded.fp8_scales,
            int4=loaded.int4,
            quantize_head=head == "head",
        )


def greedy(runner: FastRunner, length: int) -> list[tuple[int, ...]]:
    scheduler = Scheduler(runner, (), _ids, max_seq_len=length)
    futures = [scheduler.submit(GenerationRow(p, 32)) for p in prompts(4, PROMPT)]
    scheduler.run(futures)
    return [future.result().token_ids for future in futures]


def write(out: Path, report: dict[str, Any], turns: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_ab.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Decode step under engine variants: {report['gpu']}, torch {report['torch']}",
        "",
        f"`{report['command']}`",
        "",
        f"Replays of the captured step, median of {turns} turns each (taken in turns).",
        "",
        "| form | batch | variant | ms | base / this | same greedy tokens as base |",
        "| --- | ---: | --- | ---: | ---: | --- |",
    ]
    lines += [
        f"| {r['form']} | {r['batch']} | `{r['variant']}` | {r['ms']} | {r['base_over_this']} | "
        f"{r['same_tokens']} |"
        for r in report["rows"]
    ]
    (out / "step_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", nargs="+", required=True, help="FORM:VARIANT")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/hymt-7b-random"))
    args = parser.parse_args()
    forms: dict[str, list[str]] = {}
    for run in args.runs:
        form, _, variant = run.partition(":")
        forms.setdefault(form, []).append(variant or "base")
    length = PROMPT + 128
    if not (args.checkpoint / "config.json").is_file():
        model = build_model()
        model.save_pretrained(args.checkpoint)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "rows": [],
    }
    for form, variants in forms.items():
        top = max(args.batches)
        engines = {v: engine(args.checkpoint, form, v, top, length) for v in variants}
        tokens = {v: greedy(runner, length) for v, runner in engines.items()}
        for batch in args.batches:
            times: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(args.turns):
                for variant, runner in engines.items():
                    times[variant].append(graph_step_ms(runner, batch))
            base = statistics.median(times[variants[0]])
            for variant in variants:
                ms = statistics.median(times[variant])
                report["rows"].append(
                    {"form": form, "batch": batch, "variant": variant, "ms": round(ms, 4),
                     "base_over_this": round(base / ms, 3),
                     "same_tokens": tokens[variant] == tokens[variants[0]],
                     "turns": times[variant]}
                )  # fmt: skip
        write(args.out, report, args.turns)
        del engines
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
