"""The HTTP server around the app: uvicorn, with the bounds a hostile client needs and a drain.

- :func:`guarded_protocol`: uvicorn's httptools protocol with the limits it
  lacks: request line + headers under ``max_header_bytes`` and
  ``max_headers`` (431), a connection must send its headers within
  ``header_timeout`` (a silent or trickling one is closed), at most
  ``max_connections`` open (kept below the descriptor limit; beyond it new
  ones are closed at once, with a warning), a client that stops reading its
  answer is dropped after ``send_timeout``, and malformed HTTP counted.
- :class:`DrainingServer`: on SIGTERM (or SIGINT) readiness and new work answer
  503 at once while the listener stays open ``drain_seconds`` (load balancers
  and Kubernetes endpoints catch up), then uvicorn's graceful shutdown answers
  what was accepted, and the process exits 0 within ``shutdown_timeout``
  whatever clients do. A second signal skips the drain.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import resource
import signal
import threading
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.engine import Engine
from service.metrics import Metrics
from service.protocols.context import ANSWER_CUT
from service.settings import Settings

log = logging.getLogger(__name__)

# Descriptors kept free of client connections: model files, logs, onnxruntime, probes' spare.
RESERVED_FDS = 64
# At most one "connection cap reached" warning per this many seconds.
WARN_EVERY_SECONDS = 10.0
# Time left for the app's own shutdown (engine stop) out of shutdown_timeout.
LIFESPAN_SHUTDOWN_SECONDS = 2.0


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


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = message.encode("ascii")
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode("ascii") + body


def guarded_protocol(settings: Settings, metrics: Metrics, max_connections: int) -> type[Any]:
    """uvicorn's httptools protocol class with header, idle and connection bounds."""

    class GuardedProtocol(HttpToolsProtocol):
        last_warning = 0.0  # class-wide: one warning per WARN_EVERY_SECONDS

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._header_timer: asyncio.TimerHandle | None = None
            self._stall_timer: asyncio.TimerHandle | None = None
            self._oversize = False  # the parser stopped at headers over the bound
            self._refusal_after_answer: tuple[int, str, str] | None = None
            self._refused = len(self.server_state.connections) >= max_connections
            if self._refused:
                self.transport = transport
                transport.abort()
                metrics.refusals.labels("connections").inc()
                now = time.monotonic()
                if now - GuardedProtocol.last_warning > WARN_EVERY_SECONDS:
                    GuardedProtocol.last_warning = now
                    log.warning(
                        "connection cap reached (%d open): closing new connections "
                        "(ATTNSERVE_MAX_CONNECTIONS, file-descriptor limit)",
                        max_connections,
                    )
                return
            super().connection_made(transport)
            self._await_headers()
            self._start_header_timer()  # a new connection must not stay silent

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_timer()
            self._stop_stall_timer()
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                # Whatever status the app sends now, nobody receives it: the request
                # metrics count it as cut (499), not as the status it meant to send.
                cycle.scope[ANSWER_CUT] = True  # type: ignore[literal-required]
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            """The client is not reading as fast as we answer: it has send_timeout to
            make room again, or the connection is dropped (and the answer freed)."""
            super().pause_writing()
            self._stop_stall_timer()
            self._stall_timer = self.loop.call_later(settings.send_timeout, self._send_stalled)

        def resume_writing(self) -> None:
            self._stop_stall_timer()
            super().resume_writing()

        def _stop_stall_timer(self) -> None:
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None

        def _send_stalled(self) -> None:
            self._stall_timer = None
            metrics.refusals.labels("send_timeout").inc()
            log.info("dropping a connection that read nothing for %g s", settings.send_timeout)
            self.transport.abort()

        def _await_headers(self) -> None:
            """A new request may begin: its line and headers must come in time and size
            (the timer starts at its first byte; until then the keep-alive timer rules)."""
            self._header_bytes = 0  # bytes received while the headers were incomplete
            self._header_size = 0  # the parsed request line's URL and header fields
            self._header_lines = 0
            self._in_headers = True
            self._stop_header_timer()

        def _start_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(
                settings.header_timeout, self._headers_too_slow
            )

        def _stop_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self._in_headers and not self.transport.is_closing():
                metrics.refusals.labels("header_timeout").inc()
                if self._header_bytes:  # a request began: tell it why
                    self._reject(408, "Request Timeout", "headers not received in time")
                else:  # silent since connecting or since its last answer
                    self.transport.close()

        def _reject(self, status: int, reason: str, message: str) -> None:
            self._stop_header_timer()
            self.transport.write(_raw_response(status, reason, message))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._in_headers:
                if self._header_timer is None:
                    self._start_header_timer()
                self._header_bytes += len(data)
            super().data_received(data)
            if (
                self._in_headers
                and self._header_bytes > settings.max_header_bytes
                and self._refusal_after_answer is None
                and not self.transport.is_closing()
            ):
                metrics.refusals.labels("headers_too_large").inc()
                self._reject(431, "Request Header Fields Too Large", self._too_large_message())

        def on_url(self, url: bytes) -> None:
            self._count_header_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_lines += 1
            self._count_header_bytes(len(name) + len(value) + 4)  # ": " and CRLF
            super().on_header(name, value)

        def _count_header_bytes(self, size: int) -> None:
            """Bound what was parsed, not only what arrived before the headers ended: a
            whole header block (or a request line) over the bound in one write is
            refused too. The parser stops at the exception; send_400_response says 431."""
            self._header_size += size
            if self._header_size > settings.max_header_bytes:
                self._oversize = True
                raise HeadersTooLarge

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._stop_header_timer()
            if self._header_lines > settings.max_headers:
                metrics.refusals.labels("headers_too_large").inc()
                app, self.app = self.app, _too_many_headers
                try:
                    super().on_headers_complete()
                finally:
                    self.app = app
                return
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self._refusal_after_answer is not None and self.cycle.response_complete:
                self._reject(*self._refusal_after_answer)
                return
            if self.cycle.more_body:
                # Answered before its body arrived (an early 413/415): the rest is still
                # this request's body, read and dropped, and it must end in time too.
                self._stop_header_timer()
                self._header_timer = self.loop.call_later(
                    settings.header_timeout, self._leftover_too_slow
                )
            else:
                self._await_headers()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            if self.cycle.response_complete and not self.transport.is_closing():
                self._await_headers()  # the leftover body of an early answer has ended

        def _leftover_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """Malformed HTTP (or headers over the bound: 431), answered once the requests
            before it on this connection have been (a good request pipelined before
            garbage still gets its answer)."""
            self._stop_header_timer()
            if self._oversize:
                metrics.refusals.labels("headers_too_large").inc()
                refusal = (431, "Request Header Fields Too Large", self._too_large_message())
            else:
                metrics.refusals.labels("bad_http").inc()
                refusal = (400, "Bad Request", msg)
            if self.cycle is not None and not self.cycle.response_complete:
                self._refusal_after_answer = refusal
                self.flow.pause_reading()
                return
            self._reject(*refusal)

        def _too_large_message(self) -> str:
            return f"request line and headers exceed {settings.max_header_bytes} bytes"

    return GuardedProtocol


class HeadersTooLarge(Exception):
    """Raised inside a parser callback to stop parsing headers over the bound."""


async def _too_many_headers(scope: Any, receive: Any, send: Any) -> None:
    body = b"too many header lines"
    await send(
        {
            "type": "http.response.start",
            "status": 431,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


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
        log.info(
            "%s: draining for %g s, exiting within %g s",
            signal.Signals(sig).name,
            settings.drain_seconds,
            settings.shutdown_timeout,
        )
        self.engine.begin_shutdown()
        self._drain_until = time.monotonic() + settings.drain_seconds
        watchdog = threading.Timer(settings.shutdown_timeout, _exit_now)
        watchdog.daemon = True
        watchdog.start()

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self.should_exit = True
        if self.should_exit and not self.engine.closing:
            self.engine.end_body_reads()  # uvicorn's shutdown waits for what remains
        return await super().on_tick(counter)


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


def build_server(settings: Settings, app: Any, engine: Engine) -> DrainingServer:
    fd_limit = raise_fd_limit()
    cap = connection_cap(settings, fd_limit)
    log.info("file-descriptor limit %d: at most %d open connections", fd_limit, cap)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=guarded_protocol(settings, engine.metrics, cap),
        lifespan="on",
        log_config=None,  # service.logs configures every logger
        log_level=settings.log_level,
        timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
        timeout_graceful_shutdown=max(  # type: ignore[arg-type]
            settings.shutdown_timeout - settings.drain_seconds - LIFESPAN_SHUTDOWN_SECONDS,
            0.5,
        ),
    )
    return DrainingServer(config, engine)
