"""Where a batch-1 decode step's time goes, per weight form: the kernels of one eager step
(the same kernels its CUDA graph replays), summed by name, beside the graph's replay time.

One engine per form from the same 7B-shaped random-weight checkpoint (``step_ab.py``'s, built
the way the server loads it), the 168-position cache of ``bench_decode.py``. Writes
``step_kernels.json`` and ``step_kernels.md`` to ``--out``.

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/step_kernels.py --out DIR \
        [--forms none int8+head int4+head]
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch
from bench_decode import build_model, graph_step_ms, kernel_times
from step_ab import PROMPT, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--forms", nargs="+", default=["none", "int8+head", "int4+head"])
    parser.add_argument("--top", type=int, default=16)
    parser.add_argument("--checkpoint", type=Path, default=Path("/tmp/hymt-7b-random"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    length = PROMPT + 128
    if not (args.checkpoint / "config.json").is_file():
        build_model().save_pretrained(args.checkpoint)
        gc.collect()
        torch.cuda.empty_cache()
    found: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    lines = [f"# Kernels of a batch-1 decode step: {found['gpu']}, torch {found['torch']}", ""]
    for form in args.forms:
        runner = engine(args.checkpoint, form, "base", 1, length)
        graph = graph_step_ms(runner, 1)
        kernels = kernel_times(runner, 1, args.top)
        found[form] = {"graph_ms": round(graph, 4), "kernels": kernels}
        lines += [f"## {form}: graph replay {graph:.3f} ms", "", "| kernel | ms | calls |"]
        lines += ["| --- | ---: | ---: |"]
        lines += [f"| `{k['kernel']}` | {k['ms']} | {k['calls']} |" for k in kernels]
        lines.append("")
        del runner
        gc.collect()
        torch.cuda.empty_cache()
        (args.out / "step_kernels.json").write_text(json.dumps(found, indent=1) + "\n")
        (args.out / "step_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
