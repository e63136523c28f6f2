"""``create_app(settings)``: the FastAPI application factory.

The lifespan loads every model of the repository (refusing to start on a
missing or corrupt one), starts the batcher, then warms each model up in the
background; ``/health/ready`` answers 503 until that warm-up has passed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import api
from service.batcher import Batcher
from service.errors import ModelLoadError, ServiceError
from service.metrics import Metrics
from service.runtime import ModelRuntime, load_repository
from service.settings import Settings

log = logging.getLogger(__name__)

HTTP_ERROR_TYPES = {404: "not_found", 405: "method_not_allowed"}


async def _warm_up(state: api.ServiceState, runtimes: dict[str, ModelRuntime]) -> None:
    try:
        for runtime in runtimes.values():
            await asyncio.to_thread(runtime.warmup)
    except Exception as exc:
        log.exception("warm-up failed: the server will never be ready")
        # Fail liveness too, so an orchestrator restarts it instead of keeping a
        # process that answers health checks but can never serve.
        state.failure = f"warm-up failed: {exc}"
        return
    state.ready = True
    log.info("ready: %s (default %s)", ", ".join(state.runtimes), state.default_model)


def _lifespan(state: api.ServiceState) -> Any:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings = state.settings
        try:
            runtimes = await asyncio.to_thread(load_repository, settings)
        except ModelLoadError as exc:
            log.error("attnserve cannot start: %s", exc)
            raise
        state.runtimes = runtimes
        state.default_model = settings.default_model or sorted(runtimes)[0]
        state.batcher = Batcher(runtimes, settings, state.metrics)
        await state.batcher.start()
        warm = asyncio.create_task(_warm_up(state, runtimes)) if settings.warmup else None
        if warm is None:
            state.ready = True
        try:
            yield
        finally:
            state.ready = False
            if warm is not None:
                warm.cancel()
            await state.batcher.stop()

    return lifespan


class MetricsMiddleware:
    """Counts requests and latency per route template (pure ASGI: no per-request task)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            # The router records the matched route in the scope: label by its template
            # (/v1/models/{name}), so labels stay few whatever paths clients send.
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    state = api.ServiceState(settings=settings, metrics=Metrics())
    app = FastAPI(
        title="attnserve",
        version="0.1.0",
        summary="Contextualized embeddings and attention weights from self-attention encoders.",
        lifespan=_lifespan(state),
    )
    app.state.service = state
    for router in (api.health, api.models, api.encode, api.metrics):
        app.include_router(router)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return api.json_error(exc.status_code, exc.body(), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in err.get("loc", ())) or "request"
        return api.json_error(
            422, {"error": f"{where}: {err.get('msg')}", "error_type": "invalid_input"}
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return api.json_error(
            exc.status_code,
            {
                "error": str(exc.detail),
                "error_type": HTTP_ERROR_TYPES.get(exc.status_code, "http_error"),
            },
            dict(exc.headers) if exc.headers else None,
        )

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # No logging here: Starlette re-raises after this answer and uvicorn logs the
        # traceback once.
        return api.json_error(
            500, {"error": "internal server error", "error_type": "internal_error"}
        )

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(
                api.openapi_components()
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    return app
