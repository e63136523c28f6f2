"""HTTP plumbing every protocol shares; no protocol's body shape and no engine rule.

- ``EngineDep``: the engine, as a FastAPI dependency alias.
- ``protocol_route``: an APIRoute class that enters each request's engine scope
  with the router's access (API key, deadline, admission: the engine's rules)
  and renders every ServiceError (and FastAPI's validation errors) with one
  protocol's renderer, so errors of ``/v1/embeddings`` come out in OpenAI's
  shape and those of ``/v1/encode`` in ours.
- ``read_body``: the body under a size limit (413), a media type and identity
  encoding (415) and a time limit (408), held against the request's ticket.
- ``disconnected``: how the engine learns that an HTTP client went away.
- ``encode``: one encode request over HTTP, given a protocol's codec.
- ``Answer``: what a codec returns when it frames its own answer (bytes, media
  type, headers), sent in chunks so a client that does not read is felt.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from service.engine import ENCODE, EncodeRequest, EncodeResult, Engine, RequestKind
from service.engine.engine import Sized
from service.engine.scope import Access, Disconnected
from service.errors import (
    ClientClosedRequest,
    InvalidInput,
    ServiceError,
    UnsupportedMediaType,
    catalog,
    quoted,
)
from service.protocols import wire
from service.protocols.context import scope_of

# Binary tensor bytes at their peak: the body, and the arrays or texts decoded from it.
BINARY_EXPANSION = 2

W = TypeVar("W")  # what a codec keeps from parsing to writing
Rq = TypeVar("Rq")  # the typed request a codec parses
Res = TypeVar("Res", bound=Sized)  # its result (its answer's size known)
ErrorRenderer = Callable[[ServiceError], Response]


async def get_engine(request: Request) -> Engine:
    # async: a sync dependency would cost a threadpool hop on every request.
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]


async def read_body(
    request: Request, engine: Engine, *, json_only: bool = True, json_bytes: int | None = None
) -> bytes:
    """The body, priced as its bytes arrive and counted by the engine's meter (413
    beyond ATTNSERVE_MAX_BODY_BYTES or the JSON item bound; held on the ticket). The
    first ``json_bytes`` (all, if None) are JSON, priced by ``wire.JsonCost``; the rest
    is binary, held at ``BINARY_EXPANSION``.

    Refuses, with ``json_only``, a
    Content-Type other than application/json (415), any Content-Encoding but
    identity (415), and a body not complete within ATTNSERVE_BODY_TIMEOUT (408). A
    client that leaves mid-body is ClientClosedRequest (499), not an error of ours.
    """
    meter = engine.body_meter(scope_of(request))
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
    if declared.isdigit():
        meter.announced(int(declared))
    chunks: list[bytes] = []
    json_cost = wire.JsonCost()
    json_left = meter.limit if json_bytes is None else json_bytes
    try:
        async with engine.body_read("the body", lambda: meter.size, {"Connection": "close"}):
            async for chunk in request.stream():
                if json_left > 0:
                    json_part = chunk if len(chunk) <= json_left else chunk[:json_left]
                    json_left -= len(json_part)
                    json_cost.add(json_part)
                binary = meter.size + len(chunk) - json_cost.bytes
                held = json_cost.decoded_bytes + BINARY_EXPANSION * binary
                meter.add(len(chunk), json_items=json_cost.items, held=held)
                chunks.append(chunk)
    except ClientDisconnect:
        raise ClientClosedRequest("the client closed the connection while sending") from None
    return b"".join(chunks)


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
    write: Callable[[EncodeResult, W], bytes | Answer],
    *,
    json_only: bool = True,
    json_bytes: int | None = None,
) -> Response:
    """One encode over HTTP, for any protocol: read, parse + run, write.

    ``parse`` (the protocol's codec) runs with the engine's preparation off the event
    loop; ``write`` too when the answer is large (a thread hop costs ~0.3 ms). ``write``
    returns JSON bytes, or an Answer when the protocol frames its own.
    """
    return await encode_as(
        ENCODE, request, engine, parse, write, json_only=json_only, json_bytes=json_bytes
    )


async def encode_as(
    kind: RequestKind[Rq, Any, Res],
    request: Request,
    engine: Engine,
    parse: Callable[[bytes], tuple[Rq, W]],
    write: Callable[[Res, W], bytes | Answer],
    *,
    json_only: bool = True,
    json_bytes: int | None = None,
) -> Response:
    """``encode`` as ``kind`` (e.g. one that is ENCODE for an encode request, another
    kind for another request the same body may parse to)."""
    scope = scope_of(request)
    body = await read_body(request, engine, json_only=json_only, json_bytes=json_bytes)
    result, wire = await engine.handle(kind, lambda: parse(body), scope)
    content = await engine.render(result, write, wire)
    if isinstance(content, Answer):
        return ChunkedResponse(content.parts, content.media_type, content.headers)
    return ChunkedResponse([content])


@dataclass(frozen=True)
class Answer:
    """A protocol's own framing of an answer (e.g. JSON header + binary tensors): its
    parts are sent one after the other, never joined (a tensor's buffer goes out as
    it is, without a copy into one body)."""

    parts: Sequence[bytes | memoryview]
    media_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class ChunkedResponse(Response):
    """An answer sent in chunks, each when the socket has taken the last.

    uvicorn waits for the socket to drain before each chunk, so an answer a client
    does not read stays counted on the request's ticket (released when the scope
    closes, after the last chunk) and a stalled reader is cut by the server's send
    timeout, instead of piling up unseen in transport buffers.
    """

    CHUNK = 256 * 1024

    def __init__(
        self,
        parts: Sequence[bytes | memoryview],
        media_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.parts = [memoryview(part).cast("B") for part in parts]
        size = sum(part.nbytes for part in self.parts)
        # The parts' own length: Starlette then leaves content-length alone.
        super().__init__(
            b"", media_type=media_type, headers={**(headers or {}), "content-length": str(size)}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        chunks = [
            part[start : start + self.CHUNK]  # views: nothing copied here
            for part in self.parts
            for start in range(0, part.nbytes, self.CHUNK)
        ]
        for k, chunk in enumerate(chunks):
            last = k == len(chunks) - 1  # a small answer goes out in one message
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
        if not chunks:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def validation_error(exc: RequestValidationError) -> InvalidInput:
    """FastAPI's own validation error (path, query or a pydantic body) as a domain error."""
    errors = exc.errors()
    err = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = tuple(p for p in err.get("loc", ()) if p not in ("body", "path", "query"))
    return InvalidInput(str(err.get("msg")), field=loc or None)


def protocol_route(render: ErrorRenderer, access: Access, protocol: str) -> type[APIRoute]:
    """An APIRoute that names its ``protocol`` in each request's scope (traces), enters
    the scope with ``access`` before its handler (dependencies included) runs, and
    answers ServiceErrors via ``render``."""

    class ProtocolRoute(APIRoute):
        route_access = access

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                try:
                    scope = scope_of(request)
                    scope.protocol = protocol
                    scope.enter(access)
                    if access is Access.WORK:
                        scope.cancelled = disconnected(request)
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


def error_responses(
    body: type[Any],
    access: Access,
    status_of: Callable[[type[ServiceError]], int] | None = None,
    notes: dict[int, str] | None = None,
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses of the routes with ``access``: every error they can answer, in
    ``body``'s shape, from the one catalog in ``service/errors.py`` (whose ``when`` texts
    make the table in docs/api.md). ``status_of``: a protocol's own status for an error;
    ``notes``: what a status means in the protocol's own terms."""
    kinds: dict[int, list[str]] = {}
    for cls in catalog():
        if access.value in cls.raised_on:
            status = cls.status_code if status_of is None else status_of(cls)
            kinds.setdefault(status, []).append(cls.error_type)
    described = {
        status: ", ".join(dict.fromkeys(kinds[status]))
        + (f": {notes[status]}" if notes and status in notes else "")
        for status in kinds
    }
    return {status: {"model": body, "description": described[status]} for status in sorted(kinds)}


def json_request_body(schema: str) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself (the arrays skip pydantic)."""
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}
