"""HTTP routes, in small routers. Routes move bytes and call the pipeline; no array math here."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service import pipeline
from service.batcher import Batcher
from service.errors import (
    ClientClosedRequest,
    NotReady,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from service.metrics import Metrics
from service.runtime import ModelInfo, ModelRuntime
from service.schemas import (
    EncodeRequest,
    EncodeResponse,
    ErrorBody,
    Health,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from service.settings import Settings

T = TypeVar("T")

# Responses larger than this are serialised on a worker thread, so a big answer
# never stalls the event loop; small ones are cheaper inline.
OFFLOAD_BYTES = 256 * 1024


@dataclass
class ServiceState:
    """Everything the routes need; built by the app's lifespan."""

    settings: Settings
    metrics: Metrics
    runtimes: dict[str, ModelRuntime] = field(default_factory=dict)
    default_model: str = ""
    batcher: Batcher | None = None
    ready: bool = False
    failure: str | None = None  # set when the process can never serve (fails liveness)


async def get_state(request: Request) -> ServiceState:
    # async: a sync dependency would cost a threadpool hop on every request.
    state: ServiceState = request.app.state.service
    return state


State = Annotated[ServiceState, Depends(get_state)]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (400, "Malformed JSON body (invalid_json)."),
        (401, "Missing or wrong API key, when the server has one (unauthorized)."),
        (404, "Unknown model (model_not_found)."),
        (413, "Too many sequences or tokens, sequence too long, body or response too large."),
        (415, "Content-Type is not application/json (unsupported_media_type)."),
        (422, "Well-formed JSON with invalid content (invalid_input)."),
        (429, "Too many requests queued (overloaded); honour Retry-After."),
        (503, "Models not loaded or warm-up not finished (not_ready)."),
    )
}


async def require_api_key(request: Request) -> None:
    """With ATTNSERVE_API_KEY set, /v1/* needs ``Authorization: Bearer <key>``."""
    settings: Settings = request.app.state.service.settings
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = settings.api_key.get_secret_value().encode()
    # Bytes, not str: compare_digest refuses non-ASCII str, and headers may carry any byte.
    given = token.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given, expected):
        raise Unauthorized(
            "missing or wrong API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


health = APIRouter(tags=["health"])
models = APIRouter(prefix="/v1", tags=["models"], dependencies=[Depends(require_api_key)])
encode = APIRouter(prefix="/v1", tags=["encode"], dependencies=[Depends(require_api_key)])
metrics = APIRouter(tags=["metrics"])


@health.get("/health/live", response_model=Health, responses={503: ERROR_RESPONSES[503]})
async def live(state: State) -> Health:
    """The process is up and able to serve (503 once its warm-up has failed for good)."""
    if state.failure is not None:
        raise NotReady(state.failure)
    return Health(status="alive")


@health.get("/health/ready", response_model=Health, responses={503: ERROR_RESPONSES[503]})
async def ready(state: State) -> Health:
    """Models are loaded and a warm-up inference passed."""
    if not state.ready:
        raise NotReady("models are loading or warming up", headers={"Retry-After": "1"})
    return Health(status="ready")


def model_card(info: ModelInfo, default: bool) -> ModelCard:
    cfg = info.config
    return ModelCard(
        name=info.name,
        d_model=cfg.d_model,
        heads=cfg.n_heads,
        layers=cfg.n_layers,
        d_ff=cfg.d_ff,
        max_seq_len=info.max_seq_len,
        causal=cfg.causal,
        window=cfg.window,
        scoring=cfg.scoring,
        norm_placement=cfg.norm_placement,
        activation=cfg.activation,
        opset=info.opset,
        sha256=info.sha256,
        tokenizer=info.has_tokenizer,
        default=default,
    )


@models.get("/models", response_model=ModelList)
async def list_models(state: State) -> ModelList:
    """Every model this server serves."""
    require_loaded(state)
    return ModelList(
        data=[
            model_card(rt.info, name == state.default_model) for name, rt in state.runtimes.items()
        ]
    )


@models.get("/models/{name}", response_model=ModelCard, responses={404: ERROR_RESPONSES[404]})
async def get_model(name: str, state: State) -> ModelCard:
    """One model's architecture, limits and file digests."""
    require_loaded(state)
    info = pipeline.resolve_model(state.runtimes, name, state.default_model).info
    return model_card(info, info.name == state.default_model)


async def read_json_body(request: Request, limit: int) -> bytes:
    """The body, refusing a wrong Content-Type (415) or more than ``limit`` bytes (413)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
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


def json_request_body(schema: str) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself (the arrays skip pydantic, see schemas)."""
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


@encode.post(
    "/encode",
    response_model=None,
    responses={200: {"model": EncodeResponse}, **ERROR_RESPONSES},
    openapi_extra=json_request_body("EncodeRequest"),
)
async def encode_sequences(request: Request, state: State) -> Response:
    """Contextualized embeddings (and optionally attention weights) for token embeddings."""
    batcher = require_ready(state)
    with batcher.permit():
        body = await read_json_body(request, state.settings.max_body_bytes)
        # Off the loop: parsing big bodies, tokenizing and embedding texts take real time.
        prepared = await asyncio.to_thread(
            pipeline.prepare, body, state.runtimes, state.default_model, state.settings
        )
        results = await unless_disconnected(
            request,
            batcher.submit(
                prepared.model.name,
                prepared.sequences,
                with_attention=prepared.options.return_attention,
            ),
        )
        tokens = sum(len(s) for s in prepared.sequences)
        state.metrics.tokens.labels(prepared.model.name).inc(tokens)
        content = (
            await asyncio.to_thread(pipeline.finish, prepared, results)
            if prepared.response_bytes > OFFLOAD_BYTES
            else pipeline.finish(prepared, results)
        )
    return Response(content, media_type="application/json")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` unless the client goes away first; then cancel it (queued runs skip it).

    uvicorn does not cancel a handler whose client disconnected, so without this a
    burst of abandoned requests would still be computed in full.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise ClientClosedRequest("the client closed the connection before the answer")
    finally:
        watcher.cancel()


@encode.post(
    "/tokenize",
    response_model=None,
    responses={200: {"model": TokenizeResponse}, **ERROR_RESPONSES},
    openapi_extra=json_request_body("TokenizeRequest"),
)
async def tokenize_texts(request: Request, state: State) -> Response:
    """Texts -> tokens, ids and the encoder's input embeddings (models with a tokenizer)."""
    with require_ready(state).permit():
        body = await read_json_body(request, state.settings.max_body_bytes)
        content = await asyncio.to_thread(
            pipeline.tokenize, body, state.runtimes, state.default_model, state.settings
        )
    return Response(content, media_type="application/json")


def require_loaded(state: ServiceState) -> None:
    if not state.runtimes:
        raise NotReady("models are loading", headers={"Retry-After": "1"})


def require_ready(state: ServiceState) -> Batcher:
    if not state.ready or state.batcher is None:
        raise NotReady("models are loading or warming up", headers={"Retry-After": "1"})
    return state.batcher


@metrics.get("/metrics", response_class=Response)
async def prometheus_metrics(state: State) -> Response:
    """Prometheus text exposition."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def openapi_components() -> dict[str, Any]:
    """Schemas referenced by hand (the encode body is parsed by the codecs, not FastAPI)."""
    components: dict[str, Any] = {}
    for model in (EncodeRequest, TokenizeRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


def json_error(
    status: int, body: dict[str, str], headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)
