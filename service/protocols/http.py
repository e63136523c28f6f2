"""HTTP plumbing every protocol shares; no protocol's body shape lives here.

- ``EngineDep``: the engine, as a FastAPI dependency alias.
- ``require_api_key``: with ATTNSERVE_API_KEY set, ``Authorization: Bearer <key>``.
- ``read_body``: the body under a size limit (413), a media type and identity
  encoding (415) and a time limit (408), held against the request's ticket.
- ``asked_timeout``: the ``X-Request-Timeout`` header (seconds), for any protocol.
- ``disconnected``: a coroutine factory for the engine's ``until=``.
- ``encode``: one encode request over HTTP, given a protocol's codec.
- ``ticketed``: a handler's answer under an admission ticket kept until it is sent.
- ``protocol_route``: an APIRoute class that renders every ServiceError (and
  FastAPI's own validation errors) with one protocol's renderer, so errors of
  ``/v1/embeddings`` come out in OpenAI's shape and those of ``/v1/encode`` in ours.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from service.engine import OFFLOAD_BYTES, EncodeRequest, EncodeResult, Engine
from service.engine.admission import PARSE_EXPANSION, Ticket
from service.engine.engine import Disconnected
from service.errors import (
    BodyTimeout,
    ClientClosedRequest,
    InvalidHeader,
    InvalidInput,
    PayloadTooLarge,
    ServiceError,
    ShuttingDown,
    Unauthorized,
    UnsupportedMediaType,
    quoted,
)
from service.protocols.context import context_of

# X-Request-Timeout, at most (the server's ATTNSERVE_REQUEST_TIMEOUT caps it anyway).
MAX_ASKED_TIMEOUT = 86400.0

W = TypeVar("W")  # what a codec keeps from parsing to writing
ErrorRenderer = Callable[[ServiceError], Response]


async def get_engine(request: Request) -> Engine:
    # async: a sync dependency would cost a threadpool hop on every request.
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]


async def require_api_key(request: Request) -> None:
    """With ATTNSERVE_API_KEY set, the protected routes need ``Authorization: Bearer <key>``."""
    key = request.app.state.engine.settings.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = key.get_secret_value().encode()
    # Bytes, not str: compare_digest refuses non-ASCII str, and headers may carry any byte.
    given = token.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given, expected):
        raise Unauthorized(
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def read_body(
    request: Request, engine: Engine, ticket: Ticket, *, json_only: bool = True
) -> bytes:
    """The body, holding its bytes on ``ticket`` as they arrive (not as announced: a
    Content-Length costs the client nothing to send, the bytes themselves do).

    Refuses more than ATTNSERVE_MAX_BODY_BYTES (413), with ``json_only`` a
    Content-Type other than application/json (415), any Content-Encoding but
    identity (415), and a body not complete within ATTNSERVE_BODY_TIMEOUT (408). A
    client that leaves mid-body is ClientClosedRequest (499), not an error of ours.
    """
    settings = engine.settings
    limit = settings.max_body_bytes
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if json_only and media_type != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {quoted(media_type or 'none')}"
        )
    transfer = ", ".join(request.headers.getlist("transfer-encoding")).strip().lower()
    if transfer not in ("", "chunked"):
        # The server only de-chunks: any other coding would reach the codec still coded.
        raise UnsupportedMediaType(
            f"Transfer-Encoding {quoted(transfer)} is not supported: send the body "
            "uncompressed, with a Content-Length or chunked"
        )
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedMediaType(
            f"Content-Encoding {quoted(encoding)} is not supported: send the body uncompressed"
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {int(declared):,} bytes exceeds {limit:,}")
    chunks: list[bytes] = []
    size = 0
    try:
        async with engine.body_read():
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body exceeds {limit:,} bytes")
                ticket.hold(size * PARSE_EXPANSION, "this request's body")
                chunks.append(chunk)
    except TimeoutError:
        if engine.closing:
            raise ShuttingDown(
                "the server is shutting down and the body was still arriving: send the "
                "request to another replica",
                headers={"Connection": "close", "Retry-After": "1"},
            ) from None
        engine.metrics.refusals.labels("body_timeout").inc()
        raise BodyTimeout(
            f"the body did not arrive within {settings.body_timeout:g} s ({size:,} bytes received)",
            headers={"Connection": "close"},
        ) from None
    except ClientDisconnect:
        raise ClientClosedRequest("the client closed the connection while sending") from None
    return b"".join(chunks)


def asked_timeout(request: Request) -> float | None:
    """``X-Request-Timeout``: seconds the client will wait (400 unless a positive number)."""
    raw = request.headers.get("x-request-timeout")
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


def disconnected(request: Request) -> Disconnected:
    """What the engine awaits to learn that this request's client went away."""

    async def wait() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return wait


async def encode(
    request: Request,
    engine: Engine,
    parse: Callable[[bytes], tuple[EncodeRequest, W]],
    write: Callable[[EncodeResult, W], bytes | Response],
    *,
    json_only: bool = True,
) -> Response:
    """One encode over HTTP, for any protocol: ticket, read, parse + run, write.

    ``parse`` (the protocol's codec) runs with the engine's preparation off the event
    loop; ``write`` too when the answer is large (a thread hop costs ~0.3 ms). ``write``
    returns JSON bytes, or a whole Response when the protocol frames its own answer.
    The deadline counts from the request's arrival.
    """
    context = context_of(request)
    deadline = engine.deadline(context.arrival, asked_timeout(request))

    async def answer(ticket: Ticket) -> Response:
        body = await read_body(request, engine, ticket, json_only=json_only)
        result, wire = await engine.encode(
            lambda: parse(body),
            ticket,
            deadline=deadline,
            until=disconnected(request),
            timing=context.timing,
        )
        if result.response_bytes > OFFLOAD_BYTES:
            content = await engine.off_loop(write, result, wire)
        else:
            content = write(result, wire)
        if isinstance(content, Response):
            return content
        return Response(content, media_type="application/json")

    return await ticketed(engine, answer)


async def ticketed(engine: Engine, answer: Callable[[Ticket], Awaitable[Response]]) -> Response:
    """``answer`` under a new ticket, which is given back once the response has been sent
    (or at once, if ``answer`` fails)."""
    ticket = engine.ticket()
    try:
        response = await answer(ticket)
    except BaseException:
        ticket.release()
        raise
    return SentThenReleased(response, ticket.release)


class SentThenReleased(Response):
    """An answer that keeps its request's ticket until the client has taken it.

    The body goes out in chunks, and uvicorn waits for the socket to drain before
    each one, so an answer a client does not read stays counted in the memory budget
    (and a stalled reader is cut by the server's send timeout) instead of piling up
    unseen in transport buffers.
    """

    CHUNK = 256 * 1024

    def __init__(self, response: Response, release: Callable[[], None]) -> None:
        self.status_code = response.status_code
        self.body = response.body
        self.raw_headers = response.raw_headers
        self.background = response.background
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            view = memoryview(self.body)
            for start in range(0, len(view), self.CHUNK):
                chunk = bytes(view[start : start + self.CHUNK])
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._release()
        if self.background is not None:
            await self.background()


def validation_error(exc: RequestValidationError) -> InvalidInput:
    """FastAPI's own validation error (path, query or a pydantic body) as a domain error."""
    errors = exc.errors()
    err = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = tuple(p for p in err.get("loc", ()) if p not in ("body", "path", "query"))
    return InvalidInput(str(err.get("msg")), field=loc or None)


def protocol_route(render: ErrorRenderer) -> type[APIRoute]:
    """An APIRoute whose handler (dependencies included) answers ServiceErrors via ``render``."""

    class ProtocolRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                try:
                    return await handler(request)
                except ClientClosedRequest:
                    # Nobody will read an answer; the middleware counts it as 499.
                    return Response(status_code=ClientClosedRequest.status_code)
                except ServiceError as exc:
                    return render(exc)
                except RequestValidationError as exc:
                    return render(validation_error(exc))

            return handle

    return ProtocolRoute


def json_request_body(schema: str) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself (the arrays skip pydantic)."""
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}
