"""The HTTP server around the app: uvicorn, with the bounds a hostile client needs and a drain.

- uvicorn's httptools protocol with the limits it lacks (header size and
  time, connection cap, send stalls: ``connection_guard.py``), its connection
  cap kept below the descriptor limit.
- :class:`DrainingServer`: on SIGTERM readiness and new work answer 503 at
  once while the listener stays open ``drain_seconds`` (load balancers and
  Kubernetes endpoints catch up), then uvicorn's graceful shutdown answers
  what was accepted. SIGINT (Ctrl-C) skips the drain: a person at a terminal
  has no balancer to wait for (orchestrators send SIGTERM; gunicorn and nginx
  also read INT as the quick stop), so an idle server exits at once and a busy
  one once what it accepted is answered. What is still running at the end of that grace window is
  answered 503 ``shutting_down`` with Retry-After by the engine (in its
  protocol's shape: the shipped nginx retries a 503 elsewhere, not uvicorn's
  plain 500), and the process exits 0 within ``shutdown_timeout`` whatever
  clients do. A second signal skips the drain.

  shutdown_timeout = drain + grace window + ``ANSWER_SECONDS`` (to send those
  503s) + ``LIFESPAN_SHUTDOWN_SECONDS`` (the app's own stop).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

from service.connection_guard import guarded_protocol
from service.engine import Engine
from service.errors import CannotStart
from service.settings import Settings

log = logging.getLogger(__name__)

# Descriptors kept free of client connections: model files, logs, onnxruntime, probes' spare.
RESERVED_FDS = 64
# Time left for the app's own shutdown (engine stop) out of shutdown_timeout.
LIFESPAN_SHUTDOWN_SECONDS = 2.0
# Time for requests cut at the end of the grace window to be answered 503 before uvicorn
# cancels what is left (with a plain 500).
ANSWER_SECONDS = 0.5
# The shortest grace window, whatever the settings.
MIN_GRACE_SECONDS = 0.5


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit where allowed; the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the file-descriptor limit from %d: %s", soft, exc)
    return soft


def connection_cap(settings: Settings, fd_limit: int) -> int:
    """Open connections allowed: the setting, kept below the descriptor limit."""
    return max(1, min(settings.max_connections, fd_limit - RESERVED_FDS))


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before its graceful shutdown, and exit status 0."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine
        self._drain_until: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Signals are not recorded for re-raising (uvicorn would re-raise SIGTERM after
        # shutdown, and the process would die of it instead of exiting 0).
        if self._drain_until is not None:  # a second signal: skip the rest of the drain
            self.should_exit = True
            if sig == signal.SIGINT:
                self.force_exit = True
            return
        settings = self.engine.settings
        # Ctrl-C: no balancer to wait for (what was accepted is still answered).
        drain = 0.0 if sig == signal.SIGINT else settings.drain_seconds
        log.info(
            "%s: draining for %g s, exiting within %g s",
            signal.Signals(sig).name,
            drain,
            settings.shutdown_timeout,
        )
        self.engine.begin_shutdown()
        self._drain_until = time.monotonic() + drain
        watchdog = threading.Timer(settings.shutdown_timeout, _exit_now)
        watchdog.daemon = True
        watchdog.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # The drain is over (or skipped; on_tick ended the body reads): uvicorn waits for
        # what was accepted up to the grace window plus ANSWER_SECONDS; what still waits
        # at the end of the grace window answers 503.
        asyncio.get_running_loop().call_later(
            grace_seconds(self.engine.settings), self.engine.end_work
        )
        await super().shutdown(sockets)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self.should_exit = True
        if self.should_exit:
            self.engine.end_body_reads()  # uvicorn's shutdown waits for what remains
        return await super().on_tick(counter)


def grace_seconds(settings: Settings) -> float:
    """After the drain: how long accepted work may run before it is answered 503."""
    return max(
        settings.shutdown_timeout
        - settings.drain_seconds
        - ANSWER_SECONDS
        - LIFESPAN_SHUTDOWN_SECONDS,
        MIN_GRACE_SECONDS,
    )


def _exit_now() -> None:
    """The last resort: shutdown_timeout passed and the process is still here."""
    log.error("shutdown timeout reached: exiting now")
    logging.shutdown()
    os._exit(0)


def warn_if_exposed(settings: Settings) -> None:
    """Warn when the API is reachable from other hosts with no API key."""
    if settings.api_key is not None:
        return
    try:
        loopback = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        loopback = settings.host == "localhost"
    if not loopback:
        log.warning(
            "listening on %s with no API key: anyone who can reach this address can use "
            "the API (set ATTNSERVE_API_KEY)",
            settings.host,
        )


def quiet_refusals(app: Any) -> Any:
    """``app`` whose failed start-up on :class:`CannotStart` (already logged in one line)
    is reported to uvicorn without the traceback Starlette attaches to it."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def quiet_send(message: dict[str, Any]) -> None:
            # Starlette sends it from its ``except`` block: the exception is the current one.
            if message["type"] == "lifespan.startup.failed" and isinstance(
                sys.exc_info()[1], CannotStart
            ):
                message = {**message, "message": ""}
            await send(message)

        await app(scope, receive, quiet_send)

    return wrapped


def build_server(settings: Settings, app: Any, engine: Engine) -> DrainingServer:
    fd_limit = raise_fd_limit()
    cap = connection_cap(settings, fd_limit)
    log.info(
        "accepts up to %d open connections at once (ATTNSERVE_MAX_CONNECTIONS; "
        "file-descriptor limit %d)",
        cap,
        fd_limit,
    )
    config = uvicorn.Config(
        quiet_refusals(app),
        host=settings.host,
        port=settings.port,
        http=guarded_protocol(settings, engine.metrics, cap),
        lifespan="on",
        log_config=None,  # service.logs configures every logger
        log_level=settings.log_level,
        timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
        timeout_graceful_shutdown=grace_seconds(settings) + ANSWER_SECONDS,  # type: ignore[arg-type]
    )
    return DrainingServer(config, engine)
