"""Per-request context every protocol shares: id, arrival, timings, metrics, logs.

One pure-ASGI middleware (no per-request task) gives each HTTP request a
:class:`RequestContext` in its scope, puts its id in a context variable the
log records carry, and on the way out adds ``x-request-id``,
``x-queue-time`` and ``x-compute-time`` to every response and counts it by
route template and status (499 for a client that went away, never 500).
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.batcher import RunTiming
from service.metrics import Metrics

SCOPE_KEY = "attnserve.context"
# Set in the scope by the server when the connection is lost before the answer was
# complete (a client gone, or dropped at the send timeout): the answer never arrived.
ANSWER_CUT = "attnserve.answer_cut"
# A client's own request id is kept if it is short, visible ASCII; else one is made.
REQUEST_ID = re.compile(r"[!-~]{1,128}")
# Status recorded for a request whose client left before any answer was sent.
CLIENT_CLOSED = 499

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
log = logging.getLogger(__name__)


@dataclass
class RequestContext:
    request_id: str
    arrival: float = field(default_factory=time.monotonic)  # time.monotonic()
    timing: RunTiming = field(default_factory=RunTiming)


def context_of(request: Request) -> RequestContext:
    """The request's context (made on the spot when no middleware is in front)."""
    context = request.scope.get(SCOPE_KEY)
    if context is None:
        context = request.scope[SCOPE_KEY] = RequestContext(uuid.uuid4().hex)
    assert isinstance(context, RequestContext)
    return context


class RequestContextMiddleware:
    """Request id, timing headers and request metrics for every HTTP request."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        context = RequestContext(given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex)
        scope[SCOPE_KEY] = context
        token = request_id_var.set(context.request_id)
        status = CLIENT_CLOSED

        async def send_with_context(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                timing = context.timing
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", context.request_id.encode()),
                    (b"x-queue-time", f"{timing.queue:.6f}".encode()),
                    (b"x-compute-time", f"{timing.compute:.6f}".encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_context)
        except Exception:
            status = 500
            raise
        finally:
            # The router records the matched route in the scope: label by its template
            # (/v1/models/{name}), so labels stay few whatever paths clients send.
            route = getattr(scope.get("route"), "path", "unmatched")
            if scope.get(ANSWER_CUT) and status != CLIENT_CLOSED:
                log.info(
                    "%s %s: the %d answer was cut (the client left or stopped reading)",
                    scope["method"],
                    route,
                    status,
                )
                status = CLIENT_CLOSED
            elif status == CLIENT_CLOSED:
                log.info("%s %s: the client closed the connection", scope["method"], route)
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.monotonic() - context.arrival)
            request_id_var.reset(token)
