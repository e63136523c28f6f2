"""``create_app(settings)``: the FastAPI application factory.

The lifespan starts the engine (which loads every model of the repository,
refusing to start on a missing or corrupt one, then warms up in the
background: ``/health/ready`` answers 503 until that has passed) and stops it.
Each protocol (``PROTOCOLS``, one line each) brings its routers and, for a
non-HTTP transport, a server started and stopped with the engine; errors of
its routes are rendered by its own route class, the rest (unknown paths, 405,
unexpected errors) in the native shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api_docs import add_api_docs
from service.engine import Engine
from service.errors import HTTP_ERRORS, ServiceError
from service.metrics import Metrics
from service.protocols.context import RequestScopeMiddleware
from service.protocols.http import validation_error
from service.protocols.kserve_grpc.server import PROTOCOL as KSERVE_GRPC
from service.protocols.kserve_v2.routes import PROTOCOL as KSERVE_V2
from service.protocols.native import errors as native_errors
from service.protocols.native.routes import PROTOCOL as NATIVE
from service.protocols.openai.routes import PROTOCOL as OPENAI
from service.protocols.protocol import Protocol
from service.protocols.tei.routes import PROTOCOL as TEI
from service.settings import Settings
from service.version import VERSION
from service.viewer import add_viewer

HTTP_ERROR_TYPES = {status: kind for status, kind, _ in HTTP_ERRORS}
PROTOCOLS: tuple[Protocol, ...] = (NATIVE, OPENAI, KSERVE_V2, KSERVE_GRPC, TEI)


def _lifespan(engine: Engine) -> Any:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            async with AsyncExitStack() as servers:
                for protocol in PROTOCOLS:
                    if protocol.serve is not None:
                        await servers.enter_async_context(protocol.serve(engine))
                yield
        finally:
            await engine.stop()

    return lifespan


def internal_error(headers: dict[str, str] | None = None) -> JSONResponse:
    """The answer to a bug of ours: no detail (those are in the server log only)."""
    return native_errors.error_response(500, "internal server error", "internal_error", headers)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    engine = Engine(settings, Metrics())
    app = FastAPI(
        title="attnserve",
        version=VERSION,
        summary="Contextualized embeddings and attention weights from self-attention encoders.",
        lifespan=_lifespan(engine),
        # No redirects: /v1/encode/ is a 404, not a Location built from the client's Host.
        redirect_slashes=False,
        docs_url=None,  # add_api_docs: the same pages with their assets served from here
        redoc_url=None,
    )
    add_api_docs(app)
    add_viewer(app)
    app.state.engine = engine
    for protocol in PROTOCOLS:
        if not protocol.enabled(settings):
            continue
        for router in protocol.routers:
            app.include_router(router)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return native_errors.render(exc)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(
        request: Request, exc: RequestValidationError
    ) -> JSONResponse:
        return native_errors.render(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return native_errors.error_response(
            exc.status_code,
            str(exc.detail),
            HTTP_ERROR_TYPES.get(exc.status_code, "http_error"),
            dict(exc.headers) if exc.headers else None,
        )

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # Only for a failure outside RequestScopeMiddleware (which answers the rest and
        # keeps the connection): Starlette re-raises after this answer, uvicorn logs the
        # traceback and closes the connection, so the answer says so.
        return internal_error(headers={"connection": "close"})

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for protocol in PROTOCOLS:
                components.update(protocol.openapi_components())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
    app.add_middleware(RequestScopeMiddleware, engine=engine, unexpected=internal_error())
    return app
