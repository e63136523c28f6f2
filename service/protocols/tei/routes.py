"""TEI's routes: ``POST /`` and ``/embed`` (also ``//embed`` and ``/embed/``, which
LlamaIndex posts to with a trailing slash in its base URL), ``/embed_all``,
``/embed_sparse``, ``/similarity``, ``GET /info`` and ``GET /health``. ``GET /``
stays the viewer; a TEI health probe calls ``GET /health``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.engine.scope import Access
from service.protocols import http
from service.protocols.context import scope_of
from service.protocols.http import ChunkedResponse, EngineDep, error_responses, protocol_route
from service.protocols.protocol import Protocol
from service.protocols.tei import codec
from service.protocols.tei.errors import render, status_for
from service.protocols.tei.schemas import ErrorBody


def routed(access: Access) -> APIRouter:
    return APIRouter(
        tags=["tei"],
        route_class=protocol_route(render, access),
        responses=error_responses(ErrorBody, access, status_for),
    )


health = routed(Access.OPEN)
work = routed(Access.WORK)
routers = (health, work)


@health.get(
    "/health",
    response_model=None,
    response_class=Response,
    responses={200: {"description": "Ready: an empty body, as TEI answers", "content": {}}},
)
async def tei_health(engine: EngineDep) -> Response:
    """200 (empty) when ready to serve, else 503 ``Unhealthy``."""
    engine.check_ready()
    return Response(status_code=200)


@health.get("/info", response_model=None)
async def tei_info(engine: EngineDep) -> JSONResponse:
    """The default model and the limits that apply (``max_client_batch_size``: inputs
    per request of pooled vectors)."""
    model = engine.model(None)
    pooling = model.manifest.pooling or "mean"
    return JSONResponse(codec.info(model, engine.settings, pooling))


# POST / is /embed under another name (huggingface_hub posts there); not in the OpenAPI
# schema, where "/" would meet the viewer's GET / (one Allow header for two routes).
@work.post("/", response_model=None, include_in_schema=False)
@work.post("/embed", response_model=None)
@work.post("/embed/", response_model=None, include_in_schema=False)
@work.post("//embed", response_model=None, include_in_schema=False)
async def tei_embed(request: Request, engine: EngineDep) -> Response:
    """One vector per input (the model's pooling; L2-normalised unless normalize is false)."""
    return await http.encode(request, engine, codec.embed_request, codec.embed_response)


@work.post("/embed_all", response_model=None)
async def tei_embed_all(request: Request, engine: EngineDep) -> Response:
    """Every token's embedding of every input, special tokens included."""
    return await http.encode(request, engine, codec.embed_all_request, codec.embed_all_response)


@work.post("/embed_sparse", response_model=None)
async def tei_embed_sparse(request: Request, engine: EngineDep) -> Response:
    """BM42 sparse vectors as ``[[{"index", "value"}]]``."""
    body = await http.read_body(request, engine)
    result, _ = await engine.embed_sparse(lambda: codec.sparse_request(body), scope_of(request))
    return ChunkedResponse([codec.sparse_response(result)])


@work.post("/similarity", response_model=None)
async def tei_similarity(request: Request, engine: EngineDep) -> Response:
    """Cosine of ``source_sentence`` with each of ``sentences``."""
    return await http.encode(request, engine, codec.similarity_request, codec.similarity_response)


PROTOCOL = Protocol("tei", routers, enabled=lambda settings: settings.tei)
