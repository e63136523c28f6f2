"""TEI's routes: ``POST /`` and ``/embed`` (also ``//embed`` and ``/embed/``, which
LlamaIndex posts to with a trailing slash in its base URL, and SageMaker's
``/invocations``), ``/embed_all``, ``/embed_sparse``, ``/similarity``,
``/tokenize``, ``/decode``, ``GET /info`` and ``GET /health`` (and SageMaker's
``GET /ping``). ``GET /`` stays the viewer; a TEI health probe calls ``GET /health``.

Answers that ran the model carry TEI's timing headers, in its units (whole
milliseconds): ``x-total-time`` (= ``x-compute-time``), ``x-tokenization-time``,
``x-queue-time``, ``x-inference-time``, and ``x-compute-tokens``,
``x-compute-characters``, ``x-compute-type``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.engine import (
    CLASSIFY,
    DECODE,
    RERANK,
    SPARSE,
    TOKENIZE,
    EncodeRequest,
    EncodeResult,
    Engine,
)
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
        route_class=protocol_route(render, access, "tei"),
        responses=error_responses(ErrorBody, access, status_for),
    )


health = routed(Access.OPEN)
guarded = routed(Access.GUARDED)  # what a server serves: behind the API key, as /v1/models
work = routed(Access.WORK)
routers = (health, guarded, work)


def timed(response: Response, request: Request, characters: int, tokens: int) -> Response:
    """TEI's timing headers on an answer (whole milliseconds, as TEI sends them)."""
    scope = scope_of(request)
    timing = scope.timing
    total = f"{(time.monotonic() - scope.arrival) * 1000:.0f}"
    response.headers.update(
        {
            "x-compute-type": "cpu",
            "x-compute-time": total,
            "x-total-time": total,
            "x-tokenization-time": f"{timing.prepare * 1000:.0f}",
            "x-queue-time": f"{timing.queue * 1000:.0f}",
            "x-inference-time": f"{timing.compute * 1000:.0f}",
            "x-compute-tokens": str(tokens),
            "x-compute-characters": str(characters),
        }
    )
    return response


@health.get(
    "/health",
    response_model=None,
    response_class=Response,
    responses={200: {"description": "Ready: an empty body, as TEI answers", "content": {}}},
)
@health.get("/ping", include_in_schema=False)
async def tei_health(engine: EngineDep) -> Response:
    """200 (empty) when ready to serve, else 503 ``Unhealthy``."""
    engine.check_ready()
    return Response(status_code=200)


@guarded.get("/info", response_model=None)
async def tei_info(engine: EngineDep) -> JSONResponse:
    """The default model and the limits that apply (``max_client_batch_size``: inputs
    per request of pooled vectors)."""
    model = engine.model(None)
    return JSONResponse(codec.info(model, engine.serving_limits(), model.default_pooling))


# POST / is /embed under another name (huggingface_hub posts there); not in the OpenAPI
# schema, where "/" would meet the viewer's GET / (one Allow header for two routes).
@work.post("/", response_model=None, include_in_schema=False)
@work.post("/embed", response_model=None)
@work.post("/embed/", response_model=None, include_in_schema=False)
@work.post("//embed", response_model=None, include_in_schema=False)
@work.post("/invocations", response_model=None, include_in_schema=False)
async def tei_embed(request: Request, engine: EngineDep) -> Response:
    """One vector per input (the model's pooling; L2-normalised unless normalize is false)."""
    return await _encode(request, engine, codec.embed_request, codec.embed_response)


@work.post("/embed_all", response_model=None)
async def tei_embed_all(request: Request, engine: EngineDep) -> Response:
    """Every token's embedding of every input, special tokens included."""
    return await _encode(request, engine, codec.embed_all_request, codec.embed_all_response)


@work.post("/similarity", response_model=None)
async def tei_similarity(request: Request, engine: EngineDep) -> Response:
    """Cosine of ``source_sentence`` with each of ``sentences``."""
    return await _encode(request, engine, codec.similarity_request, codec.similarity_response)


async def _encode(
    request: Request,
    engine: Engine,
    parse: Callable[[bytes], tuple[EncodeRequest, codec.Characters]],
    write: Callable[[EncodeResult, codec.Characters], bytes],
) -> Response:
    kept: list[tuple[int, int]] = []  # (characters, tokens), seen on the way out

    def keep(result: EncodeResult, characters: codec.Characters) -> bytes:
        kept.append((characters, result.tokens))
        return write(result, characters)

    response = await http.encode(request, engine, parse, keep)
    return timed(response, request, *kept[0])


@work.post("/embed_sparse", response_model=None)
async def tei_embed_sparse(request: Request, engine: EngineDep) -> Response:
    """BM42 sparse vectors as ``[[{"index", "value"}]]``."""
    body = await http.read_body(request, engine)
    result, characters = await engine.handle(
        SPARSE, lambda: codec.sparse_request(body), scope_of(request)
    )
    response = ChunkedResponse([await engine.render(result, codec.sparse_response, characters)])
    return timed(response, request, characters, result.tokens)


@work.post("/rerank", response_model=None)
async def tei_rerank(request: Request, engine: EngineDep) -> Response:
    """Texts scored against a query by a reranker, best first: ``[{index, score, text?}]``."""
    body = await http.read_body(request, engine)
    result, (texts, return_text) = await engine.handle(
        RERANK, lambda: codec.rerank_request(body), scope_of(request)
    )
    response = ChunkedResponse([codec.rerank_response(result, texts, return_text)])
    return timed(response, request, sum(map(len, texts)), result.tokens)


@work.post("/predict", response_model=None)
async def tei_predict(request: Request, engine: EngineDep) -> Response:
    """A score per label of a text, a pair, or a list of them: ``[{score, label}]`` each."""
    body = await http.read_body(request, engine)
    result, single = await engine.handle(
        CLASSIFY, lambda: codec.predict_request(body), scope_of(request)
    )
    response = ChunkedResponse([codec.predict_response(result, single)])
    return timed(response, request, 0, result.tokens)


@work.post("/tokenize", response_model=None)
async def tei_tokenize(request: Request, engine: EngineDep) -> Response:
    """Each text's tokens: ``[[{"id", "text", "special", "start", "stop"}]]`` (character
    offsets into the text; a special token has none)."""
    body = await http.read_body(request, engine)
    result, texts = await engine.handle(
        TOKENIZE, lambda: codec.tokenize_request(body), scope_of(request)
    )
    return ChunkedResponse([codec.tokenize_response(result, texts)])


@work.post("/decode", response_model=None)
async def tei_decode(request: Request, engine: EngineDep) -> Response:
    """Token ids back to text, one string per list of ids."""
    body = await http.read_body(request, engine)
    result, _ = await engine.handle(DECODE, lambda: codec.decode_request(body), scope_of(request))
    return ChunkedResponse([codec.decode_response(result)])


PROTOCOL = Protocol("tei", routers, enabled=lambda settings: settings.tei)
