"""uvicorn's httptools protocol with the bounds a hostile client needs, one concern each.

- :class:`ConnectionCap`: at most ``max_connections`` open (kept below the
  descriptor limit); beyond it a new connection is closed at once, with a
  warning at most every ``WARN_EVERY_SECONDS``.
- :class:`HeaderBounds`: request line + headers under ``max_header_bytes`` and
  ``max_headers`` (431, whether they arrive in one write or trickle in); a
  request's headers must arrive within ``header_timeout`` (408, or a silent
  connection closed); malformed HTTP is 400, answered after the requests
  pipelined before it; the rest of a body answered early must end in time too.
- :class:`SendStall`: a client that stops reading its answer is dropped after
  ``send_timeout`` (its answer freed), and an answer cut on its way is marked so
  the request counts as 499, not as the status it meant to send.

:func:`guarded_protocol` binds them to the settings for ``uvicorn.Config(http=...)``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.asgi_keys import ANSWER_CUT
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger(__name__)

# At most one "connection cap reached" warning per this many seconds.
WARN_EVERY_SECONDS = 10.0

Refusal = tuple[int, str, str]  # status, reason, message


@dataclass(frozen=True)
class Bounds:
    settings: Settings
    metrics: Metrics
    max_connections: int


def raw_response(status: int, reason: str, message: str) -> bytes:
    """A whole plain-text answer that closes the connection (for refusals below the app)."""
    body = message.encode("ascii")
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode("ascii") + body


class HeadersTooLarge(Exception):
    """Raised inside a parser callback to stop parsing headers over the bound."""


class GuardBase(HttpToolsProtocol):
    """What the guards share: their bounds, and a refusal that closes the connection."""

    bounds: Bounds  # set by guarded_protocol
    _header_timer: asyncio.TimerHandle | None

    def _reject(self, status: int, reason: str, message: str) -> None:
        self._stop_header_timer()
        self.transport.write(raw_response(status, reason, message))
        self.transport.close()

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None


class ConnectionCap(GuardBase):
    last_warning = 0.0  # class-wide: one warning per WARN_EVERY_SECONDS

    def _over_cap(self, transport: asyncio.Transport) -> bool:
        """Close ``transport`` at once if the cap is reached (and say so, now and then)."""
        cap = self.bounds.max_connections
        if len(self.server_state.connections) < cap:
            return False
        self.transport = transport
        transport.abort()
        self.bounds.metrics.refusals.labels("connections").inc()
        now = time.monotonic()
        if now - ConnectionCap.last_warning > WARN_EVERY_SECONDS:
            ConnectionCap.last_warning = now
            log.warning(
                "connection cap reached (%d open): closing new connections "
                "(ATTNSERVE_MAX_CONNECTIONS, file-descriptor limit)",
                cap,
            )
        return True


class SendStall(GuardBase):
    _stall_timer: asyncio.TimerHandle | None

    def pause_writing(self) -> None:
        """The client is not reading as fast as we answer: it has send_timeout to
        make room again, or the connection is dropped (and the answer freed)."""
        super().pause_writing()
        self._stop_stall_timer()
        self._stall_timer = self.loop.call_later(
            self.bounds.settings.send_timeout, self._send_stalled
        )

    def resume_writing(self) -> None:
        self._stop_stall_timer()
        super().resume_writing()

    def _stop_stall_timer(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _send_stalled(self) -> None:
        self._stall_timer = None
        self.bounds.metrics.refusals.labels("send_timeout").inc()
        log.info(
            "dropping a connection that read nothing for %g s", self.bounds.settings.send_timeout
        )
        self.transport.abort()

    def _mark_cut_answer(self) -> None:
        """Whatever status the app sends now, nobody receives it: the request metrics
        count it as cut (499), not as the status it meant to send."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.scope[ANSWER_CUT] = True  # type: ignore[literal-required]


class HeaderBounds(GuardBase):
    _oversize: bool  # the parser stopped at headers over the bound
    _refusal_after_answer: Refusal | None  # malformed input after a pipelined request

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
            self.bounds.settings.header_timeout, self._headers_too_slow
        )

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            self.bounds.metrics.refusals.labels("header_timeout").inc()
            if self._header_bytes:  # a request began: tell it why
                self._reject(408, "Request Timeout", "headers not received in time")
            else:  # silent since connecting or since its last answer
                self.transport.close()

    def _count_arrived(self, data: bytes) -> None:
        if self._in_headers:
            if self._header_timer is None:
                self._start_header_timer()
            self._header_bytes += len(data)

    def _refuse_if_arrived_too_much(self) -> None:
        """Headers still incomplete after more than the bound arrived: 431 now."""
        if (
            self._in_headers
            and self._header_bytes > self.bounds.settings.max_header_bytes
            and self._refusal_after_answer is None
            and not self.transport.is_closing()
        ):
            self.bounds.metrics.refusals.labels("headers_too_large").inc()
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
        if self._header_size > self.bounds.settings.max_header_bytes:
            self._oversize = True
            raise HeadersTooLarge

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._stop_header_timer()
        if self._header_lines > self.bounds.settings.max_headers:
            self.bounds.metrics.refusals.labels("headers_too_large").inc()
            app, self.app = self.app, _too_many_headers
            try:
                super().on_headers_complete()
            finally:
                self.app = app
            return
        super().on_headers_complete()

    def _after_answer(self) -> None:
        """An answer is complete: a refusal waiting for it goes out; the rest of a body
        answered early must end in time; else the next request may begin."""
        if self._refusal_after_answer is not None and self.cycle.response_complete:
            self._reject(*self._refusal_after_answer)
        elif self.cycle.more_body:
            # Answered before its body arrived (an early 413/415): the rest is still
            # this request's body, read and dropped, and it must end in time too.
            self._stop_header_timer()
            self._header_timer = self.loop.call_later(
                self.bounds.settings.header_timeout, self._leftover_too_slow
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
        refusal: Refusal
        if self._oversize:
            self.bounds.metrics.refusals.labels("headers_too_large").inc()
            refusal = (431, "Request Header Fields Too Large", self._too_large_message())
        else:
            self.bounds.metrics.refusals.labels("bad_http").inc()
            refusal = (400, "Bad Request", msg)
        if self.cycle is not None and not self.cycle.response_complete:
            self._refusal_after_answer = refusal
            self.flow.pause_reading()
            return
        self._reject(*refusal)

    def _too_large_message(self) -> str:
        return f"request line and headers exceed {self.bounds.settings.max_header_bytes} bytes"


class GuardedProtocol(ConnectionCap, SendStall, HeaderBounds):
    """The guards wired into uvicorn's connection events."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer = None
        self._stall_timer = None
        self._oversize = False
        self._refusal_after_answer = None
        self._refused = self._over_cap(transport)
        if self._refused:
            return
        super().connection_made(transport)
        self._await_headers()
        self._start_header_timer()  # a new connection must not stay silent

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        self._stop_stall_timer()
        self._mark_cut_answer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._count_arrived(data)
        super().data_received(data)
        self._refuse_if_arrived_too_much()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._after_answer()


def guarded_protocol(settings: Settings, metrics: Metrics, max_connections: int) -> type[Any]:
    """The protocol class for ``uvicorn.Config(http=...)``, bound to these bounds."""
    bounds = Bounds(settings, metrics, max_connections)
    return type("GuardedProtocol", (GuardedProtocol,), {"bounds": bounds})


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
