"""One engine process per GPU shared by several TorchServe workers (``share_engine: true``).

Why: a TorchServe worker spends milliseconds of CPU per request in its own Python (the socket
protocol, parsing, tokenising, rendering), so one worker process tops out at a few hundred
requests/s whatever the GPU could do (docs/performance.md). Several workers per GPU
(``minWorkers`` a multiple of the GPUs) spread that work over cores. With this setting they all
feed one engine process on their GPU, holding one copy of the weights in one continuous batch,
instead of each loading its own.

The meeting point is a folder per (model, GPU, settings) under the temporary folder (TorchServe
sets it to its work folder's ``tmp``), mode 0700. It holds the socket (under /tmp when the
folder's path is too long for one), a random key (0600), a lock file and the engine's pid:

1. A worker takes the lock and connects.
2. If nothing answers, it starts the engine process and waits for the socket. The engine runs in
   a session of its own, so it outlives the worker that started it.
3. The worker releases the lock.

The engine process loads the model before it listens, so a connection means it is ready. If it
fails to load, it writes the reason next to the socket and exits; the worker raises
ConfigurationError with it. It logs to ``engine.log`` in the folder, not to the worker's stdout:
the worker that started it may be gone, and a pipe that nobody reads would stall it. ``hymt
stop`` stops it after TorchServe; otherwise it exits once no worker has been connected for
``HYMT_SHARED_ENGINE_IDLE_S`` seconds (30).

The messages are the pipe's (:mod:`hymt_serve.engine.process.connection`), one connection per
worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from hymt_serve.core.errors import ConfigurationError
from hymt_serve.core.settings import Settings
from hymt_serve.engine.process.connection import serve_connection

logger = logging.getLogger(__name__)

IDLE_EXIT_ENV = "HYMT_SHARED_ENGINE_IDLE_S"


SOCKET_PATH_MAX = 100  # bytes; Linux allows 107 for a Unix socket's path


def engines_folder(temp: str | os.PathLike[str] | None = None) -> Path:
    """Where the shared engines of the temporary folder ``temp`` (default: this process's,
    which TorchServe sets to its work folder's ``tmp``) meet their workers."""
    return Path(temp or tempfile.gettempdir()) / f"hymt-engines-{os.getuid()}"


def meeting_folder(settings: Settings, gpu_id: int | None) -> Path:
    """The folder where the workers of one model on one GPU find their engine."""
    digest = hashlib.sha256(repr((str(settings.model_path), gpu_id, settings)).encode()).hexdigest()
    folder = engines_folder() / digest[:16]
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.parent.chmod(0o700)
    return folder


def socket_path(folder: Path) -> Path:
    """The engine's socket: in its folder, or under /tmp where that path would be too long
    for a Unix socket (a deep work folder); the key guards it either way."""
    inside = folder / "sock"
    if len(str(inside).encode()) <= SOCKET_PATH_MAX:
        return inside
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    return Path("/tmp") / f"hymt-engine-{os.getuid()}-{digest}.sock"


def stop_engines(temp: Path, timeout: float = 10.0) -> int:
    """Stop the shared engines of the temporary folder ``temp`` (``hymt stop``, after
    TorchServe has stopped: they would otherwise hold the GPU for their idle time). Returns
    how many were running."""
    stopped = 0
    for pid_file in engines_folder(temp).glob("*/pid"):
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):  # gone already, or a file being written
            continue
        stopped += 1
        terminate(pid, timeout, signalled=True)
        pid_file.unlink(missing_ok=True)
    return stopped


def terminate(pid: int, timeout: float, *, signalled: bool = False) -> None:
    """SIGTERM ``pid`` (unless ``signalled`` already), and SIGKILL it after ``timeout`` s."""
    with contextlib.suppress(OSError):
        if not signalled:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def exists(pid: int) -> bool:
    """Whether process ``pid`` exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def running(pid: int) -> bool:
    """Alive and not a zombie (a child its parent has not waited for yet)."""
    if not exists(pid):
        return False
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    return True


def connect(
    settings: Settings, gpu_id: int | None, max_waiting: int, start_timeout: float
) -> tuple[Connection, Any]:
    """A connection to the shared engine (started here if none runs) and its first message
    (``Ready``, whose ``facts`` carry the engine process's ``pid``)."""
    folder = meeting_folder(settings, gpu_id)
    with _locked(folder / "lock"):
        conn = _try_connect(folder)
        if conn is None:
            _start(folder, (settings, gpu_id, max_waiting), start_timeout)
            conn = _try_connect(folder)
        if conn is None:
            raise ConfigurationError(f"the shared engine at {socket_path(folder)} does not answer")
    return conn, conn.recv()


def hang_up(conn: Connection) -> None:
    """Close ``conn`` so that both ends see it at once. A plain close does not wake a thread
    of this process blocked reading it, so the engine would never learn this worker left."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(conn.fileno())) as duplicate:
        duplicate.shutdown(socket.SHUT_RDWR)
    conn.close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # others wait while one engine loads
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _key(folder: Path) -> bytes:
    path = folder / "key"
    if not path.is_file():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(secrets.token_bytes(32))
    return path.read_bytes()


def _try_connect(folder: Path) -> Connection | None:
    address = socket_path(folder)
    if not address.exists():
        return None
    try:
        return Client(str(address), family="AF_UNIX", authkey=_key(folder))
    except (OSError, EOFError):  # a socket left by an engine that is gone
        return None


def _start(folder: Path, arguments: tuple[Any, ...], timeout: float) -> None:
    """Start the engine process and wait until it listens (ConfigurationError if it fails)."""
    _key(folder)
    (folder / "failed").unlink(missing_ok=True)
    socket_path(folder).unlink(missing_ok=True)
    with (folder / "engine.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "hymt_serve.engine.process.shared", str(folder)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # the worker's import path: TorchServe puts the archive's folder on sys.path only
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
    assert process.stdin is not None
    with process.stdin:
        pickle.dump(arguments, process.stdin)
    deadline = time.monotonic() + timeout
    while not socket_path(folder).exists():
        failed = folder / "failed"
        if failed.is_file():
            process.wait(30)
            raise ConfigurationError(f"the engine process failed to load: {failed.read_text()}")
        if process.poll() is not None:
            raise ConfigurationError(
                f"the engine process exited with {process.returncode} while loading "
                f"(its log: {folder / 'engine.log'})"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise ConfigurationError(f"the engine process did not start in {timeout} s")
        time.sleep(0.1)
    # It outlives this worker if need be; while this worker lives, it reaps it when it ends.
    threading.Thread(target=process.wait, name="hymt-engine-reaper", daemon=True).start()


class _Workers:
    """How many workers are connected; ends the process once none has been for a while."""

    def __init__(self, idle_exit_s: float, folder: Path) -> None:
        self._count = 0
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self._idle_exit_s = idle_exit_s
        self._folder = folder
        threading.Thread(target=self._watch, name="hymt-engine-idle", daemon=True).start()

    def change(self, step: int) -> None:
        with self._lock:
            self._count += step
            self._since = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self._idle_exit_s))
            with self._lock:
                idle = self._count == 0 and time.monotonic() - self._since > self._idle_exit_s
                if idle:
                    logger.info("no worker connected for %.0f s: exiting", self._idle_exit_s)
                    socket_path(self._folder).unlink(missing_ok=True)
                    (self._folder / "pid").unlink(missing_ok=True)
                    os._exit(0)


def serve(folder: Path) -> None:
    """The engine process: load, listen, serve each worker's connection on a thread."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="engine %(levelname)s %(name)s: %(message)s"
    )
    # Imported here, in the engine process: the workers import this module without the model code.
    from hymt_serve.engine.engine import load_engine

    settings, gpu_id, max_waiting = pickle.load(sys.stdin.buffer)
    try:
        engine = load_engine(settings, gpu_id, max_waiting=max_waiting, decode=False)
        engine.start()
    except Exception as error:
        logger.exception("the engine failed to load")
        (folder / "failed").write_text(f"{type(error).__name__}: {error}")
        return
    address = socket_path(folder)
    listener = Listener(str(address), family="AF_UNIX", authkey=_key(folder))
    workers = _Workers(float(os.environ.get(IDLE_EXIT_ENV, "30")), folder)
    (folder / "pid").write_text(str(os.getpid()))
    logger.info("shared engine ready (pid %d) at %s", os.getpid(), address)
    while True:
        try:
            conn = listener.accept()
        except (OSError, EOFError) as error:  # a client that failed the key, or went away
            logger.warning("refused a connection: %s", error)
            continue
        workers.change(+1)
        threading.Thread(
            target=_serve_worker, args=(conn, engine, workers), name="hymt-worker", daemon=True
        ).start()


def _serve_worker(conn: Connection, engine: Any, workers: _Workers) -> None:
    try:
        serve_connection(conn, engine)
    finally:
        workers.change(-1)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
