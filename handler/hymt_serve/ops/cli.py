"""The ``hymt`` command: build the tiny model and the archive, start/stop/check TorchServe,
print a token, translate from the command line.

Every subcommand exits 0 on success and non-zero with a message on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "hunyuan-mt"


def _cmd_tiny_model(args: argparse.Namespace) -> int:
    from hymt_serve.ops.tiny_model import build_tiny_model, default_tokenizer_dir

    tokenizer = None if args.fallback_tokenizer else (args.tokenizer or default_tokenizer_dir())
    out = build_tiny_model(args.out, tokenizer, tokenizer_format=args.tokenizer_format)
    print(
        f"tiny random-weight model written to {out} "
        f"(tokenizer: {tokenizer or 'fallback built by this project'})"
    )
    return 0


def _cmd_quantize_fp8(args: argparse.Namespace) -> int:
    from hymt_serve.ops.quantize import write_fp8_checkpoint

    out = write_fp8_checkpoint(
        args.model_path, args.out, device=args.device, ignore_key=args.ignore_key
    )
    print(f"FP8 checkpoint written to {out} (serve it as it is: quantization stays 'none')")
    return 0


def _cmd_archive(args: argparse.Namespace) -> int:
    from hymt_serve.ops.archive import build_archive, parse_override

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


def _model_names(models: Sequence[str], load_models: str) -> list[str]:
    entries = list(models) or [e for e in load_models.split(",") if e.strip()]
    names = []
    for entry in entries:
        name = entry.split("=", 1)[0] if "=" in entry else Path(entry.strip()).name
        names.append(name.removesuffix(".mar").removesuffix(".tar.gz"))
    return [n for n in names if n not in ("all", "standalone")] or [DEFAULT_MODEL]


def _stop_and_exit(workdir: Path) -> None:
    from hymt_serve.ops.launcher import stop

    stop(_server(workdir))
    raise SystemExit(128 + signal.SIGTERM)


def _cmd_start(args: argparse.Namespace) -> int:
    from hymt_serve.ops.launcher import LaunchError, stop, wait_ready
    from hymt_serve.ops.launcher import start as start_server

    overrides = dict(item.split("=", 1) for item in args.set)
    if args.foreground:  # SIGTERM (docker stop) while the workers load: TorchServe stops too
        signal.signal(signal.SIGTERM, lambda *_: _stop_and_exit(args.workdir))
    try:
        server, process = start_server(
            args.config,
            args.workdir,
            model_store=args.model_store,
            models=args.model,
            overrides=overrides,
            foreground=args.foreground,
        )
        names = _model_names(args.model, server.properties().get("load_models", ""))
        wait_ready(server, names, args.timeout, process)
    except LaunchError as error:
        print(f"hymt start: {error}", file=sys.stderr)
        stop(_server(args.workdir))
        return 1
    print(
        f"TorchServe ready: {', '.join(names)} at {server.inference_url()} "
        f"(keys in {server.workdir / 'key_file.json'}, logs in {server.log_dir})"
    )
    if process is None:
        return 0
    signal.signal(signal.SIGTERM, lambda *_: stop(server))
    return process.wait()


def _server(workdir: Path) -> Any:
    from hymt_serve.ops.launcher import Server

    return Server(workdir.resolve())


def _cmd_stop(args: argparse.Namespace) -> int:
    from hymt_serve.ops.launcher import stop, stop_web

    server = _server(args.workdir)
    if stop_web(server):
        print("web front end stopped")
    stopped = stop(server)
    print("TorchServe stopped" if stopped else f"no TorchServe running from {args.workdir}")
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    from hymt_serve.ops.operate import health, liveness

    server = _server(args.workdir)
    try:
        check = liveness if args.liveness else health
        problems = check(server, args.model, args.timeout)
    except Exception as exc:  # any failure to ask is "unhealthy" for a health check
        problems = [f"cannot ask the server: {type(exc).__name__}: {exc}"]
    if problems:
        print(f"unhealthy: {'; '.join(problems)}", file=sys.stderr)
        return 1
    print(f"healthy: {args.model} {'lives' if args.liveness else 'translates'}")
    return 0


def _cmd_drain(args: argparse.Namespace) -> int:
    from hymt_serve.ops.drain import drain

    server = _server(args.workdir)
    names = args.model or _model_names([], server.properties().get("load_models", ""))
    return 0 if drain(server, names, endpoint_wait=args.endpoint_wait, timeout=args.timeout) else 1


def _cmd_scale(args: argparse.Namespace) -> int:
    from hymt_serve.ops.launcher import LaunchError
    from hymt_serve.ops.operate import ScaleRefused, check_scale, scale

    server = _server(args.workdir)
    max_workers = args.max_workers if args.max_workers is not None else args.workers
    try:
        check_scale(args.workers, max_workers, _worker_ceiling(server, args))
        statuses = scale(server, args.model, args.workers, max_workers, args.timeout)
    except LaunchError as error:
        print(f"hymt scale: {error}", file=sys.stderr)
        return 2 if isinstance(error, ScaleRefused) else 1
    print(f"{args.model}: {len(statuses)} workers READY (at most {max_workers})")
    return 0


def _worker_ceiling(server: Any, args: argparse.Namespace) -> int:
    """The GPUs present when the model runs on GPUs (one worker each), else the CPU ceiling."""
    from hymt_serve.ops.launcher import model_workers

    if not any(worker.get("gpu") for worker in model_workers(server, args.model)):
        return int(args.max_cpu_workers)
    import torch

    return max(torch.cuda.device_count(), 1)


def _cmd_token(args: argparse.Namespace) -> int:
    server = _server(args.workdir)
    if args.renew:
        import requests

        # TorchServe renews a key with the never-expiring "API" key and rewrites the key file.
        response = requests.get(
            f"{server.management_url()}/token",
            params={"type": args.api},
            headers=server.headers("API"),
            timeout=30,
        )
        if not response.ok:
            print(f"renewing the {args.api} key failed: {response.text}", file=sys.stderr)
            return 1
    key = server.keys().get(args.api)
    if not key:
        print(f"no {args.api} key in {args.workdir}/key_file.json", file=sys.stderr)
        return 1
    print(key)
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    import requests

    server = _server(args.workdir)
    body: dict[str, Any] = {"text": args.text, "target_lang": args.to}
    if args.source:
        body["source_lang"] = args.source
    response = requests.post(
        f"{server.inference_url()}/predictions/{args.model}",
        json=body,
        headers=server.headers("inference"),
        timeout=300,
    )
    print(json.dumps(response.json(), ensure_ascii=False, indent=2))
    return 0 if response.ok else 1


def _cmd_web(args: argparse.Namespace) -> int:
    from waitress import serve

    from hymt_serve.request.errors import ConfigurationError
    from hymt_serve.web.app import create_app
    from hymt_serve.web.keys import KEYS_FILE, ClientKeys

    server = _server(args.workdir)
    server.workdir.mkdir(parents=True, exist_ok=True)
    key_file = args.client_keys or server.workdir / KEYS_FILE
    try:
        client_keys = ClientKeys.open(key_file, args.character_limit)
    except ConfigurationError as error:
        print(f"hymt web: {error}", file=sys.stderr)
        return 1
    server.web_pid_path.write_text(f"{os.getpid()}\n")  # for hymt stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"translation page on http://{args.host}:{args.port}/ (TorchServe key stays here)")
    print(f"LibreTranslate and DeepL compatible APIs there too, keys in {key_file}")
    try:
        app = create_app(
            server, args.model, refine_model=args.refine_model, client_keys=client_keys
        )
        serve(app, host=args.host, port=args.port, threads=args.threads)
    finally:
        server.web_pid_path.unlink(missing_ok=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hymt", description=__doc__)
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
    tiny.set_defaults(func=_cmd_tiny_model)

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
    quantize.set_defaults(func=_cmd_quantize_fp8)

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
    archive.set_defaults(func=_cmd_archive)

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
    start.set_defaults(func=_cmd_start)

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
        "(default $HYMT_MAX_CPU_WORKERS or 4); on GPUs the ceiling is the GPUs present",
    )
    scale_cmd.set_defaults(func=_cmd_scale)

    for name, func, text in (
        ("stop", _cmd_stop, "stop TorchServe and this work folder's web front end"),
        ("health", _cmd_health, "exit 0 when the model translates now"),
        ("drain", _cmd_drain, "fail health checks, then wait until every request is answered"),
        ("token", _cmd_token, "print a token key"),
        ("translate", _cmd_translate, "translate one text"),
        ("web", _cmd_web, "serve the translation web page"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--workdir", type=Path, default=Path("run"))
        command.set_defaults(func=func)
        if name in ("health", "translate", "web"):
            command.add_argument("--model", default=DEFAULT_MODEL)
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
        help="key file of the LibreTranslate/DeepL compatible APIs (default: "
        "WORKDIR/web_keys.json, created with one key when missing)",
    )
    web.add_argument(
        "--character-limit",
        type=int,
        default=1_000_000,
        help="characters the key of a newly created key file may have translated",
    )
    web.add_argument(
        "--threads",
        type=int,
        default=64,
        help="requests served at once (each mostly waits on TorchServe; a refinement holds one "
        "for its whole time)",
    )
    translate = sub.choices["translate"]
    translate.add_argument("text")
    translate.add_argument("--to", required=True, help="target language code")
    translate.add_argument("--from", dest="source", help="source language code")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
