"""The Open Inference Protocol's routes under ``/v2``: server and model metadata, health,
readiness, ``infer`` (with and without ``/versions/{version}``), and Triton's model
repository extension (``/v2/repository/index``, ``.../models/{model}/load`` and
``/unload``: ATTNSERVE_MODEL_CONTROL explicit or poll, admin keys)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.engine import CLASSIFY, RERANK, RerankResult
from service.engine.scope import Access
from service.protocols import http
from service.protocols.context import scope_of
from service.protocols.http import ChunkedResponse, EngineDep, error_responses, protocol_route
from service.protocols.kserve_v2 import codec
from service.protocols.kserve_v2.errors import render
from service.protocols.kserve_v2.schemas import (
    ErrorBody,
    InferRequest,
    InferResponse,
    Live,
    ModelMetadata,
    ModelReady,
    Ready,
    RepositoryIndexRequest,
    RepositoryModel,
    ServerMetadata,
    TensorMetadata,
)
from service.protocols.open_inference import classify, multi_vector, rerank, tensors
from service.protocols.open_inference.metadata import (
    EXTENSIONS,
    PLATFORM,
    SERVER_NAME,
    SERVER_VERSION,
)
from service.protocols.protocol import Protocol

# What the statuses mean in this protocol's terms (the OpenAPI's error descriptions).
NOTES = {
    400: "the JSON header is not valid JSON, or X-Request-Timeout is malformed",
    422: "invalid content: framing (header length, binary sizes), datatype, shape, data, "
    "unknown input or output, mask, non-finite values",
}


def routed(access: Access) -> APIRouter:
    """A /v2 router whose routes enter the scope with ``access`` and document its errors."""
    return APIRouter(
        prefix="/v2",
        tags=["kserve-v2"],
        route_class=protocol_route(render, access, "kserve_v2"),
        responses=error_responses(ErrorBody, access, notes=NOTES),
    )


health = routed(Access.OPEN)
models = routed(Access.GUARDED)
infer_router = routed(Access.WORK)
repository = routed(Access.ADMIN)
routers = (health, models, infer_router, repository)


@health.get("", response_model=ServerMetadata)
async def server_metadata() -> ServerMetadata:
    """Server name, version and protocol extensions."""
    return ServerMetadata(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)


@health.api_route("/health/live", methods=["GET", "HEAD"], response_model=Live)
async def live(engine: EngineDep) -> Live:
    engine.check_live()
    return Live(live=True)


@health.api_route("/health/ready", methods=["GET", "HEAD"], response_model=Ready)
async def ready(engine: EngineDep) -> Ready:
    engine.check_ready()
    return Ready(ready=True)


def _tensors(items: list[tuple[str, str, list[int]]]) -> list[TensorMetadata]:
    return [
        TensorMetadata.model_validate({"name": n, "datatype": d, "shape": s}) for n, d, s in items
    ]


@models.get("/models/{model}", response_model=ModelMetadata)
@models.get("/models/{model}/versions/{version}", response_model=ModelMetadata)
async def model_metadata(
    model: str, engine: EngineDep, version: str | None = None
) -> ModelMetadata:
    """Inputs and outputs with datatypes and shapes (-1: dynamic)."""
    info = engine.model(model, version)
    return ModelMetadata(
        name=info.name,
        versions=engine.model_versions(info.name),
        platform=PLATFORM,
        inputs=_tensors(tensors.model_inputs(info)),
        outputs=_tensors(tensors.available_outputs(info)),
    )


@models.get("/models/{model}/ready", response_model=ModelReady)
@models.get("/models/{model}/versions/{version}/ready", response_model=ModelReady)
async def model_ready(model: str, engine: EngineDep, version: str | None = None) -> ModelReady:
    info = engine.model(model, version)
    engine.require_ready()
    return ModelReady(name=info.name, ready=True)


INFER_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
            },
        },
    }
}


@infer_router.post(
    "/models/{model}/infer",
    response_model=None,
    responses={200: {"model": InferResponse}},
    openapi_extra=INFER_DOC,
)
@infer_router.post(
    "/models/{model}/versions/{version}/infer",
    response_model=None,
    responses={200: {"model": InferResponse}},
    openapi_extra=INFER_DOC,
)
async def infer(
    model: str, request: Request, engine: EngineDep, version: str | None = None
) -> Response:
    """Inference on JSON or binary tensors (the binary extension: see the codec); a
    reranker's model takes a query and documents (``open_inference/rerank.py``), a
    classifier's texts (``open_inference/classify.py``), a late-interaction model's texts
    (or a query and documents: ``open_inference/multi_vector.py``)."""
    info = engine.model(model, version)
    header_length = request.headers.get(codec.HEADER_LENGTH)
    if rerank.is_reranker(info):
        body = await http.read_body(
            request, engine, json_only=False, json_bytes=codec.json_prefix(header_length)
        )
        result, reply = await engine.handle(
            RERANK, lambda: codec.rerank_request(body, header_length, info), scope_of(request)
        )
        answer = codec.rerank_response(result, reply, info.version)
        return ChunkedResponse(answer.parts, answer.media_type, answer.headers)
    if classify.is_classifier(info):
        body = await http.read_body(
            request, engine, json_only=False, json_bytes=codec.json_prefix(header_length)
        )
        classified, asked = await engine.handle(
            CLASSIFY, lambda: codec.classify_request(body, header_length, info), scope_of(request)
        )
        answer = codec.classify_response(classified, asked, info.version)
        return ChunkedResponse(answer.parts, answer.media_type, answer.headers)
    if multi_vector.is_multi_vector(info):
        body = await http.read_body(
            request, engine, json_only=False, json_bytes=codec.json_prefix(header_length)
        )
        answered, framing = await engine.handle(
            multi_vector.LATE_INTERACTION,
            lambda: codec.multi_vector_request(body, header_length, info),
            scope_of(request),
        )
        if isinstance(answered, RerankResult):  # a query and documents: MaxSim scores
            answer = codec.maxsim_response(answered, framing)
        else:
            answer = await engine.render(answered, codec.multi_vector_response, framing)
        return ChunkedResponse(answer.parts, answer.media_type, answer.headers)
    return await http.encode(
        request,
        engine,
        lambda body: codec.infer_request(body, header_length, info, version),
        codec.infer_response,
        json_only=False,
        json_bytes=codec.json_prefix(header_length),
    )


@repository.post("/repository/index", response_model=list[RepositoryModel])
async def repository_index(
    engine: EngineDep, body: RepositoryIndexRequest | None = None
) -> list[RepositoryModel]:
    """Every model directory: its version and state, and why it does not serve."""
    entries = [RepositoryModel.model_validate(e) for e in engine.repository_index()]
    return [e for e in entries if e.state == "READY"] if body and body.ready else entries


@repository.post("/repository/models/{model}/load", response_model=None)
async def repository_load(model: str, engine: EngineDep) -> Response:
    """Load the directory's highest version beside what serves, check it, swap it in (a
    failure leaves serving untouched: 400 with the reason)."""
    await engine.load_model(model)
    return Response(status_code=200)


@repository.post("/repository/models/{model}/unload", response_model=None)
async def repository_unload(model: str, engine: EngineDep) -> Response:
    """Stop serving the model; requests in progress on it finish."""
    await engine.unload_model(model)
    return Response(status_code=200)


def openapi_components() -> dict[str, Any]:
    schema = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    return {**schema.pop("$defs", {}), "InferRequest": schema}


PROTOCOL = Protocol("kserve_v2", routers, openapi_components)
