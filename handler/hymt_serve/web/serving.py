"""Serving the front end's app (``hymt web``): uvicorn, one process, one event loop.

Why an event loop and not threads: a translation is streamed for seconds, and a thread per open
stream (as a WSGI server gives) caps the streams at its thread count and pays a stack each.
Here an open stream is a coroutine and two sockets (its client's, TorchServe's). Threads serve
only the blocking steps, ``threads`` of them at most: reading TorchServe's key and config files
when they changed, language detection.

On SIGTERM (``hymt stop``, Kubernetes) uvicorn stops accepting connections, lets the requests in
progress finish for up to ``SHUTDOWN_GRACE_S`` (streams included), then cancels the rest and
runs the app's shutdown.
"""

from __future__ import annotations

import resource

import anyio.to_thread
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

# Under hymt stop's 10 s before it kills: the requests in progress finish, or are cut, first.
SHUTDOWN_GRACE_S = 8


def serve(app: ASGIApp, host: str, port: int, threads: int) -> None:
    """Serve ``app`` on ``host``:``port`` until SIGTERM or SIGINT."""
    _more_open_files()
    config = uvicorn.Config(
        ThreadLimit(app, threads),
        host=host,
        port=port,
        lifespan="on",
        # A request line may carry user text or a key (DeepL accepts both as query fields).
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    uvicorn.Server(config).run()


def _more_open_files() -> None:
    """Each open stream holds two sockets (its client's and TorchServe's): the soft limit on
    open files (often 1,024) goes up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class ThreadLimit:
    """ASGI wrapper: at the lifespan's start, the event loop's worker threads for blocking
    work (anyio's default limiter, 40 otherwise) become ``threads``."""

    def __init__(self, app: ASGIApp, threads: int) -> None:
        self.app, self.threads = app, threads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            anyio.to_thread.current_default_thread_limiter().total_tokens = self.threads
        await self.app(scope, receive, send)
