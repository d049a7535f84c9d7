"""The ``hymt`` command line: build the tiny demo model and the model archive, start, scale and
stop TorchServe, check its health, translate, serve the web page."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hymt_serve.cli import database, translate
from hymt_serve.cli.build import cmd_archive, cmd_quantize_fp8, cmd_tiny_model
from hymt_serve.cli.server import (
    DEFAULT_MODEL,
    cmd_drain,
    cmd_health,
    cmd_scale,
    cmd_start,
    cmd_stop,
    cmd_token,
    cmd_web,
)
from hymt_serve.ops.tiny_model import FAMILIES

DESCRIPTION = """\
Serve Hunyuan-MT translation models with TorchServe: build a model archive, start, scale and
stop the server, check its health, translate, serve the translation web page, manage its
database and client keys."""
EPILOG = """\
a first try, without a GPU: bash scripts/demo.sh (a tiny random model: its output is noise)
then:  hymt translate "你好，世界。" --to en     echo "Good morning." | hymt translate --to fr
every command exits 0 on success and non-zero with a message on failure;
hymt COMMAND --help describes one command"""
WORKDIR_HELP = "the server's work folder: keys, logs, pid files (default: run)"
MODEL_HELP = f"the model's name on the server (default: {DEFAULT_MODEL})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hymt",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser("tiny-model", help="write a tiny random-weight model folder")
    tiny.add_argument("--out", type=Path, default=Path("build/tiny-model"))
    tiny.add_argument("--tokenizer", type=Path, help="Hunyuan tokenizer folder (default: found)")
    tiny.add_argument(
        "--fallback-tokenizer",
        action="store_true",
        help="train the project's small tokenizer even if the real one is found",
    )
    tiny.add_argument(
        "--tokenizer-format",
        choices=("json", "tiktoken"),
        default="json",
        help="tokenizer.json, or hy.tiktoken with a remote-code config (older repositories)",
    )
    tiny.add_argument(
        "--family",
        choices=FAMILIES,
        default="hunyuan",
        help="hunyuan: the dense 7B family's form (hunyuan_v1_dense); hy-mt2-moe: "
        "Hy-MT2-30B-A3B's (hy_v3, mixture of experts, its own tokens and template)",
    )
    tiny.set_defaults(func=cmd_tiny_model)

    quantize = sub.add_parser(
        "quantize-fp8",
        help="write a bf16 model folder as an FP8 checkpoint in Tencent's published format",
    )
    quantize.add_argument("--model-path", type=Path, required=True)
    quantize.add_argument("--out", type=Path, required=True)
    quantize.add_argument("--device", default="cpu", help="where to calibrate (cpu, cuda)")
    quantize.add_argument(
        "--ignore-key",
        choices=("ignored_layers", "ignore"),
        default="ignored_layers",
        help="the published configs' spelling, or compressed-tensors' own",
    )
    quantize.set_defaults(func=cmd_quantize_fp8)

    archive = sub.add_parser("archive", help="build the model archive into the model store")
    archive.add_argument("--model-path", type=Path, required=True)
    archive.add_argument("--profile", choices=("cpu", "gpu"), default="cpu")
    archive.add_argument("--template", type=Path, help="model-config template (overrides profile)")
    archive.add_argument("--name", default=DEFAULT_MODEL)
    archive.add_argument("--export-path", type=Path, default=Path("model_store"))
    archive.add_argument(
        "--bundle-weights",
        action="store_true",
        help="copy the model folder into the archive (small models only)",
    )
    archive.add_argument("--format", choices=("default", "no-archive", "tgz"), default="default")
    archive.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a model-config key, e.g. handler.max_new_tokens=16",
    )
    archive.set_defaults(func=cmd_archive)

    start = sub.add_parser("start", help="start TorchServe and wait until workers are READY")
    start.add_argument("--config", type=Path, default=Path("config.properties"))
    start.add_argument("--workdir", type=Path, default=Path("run"))
    start.add_argument("--model-store", type=Path)
    start.add_argument("--model", action="append", default=[], metavar="NAME=ARCHIVE")
    start.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config.properties key, e.g. inference_address=...",
    )
    start.add_argument("--timeout", type=float, default=300.0)
    start.add_argument("--foreground", action="store_true", help="stay attached (containers)")
    start.set_defaults(func=cmd_start)

    scale_cmd = sub.add_parser(
        "scale", help="set the number of workers (checked), wait until they are READY"
    )
    scale_cmd.add_argument("workers", type=int, help="workers to run (at least 1)")
    scale_cmd.add_argument(
        "--max-workers", type=int, help="TorchServe's max_worker (default: same)"
    )
    scale_cmd.add_argument("--workdir", type=Path, default=Path("run"))
    scale_cmd.add_argument("--model", default=DEFAULT_MODEL)
    scale_cmd.add_argument("--timeout", type=float, default=300.0)
    scale_cmd.add_argument(
        "--max-cpu-workers",
        type=int,
        default=int(os.environ.get("HYMT_MAX_CPU_WORKERS", "4")),
        help="ceiling for a model on CPUs, each worker holding a copy "
        "(default $HYMT_MAX_CPU_WORKERS or 4); on GPUs the ceiling is the GPUs present, "
        "or this many per GPU with share_engine (the workers then hold no model copy)",
    )
    scale_cmd.set_defaults(func=cmd_scale)

    for name, func, text in (
        ("stop", cmd_stop, "stop TorchServe and this work folder's web front end"),
        ("health", cmd_health, "exit 0 when the model translates now"),
        ("drain", cmd_drain, "fail health checks, then wait until every request is answered"),
        ("token", cmd_token, "print a token key"),
        ("translate", translate.cmd_translate, "translate texts, a file or standard input"),
        ("web", cmd_web, "serve the translation web page"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--workdir", type=Path, default=Path("run"), help=WORKDIR_HELP)
        command.set_defaults(func=func)
        if name in ("health", "translate", "web"):
            command.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    sub.choices["token"].add_argument(
        "--api", choices=("inference", "management"), default="inference"
    )
    sub.choices["token"].add_argument(
        "--renew", action="store_true", help="issue a new key first (the old one stops working)"
    )
    sub.choices["health"].add_argument(
        "--timeout",
        type=float,
        default=8.0,
        help="seconds a one-token translation may take (default 8)",
    )
    sub.choices["health"].add_argument(
        "--liveness",
        action="store_true",
        help="only: TorchServe runs, its workers READY and alive (no translation; drain ignored)",
    )
    drain_cmd = sub.choices["drain"]
    drain_cmd.add_argument("--model", action="append", default=[], help="default: load_models")
    drain_cmd.add_argument("--endpoint-wait", type=float, default=10.0, metavar="SECONDS")
    drain_cmd.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS")
    web = sub.choices["web"]
    web.add_argument("--host", default="127.0.0.1")
    web.add_argument("--port", type=int, default=8000)
    web.add_argument(
        "--refine-model",
        help="name of a Hunyuan-MT-Chimera model on the same TorchServe: enables /api/refine",
    )
    web.add_argument(
        "--client-keys",
        type=Path,
        help="key file imported into the database at start (default: WORKDIR/web_keys.json, "
        "created with one key when neither it nor the database has a key)",
    )
    web.add_argument("--database-url", help=database.DATABASE_HELP)
    web.add_argument(
        "--character-limit",
        type=int,
        default=1_000_000,
        help="characters the key of a newly created key file may have translated",
    )
    web.add_argument(
        "--require-keys",
        action="store_true",
        help="ask for a client key on every route but the page and the probes even on "
        "loopback (always so on any other address: behind a proxy on the same host, say)",
    )
    web.add_argument(
        "--requests-per-key",
        type=int,
        default=32,
        help="requests one client key may have in progress (429 beyond)",
    )
    web.add_argument(
        "--threads",
        type=int,
        default=64,
        help="worker threads for the front end's blocking work (reading TorchServe's key file, "
        "language detection); requests and streams are served on one event loop, however many",
    )
    translate.add_arguments(sub.choices["translate"])
    database.add_parsers(sub, WORKDIR_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
