"""HTTP plumbing every protocol shares; no protocol's body shape lives here.

- ``EngineDep``: the engine, as a FastAPI dependency alias.
- ``require_api_key``: with ATTNSERVE_API_KEY set, ``Authorization: Bearer <key>``.
- ``read_body``: the body under a size limit (413) and a media type (415).
- ``disconnected``: a coroutine factory for the engine's ``until=``.
- ``encode``: one encode request over HTTP, given a protocol's codec.
- ``protocol_route``: an APIRoute class that renders every ServiceError (and
  FastAPI's own validation errors) with one protocol's renderer, so errors of
  ``/v1/embeddings`` come out in OpenAI's shape and those of ``/v1/encode`` in ours.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute

from service.engine import OFFLOAD_BYTES, EncodeRequest, EncodeResult, Engine
from service.engine.engine import Disconnected
from service.errors import (
    InvalidInput,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    UnsupportedMediaType,
)

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


async def read_body(request: Request, limit: int, *, json_only: bool = True) -> bytes:
    """The body, refusing more than ``limit`` bytes (413) and, with ``json_only``, a
    Content-Type other than application/json (415)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if json_only and media_type != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {media_type or 'none'!r}"
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {int(declared):,} bytes exceeds {limit:,}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit:,} bytes")
        chunks.append(chunk)
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
    write: Callable[[EncodeResult, W], bytes | Response],
    *,
    json_only: bool = True,
) -> Response:
    """One encode over HTTP, for any protocol: admit, read, parse + run, write.

    ``parse`` (the protocol's codec) runs with the engine's preparation off the event
    loop; ``write`` too when the answer is large (a thread hop costs ~0.3 ms). ``write``
    returns JSON bytes, or a whole Response when the protocol frames its own answer.
    """
    with engine.admit():
        body = await read_body(request, engine.settings.max_body_bytes, json_only=json_only)
        result, wire = await engine.encode(lambda: parse(body), until=disconnected(request))
        if result.response_bytes > OFFLOAD_BYTES:
            content = await asyncio.to_thread(write, result, wire)
        else:
            content = write(result, wire)
    if isinstance(content, Response):
        return content
    return Response(content, media_type="application/json")


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
