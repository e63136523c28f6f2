"""Every HTTP request's engine scope, opened and closed by one pure-ASGI middleware.

The middleware (no per-request task) turns the headers into a
:class:`~service.engine.scope.Caller`, opens the request's
:class:`~service.engine.scope.RequestScope` and keeps it in the ASGI scope; on
the way out it adds ``x-request-id``, ``x-model-version`` (of the model that
answered), ``x-cache`` (``hit``/``miss``, with the response cache on),
``x-queue-time`` and ``x-compute-time`` (seconds; unless the route sent its
own) to the response, and closes the scope once the last byte is sent (or the
request failed), labelled by route template and status: 499 for a client that
went away or stopped reading, never 500. Routes enter the scope with their
access (``http.protocol_route``); nothing else here is a rule of the engine.

An exception no handler knows (a bug of ours) is logged here, inside the scope
(its line carries the request id), and answered with ``unexpected`` (a whole
500) before any answer started: the request ends normally, so the keep-alive
connection stays usable. Left to Starlette's outermost handler, it is re-raised
after the answer and uvicorn closes the connection under the client's next
request. Once an answer has started, it is re-raised: uvicorn cuts that
connection, the only way to tell the client that answer is incomplete.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.asgi_keys import ANSWER_CUT
from service.engine import Engine
from service.engine.scope import Caller, RequestScope

SCOPE_KEY = "attnserve.scope"

log = logging.getLogger(__name__)


def scope_of(request: Request) -> RequestScope:
    """The request's engine scope (the middleware opened it)."""
    scope = request.scope[SCOPE_KEY]
    assert isinstance(scope, RequestScope)
    return scope


def caller(headers: list[tuple[bytes, bytes]]) -> Caller:
    """What the HTTP headers say about a request."""

    def header(name: bytes) -> str | None:
        for key, value in headers:
            if key == name:
                return value.decode("latin-1")
        return None

    return Caller(
        protocol="http",
        request_id=header(b"x-request-id"),
        authorization=header(b"authorization"),
        timeout=header(b"x-request-timeout"),
        traceparent=header(b"traceparent"),
        tracestate=header(b"tracestate"),
    )


class RequestScopeMiddleware:
    """Opens and closes the engine's scope of every HTTP request."""

    def __init__(self, app: ASGIApp, engine: Engine, unexpected: ASGIApp) -> None:
        """``unexpected``: the 500 answered for an exception no handler knows."""
        self.app, self.engine, self.unexpected = app, engine, unexpected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.engine.request(caller(scope["headers"])) as request_scope:
            scope[SCOPE_KEY] = request_scope

            started = False

            async def send_with_scope(message: Message) -> None:
                nonlocal started
                if message["type"] == "http.response.start":
                    started = True
                    request_scope.status = message["status"]
                    message["headers"] = _with_scope_headers(request_scope, message)
                await send(message)

            try:
                await self.app(scope, receive, send_with_scope)
            except Exception:
                if started:
                    raise
                log.exception("unexpected error: answered 500")
                await self.unexpected(scope, receive, send_with_scope)
            finally:
                # The router records the matched route in the scope: label by its template
                # (/v1/models/{name}), so labels stay few whatever paths clients send.
                request_scope.route = getattr(scope.get("route"), "path", "unmatched")
                request_scope.cut = bool(scope.get(ANSWER_CUT))


def _with_scope_headers(request_scope: RequestScope, message: Message) -> list[Any]:
    """The response's headers, with what the scope knows about the request added."""
    timing = request_scope.timing
    headers = list(message.get("headers", []))
    headers.append((b"x-request-id", request_scope.request_id.encode()))
    if request_scope.model_version is not None:
        headers.append((b"x-model-version", request_scope.model_version.encode()))
    if request_scope.cache is not None:
        headers.append((b"x-cache", request_scope.cache.encode()))
    if not any(name == b"x-queue-time" for name, _ in headers):
        # (TEI's routes send their own, in TEI's milliseconds.)
        headers.append((b"x-queue-time", f"{timing.queue:.6f}".encode()))
        headers.append((b"x-compute-time", f"{timing.compute:.6f}".encode()))
    return headers
