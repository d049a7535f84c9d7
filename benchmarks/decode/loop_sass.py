"""The instructions of the int4 one-row kernel's inner loop, compiled here for an H100/H200
(sm_90) without a GPU: Triton compiles, its bundled ``nvdisasm`` disassembles, and this counts
the longest loop's instructions by opcode (barriers and shared memory too).

The kernel of ``int4_packed.py`` (its modes, on the one-row tiles of the [words, columns]
kernel) and the engine's own ``one_row_kernel`` for bf16 inputs (the words tile, the engine's
before the chain kernel, which ``int4_chain.py --sass`` counts) and fp16 inputs. The pointers
and sizes are marked divisible by 16, as Triton marks a 7B's on the GPU (without it the loads
do not vectorise and the counts mean nothing).

    PYTHONPATH=handler:benchmarks/decode python benchmarks/decode/loop_sass.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import triton
from int4_packed import MODES, row_kernel
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hymt_serve.engine.kernels import weight_only as wo
from hymt_serve.engine.kernels import weight_only_triton as kernels

TARGET = GPUTarget("cuda", 90, 32)
NVDISASM = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
ARGS = {
    "x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*fp16", "out_ptr": "*fp32", "M": "i32",
    "N": "i32", "K": "i32", "stride_xm": "i32",
}  # fmt: skip
DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "out_ptr", "N", "K", "stride_xm", "SPAN")


def compiled(kernel: Any, signature: dict[str, str], constants: dict[str, int], warps: int) -> Any:
    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in DIVISIBLE if n in names}
    source = ASTSource(kernel, signature, constants, attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": warps, "num_stages": 1})


def loop_counts(cubin: bytes, path: Path) -> dict[str, Any]:
    """The longest backward branch's body: its length and opcodes."""
    path.write_bytes(cubin)
    text = subprocess.run(
        [str(NVDISASM), "-c", str(path)], capture_output=True, text=True, check=True
    ).stdout
    lines = text.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:$", line)}
    body: list[str] = []
    for i, line in enumerate(lines):
        target = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if target and labels.get(target.group(1), i) < i:
            candidate = lines[labels[target.group(1)] : i + 1]
            candidate = [x for x in candidate if re.match(r"^\s+/\*[0-9a-f]{4}\*/", x)]
            body = max(body, candidate, key=len)
    ops = Counter(re.sub(r".*\*/\s+(@!?U?P\w+ )?([A-Z0-9_]+).*", r"\2", x) for x in body)
    return {"instructions": len(body), "kernel_barriers": text.count("BAR.SYNC"), "ops": dict(ops)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("/tmp/loop_sass"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    row_args = {**ARGS, "GROUP": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    row_args |= {"SPAN": "i32", "MODE": "constexpr", "AHEAD": "constexpr"}
    for config in (wo.Config(1, 64, 128, 2, 1, 1056), wo.INT4_WORDS_ROW_CONFIG):
        for name, mode in MODES.items():
            constants = {"GROUP": 128, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k}
            kernel = compiled(
                row_kernel, row_args, constants | {"MODE": mode, "AHEAD": 1}, config.warps
            )
            words = config.block_n * config.block_k // 8 // (32 * config.warps)
            counts = loop_counts(kernel.asm["cubin"], args.out / f"{name}.cubin")
            results.append(
                {"kernel": name, "config": list(config), "words_per_thread": words} | counts
            )
    engine_args = {**ARGS, "KIND": "constexpr", "GROUP": "constexpr", "BLOCK_M": "constexpr"}
    engine_args |= {"BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "SPAN": "i32"}
    engine_args |= {"BF16_PAIRS": "constexpr"}
    for dtype, config in (
        ("bf16", wo.INT4_WORDS_ROW_CONFIG),
        ("fp16", wo.FP16_ONE_ROW_CONFIGS[wo.INT4]),
    ):
        constants = {"KIND": wo.INT4, "GROUP": 128, "BLOCK_M": 1, "BLOCK_N": config.block_n}
        constants |= {"BLOCK_K": config.block_k, "BF16_PAIRS": dtype == "bf16"}
        kernel = compiled(
            kernels.one_row_kernel, engine_args | {"x_ptr": f"*{dtype}"}, constants, config.warps
        )
        words = config.block_n * config.block_k // 8 // (32 * config.warps)
        counts = loop_counts(kernel.asm["cubin"], args.out / f"engine-{dtype}.cubin")
        results.append(
            {"kernel": f"engine {dtype}", "config": list(config), "words_per_thread": words}
            | counts
        )
    for row in results:
        top = sorted(row["ops"].items(), key=lambda item: -item[1])[:8]
        per_word = row["instructions"] / row["words_per_thread"]
        print(
            f"{row['kernel']:>13} {tuple(row['config'])}: {row['instructions']} a block "
            f"({per_word:.1f} a word), {row['kernel_barriers']} barriers in the kernel; {top}"
        )
    (args.out / "loop_sass.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
