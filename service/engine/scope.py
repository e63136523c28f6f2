"""A request's life in the engine, whatever protocol carried it.

A protocol turns what its transport says about a request (HTTP headers, gRPC
metadata) into a :class:`Caller` and opens a :class:`RequestScope` with
:meth:`Engine.request <service.engine.engine.Engine.request>`. The scope
holds the request id (the client's, if it is sane), its arrival and deadline,
how to learn that the caller has gone (``cancelled``), its admission ticket,
its timings and its metrics labels. ``enter(access)`` applies the engine's
rules in one order (API key, deadline, admission); ``close()`` gives
everything back and counts the request (its route and status, as the protocol
set them), once, on every exit path.
"""

from __future__ import annotations

import contextvars
import enum
import logging
import math
import re
import secrets
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.engine.admission import Ticket
from service.errors import InvalidHeader, Unauthorized, quoted
from service.timing import RunTiming

if TYPE_CHECKING:
    from service.engine.engine import Engine

# A client's own request id is kept if it is short, visible ASCII; else one is made.
REQUEST_ID = re.compile(r"[!-~]{1,128}")
# The asked timeout, at most (ATTNSERVE_REQUEST_TIMEOUT caps it anyway).
MAX_ASKED_TIMEOUT = 86400.0
# Status counted for a request whose caller left before its answer arrived.
CLIENT_CLOSED = 499

# The id of the request being served, carried by every log record (service/logs.py).
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
log = logging.getLogger(__name__)

# A coroutine factory: its coroutine returns once the caller has gone away.
Disconnected = Callable[[], Coroutine[Any, Any, None]]


class Access(enum.Enum):
    """What a route needs before it runs."""

    OPEN = "open"  # health, metrics, server metadata: anyone, even while not ready
    GUARDED = "guarded"  # model metadata: the API key, when the server has one
    WORK = "work"  # inference: the API key, a valid deadline and an admission ticket
    ADMIN = "admin"  # the model repository API: an admin key (ATTNSERVE_ADMIN_KEYS)


@dataclass(frozen=True)
class Caller:
    """What the transport says about a request, as the client sent it (unchecked)."""

    protocol: str  # "http", "grpc": a metrics label
    request_id: str | None = None  # the client's own id (X-Request-Id, metadata)
    authorization: str | None = None  # "Bearer <key>"
    timeout: str | None = None  # seconds the client will wait (X-Request-Timeout)
    traceparent: str | None = None  # W3C trace context of the caller's span
    tracestate: str | None = None
    arrival: float = field(default_factory=time.monotonic)


class RequestScope:
    """One request from arrival to its last byte sent: see the module docstring."""

    def __init__(self, engine: Engine, caller: Caller) -> None:
        self._engine = engine
        self.caller = caller
        given = caller.request_id or ""
        self.request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        self.arrival = caller.arrival
        self.deadline: float | None = None  # time.monotonic(), set by enter(WORK)
        self.ticket: Ticket | None = None
        self.cancelled: Disconnected | None = None  # set by the transport, if it can tell
        self.timing = RunTiming()
        self.protocol = caller.protocol  # the transport, until a protocol names itself
        self.model: str | None = None  # the model that answered, once known
        self.model_version: str | None = None
        self.cache: str | None = None  # "hit" or "miss" when the response cache is on
        # Set by the protocol as the request goes: what close() counts it as.
        self.route = "unmatched"  # the route template (/v1/models/{name}) or gRPC method
        self.status = CLIENT_CLOSED  # until an answer starts: a caller gone
        self.cut = False  # the answer started but never arrived whole
        self.closed = False
        self._log_token = request_id_var.set(self.request_id)
        self.span = engine.tracing.start(caller.traceparent, caller.tracestate, self.arrival)

    def served(self, model: str, version: str) -> None:
        """The model (and version) answering this request."""
        self.model, self.model_version = model, version

    def enter(self, access: Access) -> None:
        """Apply the engine's rules for ``access``: 401, 400 (timeout), 503 (not ready)."""
        if access is Access.OPEN:
            return
        if access is Access.ADMIN:
            self._authorize_admin()
            return
        self._authorize()
        if access is Access.WORK:
            self.deadline = self._engine.deadline(self.arrival, asked_timeout(self.caller.timeout))
            self.ticket = self._engine.ticket()

    def admitted(self) -> Ticket:
        """The ticket of a WORK request (entered before the protocol reads its body)."""
        if self.ticket is None:
            raise RuntimeError("the request scope was not entered for work")
        return self.ticket

    def _authorize(self) -> None:
        keys = self._engine.settings.api_key_list
        if not keys:
            return
        scheme, _, token = (self.caller.authorization or "").partition(" ")
        # Bytes, not str: compare_digest refuses non-ASCII str; headers may carry any byte.
        given = token.strip().encode("utf-8", "surrogateescape")
        matches = [secrets.compare_digest(given, key.encode()) for key in keys]  # each one
        if scheme.lower() != "bearer" or not any(matches):
            raise Unauthorized(
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def _authorize_admin(self) -> None:
        """Admin keys when set; with only an inference key set, nobody: a key that may
        run the model may not replace it."""
        settings = self._engine.settings
        keys = settings.admin_key_list
        if not keys:
            if settings.api_key is None:
                return  # no keys at all: the repository API is as open as the rest
            raise Unauthorized(
                "the model repository API needs an admin key, and this server has none "
                "(ATTNSERVE_ADMIN_KEYS): inference keys cannot manage models",
                headers={"WWW-Authenticate": "Bearer"},
            )
        scheme, _, token = (self.caller.authorization or "").partition(" ")
        given = token.strip().encode("utf-8", "surrogateescape")
        matches = [secrets.compare_digest(given, key.encode()) for key in keys]
        if scheme.lower() != "bearer" or not any(matches):
            raise Unauthorized(
                "missing or wrong admin key: send 'Authorization: Bearer <admin key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def close(self) -> None:
        """Release the ticket and count the request (by protocol, route template and
        status). Only the first call counts. An answer cut on its way (the caller left
        or stopped reading) counts as 499."""
        if self.closed:
            return
        self.closed = True
        if self.ticket is not None:
            self.ticket.release()
        route, status = self.route, self.status
        if self.cut and status != CLIENT_CLOSED:
            log.info(
                "%s: the %d answer was cut (the client left or stopped reading)", route, status
            )
            status = CLIENT_CLOSED
        elif status == CLIENT_CLOSED:
            log.info("%s: the client closed the connection", route)
        if self.span is not None:
            attributes: dict[str, str | int] = {
                "attnserve.protocol": self.protocol,
                "attnserve.transport": self.caller.protocol,
                "attnserve.route": route,
                "attnserve.status": status,
                "attnserve.request_id": self.request_id,
            }
            if self.model is not None and self.model_version is not None:
                attributes |= {"attnserve.model": self.model}
                attributes |= {"attnserve.model_version": self.model_version}
            if self.cache is not None:
                attributes["attnserve.cache"] = self.cache
            self._engine.tracing.finish(self.span, self.timing, attributes, status)
        metrics = self._engine.metrics
        metrics.requests.labels(self.protocol, route, str(status)).inc()
        metrics.latency.labels(self.protocol, route).observe(time.monotonic() - self.arrival)
        try:
            request_id_var.reset(self._log_token)
        except ValueError:  # closed from another context than it was opened in
            request_id_var.set("-")


def asked_timeout(raw: str | None) -> float | None:
    """The client's timeout in seconds (400 unless a positive number up to a day)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_ASKED_TIMEOUT:
        raise InvalidHeader(
            f"X-Request-Timeout must be seconds in (0, {MAX_ASKED_TIMEOUT:g}], got {quoted(raw)}"
        )
    return value
