"""The ``hymt`` commands that write files: the tiny demo model, an FP8 checkpoint, the model
archive."""

from __future__ import annotations

import argparse
from pathlib import Path

from hymt_serve.ops.archive import build_archive, parse_override
from hymt_serve.ops.tiny_model import build_tiny_model, default_tokenizer_dir
from hymt_serve.ops.tiny_moe import build_tiny_moe_model


def cmd_tiny_model(args: argparse.Namespace) -> int:
    tokenizer = None if args.fallback_tokenizer else (args.tokenizer or default_tokenizer_dir())
    if args.family == "hy-mt2-moe":
        tokenizer = None  # (the real tokenizer at hand is the dense family's)
        out = build_tiny_moe_model(args.out)
    else:
        out = build_tiny_model(args.out, tokenizer, tokenizer_format=args.tokenizer_format)
    print(
        f"tiny random-weight {args.family} model written to {out} "
        f"(tokenizer: {tokenizer or 'fallback built by this project'})"
    )
    return 0


def cmd_quantize_fp8(args: argparse.Namespace) -> int:
    from hymt_serve.ops.quantize import write_fp8_checkpoint  # imports torch: seconds

    out = write_fp8_checkpoint(
        args.model_path, args.out, device=args.device, ignore_key=args.ignore_key
    )
    print(f"FP8 checkpoint written to {out} (serve it as it is: quantization stays 'none')")
    return 0


def cmd_archive(args: argparse.Namespace) -> int:
    template = args.template or Path("configs") / f"model-config-{args.profile}.yaml"
    path = build_archive(
        model_path=args.model_path.resolve(),
        template=template,
        export_path=args.export_path,
        name=args.name,
        bundle_weights=args.bundle_weights,
        archive_format=args.format,
        overrides=dict(parse_override(item) for item in args.set),
    )
    print(f"archive written to {path}")
    return 0
