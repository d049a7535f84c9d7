"""Start, watch and stop TorchServe: readiness, keys (the config file it is
started with: :mod:`hymt_serve.ops.properties`; the Java and the command it runs on:
:mod:`hymt_serve.ops.runtime`).

TorchServe's own ``--start`` returns at once even when the server then dies, and ``/ping`` is
healthy while models are still loading. ``start`` therefore renders an explicit config into a
work folder (relative paths resolved, ports overridable), starts with ``--ncs``, and polls the
management API until every worker of each model is READY, printing the relevant log lines and
failing when the server dies or the time runs out.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from hymt_serve.engine.process.shared import exists as alive
from hymt_serve.engine.process.shared import stop_engines, terminate
from hymt_serve.ops.frontend_guard import plugins_path
from hymt_serve.ops.properties import read_properties, render_config, write_properties
from hymt_serve.ops.runtime import LaunchError as LaunchError
from hymt_serve.ops.runtime import find_java_home, torchserve_command
from hymt_serve.ops.server_logs import (
    GIVE_UP_AFTER,
    LOG_CONFIG,
    import_failed,
    load_failures,
    log_excerpt,
    setting_refused,
)

KEY_FILE = "key_file.json"
KEY_FILE_WAIT_S = 2.0


class KeyFileUnavailable(OSError):
    """TorchServe's key file stayed unreadable (it is being rewritten, or the server is gone)."""


def _url(address: str) -> str:
    return address.replace("0.0.0.0", "127.0.0.1")


def _read_key_file(path: Path) -> dict[str, str]:
    """The keys of ``path`` ({} when it does not exist), cached while its size and time stay
    the same (it is read at every call of the web front end)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _KEY_CACHE.get(path)
    if cached is not None and cached[0] == stamp:
        return dict(cached[1])
    data = json.loads(path.read_text(encoding="utf-8"))
    keys = {str(api): str(entry["key"]) for api, entry in data.items() if "key" in entry}
    _KEY_CACHE[path] = (stamp, keys)
    return dict(keys)


_KEY_CACHE: dict[Path, tuple[tuple[int, int], dict[str, str]]] = {}


# --- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """A TorchServe instance owned by a work folder (config, keys, logs, pid file)."""

    workdir: Path

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.properties"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def properties(self) -> dict[str, str]:
        return read_properties(self.config_path)

    def management_url(self) -> str:
        return _url(self.properties().get("management_address", "http://127.0.0.1:8081"))

    def inference_url(self) -> str:
        return _url(self.properties().get("inference_address", "http://127.0.0.1:8080"))

    def metrics_url(self) -> str:
        return _url(self.properties().get("metrics_address", "http://127.0.0.1:8082"))

    def keys(self) -> dict[str, str]:
        """The current token keys by API ("inference", "management"); {} when auth is off.

        TorchServe rewrites its key file at each start, in place: a read can find it empty
        or half written. Such a read is tried again for up to ``KEY_FILE_WAIT_S``; then
        KeyFileUnavailable (an OSError: the server is as good as down)."""
        path = self.workdir / KEY_FILE
        deadline = time.monotonic() + KEY_FILE_WAIT_S
        while True:
            try:
                return _read_key_file(path)
            except (ValueError, TypeError, AttributeError, OSError) as error:
                if time.monotonic() >= deadline:
                    raise KeyFileUnavailable(f"{path} cannot be read ({error})") from error
            time.sleep(0.05)

    def headers(self, api: str) -> dict[str, str]:
        key = self.keys().get(api)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def environment(self) -> dict[str, str]:
        """Each server gets its own TEMP (pid file, worker sockets) and log folder."""
        java_home = find_java_home()
        env = dict(os.environ)
        env.update(
            JAVA_HOME=str(java_home),
            PATH=f"{java_home / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
            + env.get("PATH", ""),
            # TorchServe runs from the work folder: a relative entry would name another folder
            # there (its system-metrics command, `python -m hymt_serve.ops.system_metrics`,
            # then found no package and exported nothing)
            PYTHONPATH=os.pathsep.join(
                str(Path(entry).resolve()) if entry else entry
                for entry in env.get("PYTHONPATH", "").split(os.pathsep)
            ),
            TEMP=str(self.workdir / "tmp"),
            HYMT_WORK_DIR=str(self.workdir),  # the compile cache's home (engine.compile_cache)
            TMPDIR=str(self.workdir / "tmp"),
            LOG_LOCATION=str(self.log_dir),
            METRICS_LOCATION=str(self.log_dir),
        )
        return env

    def pid(self) -> int | None:
        return _live_pid(self.workdir / "tmp" / ".model_server.pid")

    @property
    def drain_marker(self) -> Path:
        """Written by ``hymt drain``: ``hymt health`` fails while it exists; a start removes it."""
        return self.workdir / "draining"

    @property
    def web_pid_path(self) -> Path:
        """Written by ``hymt web`` for this work folder, so that ``hymt stop`` ends it too."""
        return self.workdir / "web.pid"

    def web_pid(self) -> int | None:
        pid = _live_pid(self.web_pid_path)
        return pid if pid is not None and _is_web(pid) else None


def _live_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def _is_web(pid: int) -> bool:
    """Whether ``pid`` still runs ``hymt web`` (a pid file can outlive its process)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (macOS): trust the pid file
    return b"web" in command and any(
        part.endswith((b"hymt", b"hymt_serve.cli")) for part in command
    )


def free_port_overrides() -> dict[str, str]:
    """config.properties keys that put a server's ports (inference, management, metrics, both
    gRPC ports) and its first worker port on free loopback ports: for a server beside others on
    one host (tests, benchmarks)."""
    sockets = [socket.socket() for _ in range(6)]
    for each in sockets:
        each.bind(("127.0.0.1", 0))
    inference, management, metrics, grpc_i, grpc_m, worker = (
        each.getsockname()[1] for each in sockets
    )
    for each in sockets:
        each.close()
    return {
        "inference_address": f"http://127.0.0.1:{inference}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "grpc_inference_port": str(grpc_i),
        "grpc_management_port": str(grpc_m),
        "initial_worker_port": str(worker),
    }


def start(
    config: Path,
    workdir: Path,
    *,
    model_store: Path | None = None,
    models: Sequence[str] = (),
    overrides: Mapping[str, str] | None = None,
    foreground: bool = False,
) -> tuple[Server, subprocess.Popen[bytes] | None]:
    """Render the config into ``workdir`` and start TorchServe there (not yet waiting)."""
    workdir = workdir.resolve()
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    server = Server(workdir)
    if server.pid() is not None:
        raise LaunchError(f"a TorchServe started from {workdir} is already running (hymt stop)")
    values = render_config(config, overrides, model_store)
    if not values.get("plugins_path"):  # the async request-map guard (frontend_guard)
        guard = plugins_path()
        if guard is not None:
            values["plugins_path"] = str(guard)
        else:
            print(
                "hymt: the front-end plugin's jar is missing (a broken install: reinstall the"
                " package): async mode runs with TorchServe's own request map, unsynchronised"
                " and keeping every error reply (docs/operations.md)",
                file=sys.stderr,
            )
    write_properties(values, server.config_path)
    (workdir / KEY_FILE).unlink(missing_ok=True)
    server.drain_marker.unlink(missing_ok=True)
    if server.log_dir.exists():  # this start's logs alone, so that failures are this start's
        shutil.rmtree(workdir / "logs.previous", ignore_errors=True)
        server.log_dir.rename(workdir / "logs.previous")
    command = [*torchserve_command(), "--start", "--ncs", "--ts-config", str(server.config_path)]
    if "-Dlog4j.configurationFile=" not in values.get("vmargs", ""):  # a config's own wins
        command += ["--log-config", str(LOG_CONFIG)]
    if models:
        command += ["--models", *models]
    if foreground:
        process = subprocess.Popen(
            [*command, "--foreground"], cwd=workdir, env=server.environment()
        )
        return server, process
    server.log_dir.mkdir(exist_ok=True)
    # The Java server inherits these streams: a pipe would keep the caller's pipeline open.
    with open(server.log_dir / "start.log", "ab") as log:
        subprocess.run(
            command,
            cwd=workdir,
            env=server.environment(),
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return server, None


def describe_model(
    server: Server, name: str, suffix: str = "", timeout: float = 10
) -> list[dict[str, Any]]:
    """TorchServe's describe API for model ``name`` (``suffix``: ``/all`` for every version,
    ``?customized=true`` for the handler's own output); [] unless it answers 200. Raises
    requests' errors, and ValueError for a body that is not JSON."""
    response = requests.get(
        f"{server.management_url()}/models/{name}{suffix}",
        headers=server.headers("management"),
        timeout=timeout,
    )
    return list(response.json()) if response.status_code == 200 else []


def handler_description(server: Server, name: str) -> dict[str, Any]:
    """The handler's describe output for model ``name`` (``{engine, model_family, settings}``)
    from the management API; {} when it cannot be read."""
    try:
        metadata = describe_model(server, name, "?customized=true")[0]["customizedMetadata"]
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
    except (OSError, ValueError, KeyError, IndexError, TypeError):  # requests' errors are OSErrors
        return {}
    return metadata if isinstance(metadata, dict) else {}


def model_workers(server: Server, name: str, timeout: float = 10) -> list[dict[str, Any]]:
    """Workers of model ``name`` from the describe API (status, pid, ...; [] if unknown yet)."""
    described = describe_model(server, name, timeout=timeout)
    return list(described[0].get("workers", [])) if described else []


def model_status(server: Server, name: str) -> list[str]:
    """Worker statuses of model ``name`` ([] if not registered yet)."""
    return [str(worker.get("status")) for worker in model_workers(server, name)]


def wait_ready(
    server: Server,
    names: Sequence[str],
    timeout: float = 300.0,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll until every worker of each model is READY; raise LaunchError with log lines."""
    deadline = time.monotonic() + timeout
    grace = time.monotonic() + 15  # the pid file appears a moment after --start returns
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise LaunchError(
                f"TorchServe exited with {process.returncode}\n{log_excerpt(server.log_dir)}"
            )
        if process is None and server.pid() is None and time.monotonic() > grace:
            raise LaunchError(f"TorchServe is not running\n{log_excerpt(server.log_dir)}")
        try:
            if all(all_ready(model_status(server, name)) for name in names):
                return
        except (requests.RequestException, ValueError, KeyError):
            pass
        failing = [name for name in names if load_failures(server.log_dir, name) >= GIVE_UP_AFTER]
        if failing:
            raise LaunchError(
                f"loading {failing} failed {GIVE_UP_AFTER} times\n{log_excerpt(server.log_dir)}"
            )
        if refused := setting_refused(server.log_dir):
            raise LaunchError(
                f"a worker refused its settings: {refused}\n{log_excerpt(server.log_dir)}"
            )
        if missing := import_failed(server.log_dir):
            raise LaunchError(
                f"the workers die at start: {missing} (their Python is TorchServe's; "
                f"install the package there)\n{log_excerpt(server.log_dir)}"
            )
        time.sleep(0.5)
    raise LaunchError(
        f"models {list(names)} not READY after {timeout:.0f} s\n{log_excerpt(server.log_dir)}"
    )


def all_ready(statuses: list[str]) -> bool:
    return bool(statuses) and all(status == "READY" for status in statuses)


def stop_web(server: Server, timeout: float = 10.0) -> bool:
    """Stop the web front end of this work folder; True if one was running."""
    pid = server.web_pid()
    if pid is None:
        return False
    terminate(pid, timeout)
    server.web_pid_path.unlink(missing_ok=True)
    return True


def stop(server: Server, timeout: float = 60.0) -> bool:
    """Stop the server of this work folder, then any of its workers left running and its
    shared engines (``share_engine``); True if the server was running."""
    if server.pid() is None:
        stop_workers(server.workdir / "tmp")
        stop_engines(server.workdir / "tmp")
        return False
    subprocess.run(
        [*torchserve_command(), "--stop", "--foreground"],
        cwd=server.workdir,
        env=server.environment(),
        timeout=timeout,
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    stop_workers(server.workdir / "tmp")
    stop_engines(server.workdir / "tmp")
    return True


def stop_workers(temp: Path, timeout: float = 10.0) -> int:
    """End the TorchServe workers of this work folder that outlived its front end.

    TorchServe 0.12.0 at times leaves a worker running after ``torchserve --stop``, its parent
    gone; in async mode with its engine child, which would hold a GPU's memory for good (seen
    after full CI runs, one worker each time, and with the refinement benchmark's test alone).
    Workers are known by their socket, which lies in the work folder's ``temp`` (found
    through ``/proc``: Linux only). Returns how many were ended."""
    prefix = str(temp / ".ts.sock.")
    ended = 0
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        worker = any(arg.endswith("model_service_worker.py") for arg in args)
        socket = next((b for a, b in itertools.pairwise(args) if a == "--sock-name"), "")
        if worker and socket.startswith(prefix) and int(entry.name) != os.getpid():
            print(f"hymt: a TorchServe worker outlived the server; ending it (pid {entry.name})")
            terminate(int(entry.name), timeout)
            ended += 1
    return ended
