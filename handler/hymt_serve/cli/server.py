"""The ``hymt`` commands that start, stop, scale and talk to a running TorchServe: start, stop,
health, drain, scale, token and web."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import requests

from hymt_serve.ops.drain import drain
from hymt_serve.ops.launcher import (
    LaunchError,
    Server,
    handler_description,
    model_workers,
    start,
    stop,
    stop_web,
    wait_ready,
)
from hymt_serve.ops.operate import (
    ScaleRefused,
    check_scale,
    compile_cache_line,
    guard_report,
    health,
    liveness,
    plural,
    scale,
)

DEFAULT_MODEL = "hunyuan-mt"
GUARD_REPORT_TIMEOUT_S = 2.0  # a line of hymt health's output: it must not stretch the probe


def model_names(models: Sequence[str], load_models: str) -> list[str]:
    """The model names of ``--model NAME=ARCHIVE`` entries, else of ``load_models``."""
    entries = list(models) or [e for e in load_models.split(",") if e.strip()]
    names = []
    for entry in entries:
        name = entry.split("=", 1)[0] if "=" in entry else Path(entry.strip()).name
        names.append(name.removesuffix(".mar").removesuffix(".tar.gz"))
    return [n for n in names if n not in ("all", "standalone")] or [DEFAULT_MODEL]


def _stop_and_exit(workdir: Path) -> None:
    stop(_server(workdir))
    raise SystemExit(128 + signal.SIGTERM)


def cmd_start(args: argparse.Namespace) -> int:
    overrides = dict(item.split("=", 1) for item in args.set)
    if args.foreground:  # SIGTERM (docker stop) while the workers load: TorchServe stops too
        signal.signal(signal.SIGTERM, lambda *_: _stop_and_exit(args.workdir))
    try:
        server, process = start(
            args.config,
            args.workdir,
            model_store=args.model_store,
            models=args.model,
            overrides=overrides,
            foreground=args.foreground,
        )
        names = model_names(args.model, server.properties().get("load_models", ""))
        wait_ready(server, names, args.timeout, process)
    except LaunchError as error:
        print(f"hymt start: {error}", file=sys.stderr)
        stop(_server(args.workdir))
        return 1
    print(
        f"TorchServe ready: {', '.join(names)} at {server.inference_url()} "
        f"(keys in {server.workdir / 'key_file.json'}, logs in {server.log_dir})"
    )
    for name in names:  # what the engine's build reused (engine.compile_cache)
        print(compile_cache_line(name, handler_description(server, name)))
    if process is None:
        return 0
    signal.signal(signal.SIGTERM, lambda *_: stop(server))
    return process.wait()


def _server(workdir: Path) -> Server:
    return Server(workdir.resolve())


def cmd_stop(args: argparse.Namespace) -> int:
    server = _server(args.workdir)
    if stop_web(server):
        print("web front end stopped")
    stopped = stop(server)
    print("TorchServe stopped" if stopped else f"no TorchServe running from {args.workdir}")
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    server = _server(args.workdir)
    try:
        check = liveness if args.liveness else health
        problems = check(server, args.model, args.timeout)
    except Exception as exc:  # any failure to ask is "unhealthy" for a health check
        problems = [f"cannot ask the server: {type(exc).__name__}: {exc}"]
    if problems:
        print(f"unhealthy: {'; '.join(problems)}", file=sys.stderr)
    else:
        print(f"healthy: {args.model} {'lives' if args.liveness else 'translates'}")
    if not args.liveness:  # the liveness probe stays one describe call
        print(guard_report(server, GUARD_REPORT_TIMEOUT_S))
    return 1 if problems else 0


def cmd_drain(args: argparse.Namespace) -> int:
    server = _server(args.workdir)
    names = args.model or model_names([], server.properties().get("load_models", ""))
    return 0 if drain(server, names, endpoint_wait=args.endpoint_wait, timeout=args.timeout) else 1


def cmd_scale(args: argparse.Namespace) -> int:
    server = _server(args.workdir)
    max_workers = args.max_workers if args.max_workers is not None else args.workers
    try:
        check_scale(args.workers, max_workers, _worker_ceiling(server, args))
        statuses = scale(server, args.model, args.workers, max_workers, args.timeout)
    except LaunchError as error:
        print(f"hymt scale: {error}", file=sys.stderr)
        return 2 if isinstance(error, ScaleRefused) else 1
    print(f"{args.model}: {plural(len(statuses), 'worker')} READY (at most {max_workers})")
    return 0


def _worker_ceiling(server: Server, args: argparse.Namespace) -> int:
    """On GPUs one worker per GPU, each holding a model copy; with ``share_engine`` the workers
    of a GPU hold none (they feed its engine process), so up to ``--max-cpu-workers`` per GPU.
    On CPUs the CPU ceiling."""
    if not any(worker.get("gpu") for worker in model_workers(server, args.model)):
        return int(args.max_cpu_workers)
    import torch  # only on GPUs: torch takes seconds to import

    gpus = max(torch.cuda.device_count(), 1)
    settings = handler_description(server, args.model).get("settings") or {}
    return gpus * int(args.max_cpu_workers) if settings.get("share_engine") is True else gpus


def cmd_token(args: argparse.Namespace) -> int:
    server = _server(args.workdir)
    if args.renew:
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


def cmd_web(args: argparse.Namespace) -> int:
    # Starlette, uvicorn and the web package load only for this command (start-up of the others).
    from sqlalchemy.exc import SQLAlchemyError

    # the web package and the database layer it imports: the same start-up cost
    from hymt_serve.cli.database import database_url
    from hymt_serve.core.errors import ConfigurationError
    from hymt_serve.web.app import create_app, is_loopback
    from hymt_serve.web.database import shown
    from hymt_serve.web.fairness import KeyLimits
    from hymt_serve.web.keys import KEYS_FILE, ClientKeys
    from hymt_serve.web.serving import serve

    server = _server(args.workdir)
    server.workdir.mkdir(parents=True, exist_ok=True)
    key_file = args.client_keys or server.workdir / KEYS_FILE
    url = database_url(args)
    try:
        # Migrates the database and imports the key file before serving (both block).
        client_keys = ClientKeys.open(key_file, args.character_limit, url)
    except ConfigurationError as error:
        print(f"hymt web: {error}", file=sys.stderr)
        return 1
    except SQLAlchemyError as error:
        print(f"hymt web: database {shown(url)}: {error}", file=sys.stderr)
        return 1
    if args.requests_per_key < 1 or args.threads < 1:
        option = "--requests-per-key" if args.requests_per_key < 1 else "--threads"
        print(f"hymt web: {option} must be 1 or more", file=sys.stderr)
        return 1
    require_keys = args.require_keys or not is_loopback(args.host)
    server.web_pid_path.write_text(f"{os.getpid()}\n")  # for hymt stop
    # uvicorn stops gracefully on SIGTERM, then raises it again: this handler ends the process
    # through the finally below (the pid file removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"translation page on http://{args.host}:{args.port}/ (TorchServe key stays here)")
    print(f"LibreTranslate and DeepL compatible APIs there too, keys in {key_file}")
    print(f"client keys and usage in the database {shown(url)} (hymt keys list)")
    if require_keys:
        print("every route but the page and the probes asks for a client key of that file")
    try:
        app = create_app(
            server,
            args.model,
            refine_model=args.refine_model,
            client_keys=client_keys,
            require_keys=require_keys,
            limits=KeyLimits(args.requests_per_key),
        )
        serve(app, args.host, args.port, args.threads)
    finally:
        server.web_pid_path.unlink(missing_ok=True)
    return 0
