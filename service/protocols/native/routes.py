"""Native routes: ``/v1/encode``, ``/v1/tokenize``, ``/v1/embed_sparse``, ``/v1/rerank``,
``/v1/classify``, ``/v1/explain/similarity``, ``/v1/models``, health and metrics.

Routes move bytes: body -> codec -> engine -> codec -> bytes. No limit, no
array math and no model logic lives here.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.engine import (
    CLASSIFY,
    ENCODE_OR_MULTI_VECTOR,
    MULTI_VECTOR,
    RERANK,
    SIMILARITY,
    SPARSE,
    TOKENIZE,
    ModelInfo,
)
from service.engine.scope import Access
from service.protocols import http
from service.protocols.context import scope_of
from service.protocols.http import (
    ChunkedResponse,
    EngineDep,
    error_responses,
    json_request_body,
    protocol_route,
)
from service.protocols.native import classify, codec
from service.protocols.native.errors import render
from service.protocols.native.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    EmbedSparseRequest,
    EmbedSparseResponse,
    EncodeOutputsResponse,
    EncodeRequest,
    EncodeResponse,
    ErrorBody,
    Health,
    ModelCard,
    ModelList,
    MultiVectorRequest,
    MultiVectorResponse,
    RerankRequest,
    RerankResponse,
    SimilarityRequest,
    SimilarityResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from service.protocols.protocol import Protocol


def routed(access: Access, **router: Any) -> APIRouter:
    """A router whose routes enter the scope with ``access`` and document its errors."""
    return APIRouter(
        route_class=protocol_route(render, access, "native"),
        responses=error_responses(ErrorBody, access),
        **router,
    )


health = routed(Access.OPEN, tags=["health"])
models = routed(Access.GUARDED, prefix="/v1", tags=["models"])
encode = routed(Access.WORK, prefix="/v1", tags=["encode"])
# Cohere's v2 client (cohere.ClientV2, LangChain's CohereRerank) posts to /v2/rerank; the
# Open Inference Protocol's /v2 routes are /v2/models/... and /v2/repository/..., apart.
cohere_v2 = routed(Access.WORK, prefix="/v2", tags=["encode"])
metrics = routed(Access.OPEN, tags=["metrics"])
routers = (health, models, encode, cohere_v2, metrics)


@health.api_route(
    "/health/live",
    methods=["GET", "HEAD"],
    response_model=Health,
)
async def live(engine: EngineDep) -> Health:
    """The process is up and able to serve (503 once its warm-up has failed for good)."""
    engine.check_live()
    return Health(status="alive")


@health.api_route(
    "/health/ready",
    methods=["GET", "HEAD"],
    response_model=Health,
)
async def ready(engine: EngineDep) -> Health:
    """Models are loaded, a warm-up inference passed, the server is not shutting down and
    can take one more request now (503 while saturated, so balancers route elsewhere)."""
    engine.check_ready()
    return Health(status="ready")


def model_card(info: ModelInfo, default: bool) -> ModelCard:
    manifest, cfg = info.manifest, info.config
    return ModelCard(
        id=info.name,
        created=info.created,
        name=info.name,
        d_model=cfg.d_model,
        dimensions=info.pooled_width,
        heads=cfg.n_heads,
        layers=cfg.n_layers,
        d_ff=cfg.d_ff,
        max_seq_len=info.max_seq_len,
        max_seq_len_by=info.max_seq_len_by,
        causal=cfg.causal,
        window=cfg.window,
        scoring=cfg.scoring,
        norm_placement=cfg.norm_placement,
        activation=cfg.activation,
        opset=manifest.opset,
        sha256=manifest.files(),
        tokenizer=info.has_tokenizer,
        pooling=manifest.pooling,
        normalize=manifest.normalize,
        hidden_states=manifest.has_hidden_states,
        matryoshka_dimensions=list(manifest.matryoshka_dimensions),
        prompts=dict(manifest.prompts),
        default_prompt_name=manifest.default_prompt_name,
        include_prompt=manifest.include_prompt,
        task=manifest.task,
        labels=list(manifest.head.labels) if manifest.head is not None else [],
        tasks=list(manifest.tasks),
        default_task=manifest.default_task,
        late_interaction=manifest.late_interaction is not None,
        default=default,
    )


@models.get("/models", response_model=ModelList)
async def list_models(engine: EngineDep) -> ModelList:
    """Every model this server serves (OpenAI's ``GET /v1/models`` reads this too)."""
    return ModelList(
        data=[model_card(info, info.name == engine.default_model) for info in engine.models()]
    )


@models.get("/models/{name}", response_model=ModelCard)
async def get_model(name: str, engine: EngineDep) -> ModelCard:
    """One model's architecture, limits, pooling and file digests."""
    info = engine.model(name)
    return model_card(info, info.name == engine.default_model)


@encode.post(
    "/encode",
    response_model=None,
    responses={200: {"model": EncodeResponse | EncodeOutputsResponse}},
    openapi_extra=json_request_body("EncodeRequest"),
)
async def encode_sequences(request: Request, engine: EngineDep) -> Response:
    """Contextualized embeddings (and optionally attention weights) for token embeddings."""
    return await http.encode_as(
        ENCODE_OR_MULTI_VECTOR,
        request,
        engine,
        codec.encode_request,
        codec.encode_or_outputs_response,
    )


@encode.post(
    "/tokenize",
    response_model=None,
    responses={200: {"model": TokenizeResponse}},
    openapi_extra=json_request_body("TokenizeRequest"),
)
async def tokenize_texts(request: Request, engine: EngineDep) -> Response:
    """Texts -> tokens, ids and the encoder's input embeddings (models with a tokenizer)."""
    body = await http.read_body(request, engine)
    result, fmt = await engine.handle(
        TOKENIZE, lambda: codec.tokenize_request(body), scope_of(request)
    )
    return ChunkedResponse([codec.tokenize_response(result, fmt)])


@encode.post(
    "/embed_sparse",
    response_model=None,
    responses={200: {"model": EmbedSparseResponse}},
    openapi_extra=json_request_body("EmbedSparseRequest"),
)
async def embed_sparse(request: Request, engine: EngineDep) -> Response:
    """BM42 sparse vectors (hybrid search; fastembed's indices) of texts."""
    body = await http.read_body(request, engine)
    result, return_text = await engine.handle(
        SPARSE, lambda: codec.sparse_request(body), scope_of(request)
    )
    return ChunkedResponse([await engine.render(result, codec.sparse_response, return_text)])


@encode.post(
    "/multi-vector",
    response_model=None,
    responses={200: {"model": MultiVectorResponse}},
    openapi_extra=json_request_body("MultiVectorRequest"),
)
async def multi_vector(request: Request, engine: EngineDep) -> Response:
    """A vector per token of texts read as queries or documents (late interaction:
    ColBERT, bge-m3), with the dense and sparse vectors of the same run where asked."""
    body = await http.read_body(request, engine)
    result, embedding_type = await engine.handle(
        MULTI_VECTOR, lambda: codec.multi_vector_request(body), scope_of(request)
    )
    return ChunkedResponse(
        [await engine.render(result, codec.multi_vector_response, embedding_type)]
    )


@cohere_v2.post("/rerank", response_model=None, include_in_schema=False)
@encode.post(
    "/rerank",
    response_model=None,
    responses={200: {"model": RerankResponse}},
    openapi_extra=json_request_body("RerankRequest"),
)
async def rerank(request: Request, engine: EngineDep) -> Response:
    """Documents scored against a query by a reranker (cross-encoder), best first, in
    Cohere's and Jina's shape; with return_attention, why each ranked."""
    body = await http.read_body(request, engine)
    result, (documents, return_documents) = await engine.handle(
        RERANK, lambda: codec.rerank_request(body), scope_of(request)
    )
    write = partial(codec.rerank_response, result, documents, return_documents)
    # Attention answers can be large: written on a codec thread, never on the event loop.
    explained = any(r.explanation is not None for r in result.results)
    answer = await engine.off_loop(write) if explained else write()
    return ChunkedResponse([answer])


@encode.post(
    "/classify",
    response_model=None,
    responses={200: {"model": ClassifyResponse}},
    openapi_extra=json_request_body("ClassifyRequest"),
)
async def classify_texts(request: Request, engine: EngineDep) -> Response:
    """A score per label of each text or pair by a classifier, named by ``model`` (TEI's
    ``/predict`` serves only the default model): each input's best label and its labels
    best first."""
    body = await http.read_body(request, engine)
    result, top_k = await engine.handle(
        CLASSIFY, lambda: classify.classify_request(body), scope_of(request)
    )
    return ChunkedResponse([classify.classify_response(result, top_k)])


@encode.post(
    "/explain/similarity",
    response_model=None,
    responses={200: {"model": SimilarityResponse}},
    openapi_extra=json_request_body("SimilarityRequest"),
)
async def explain_similarity(request: Request, engine: EngineDep) -> Response:
    """Why a query and documents match (mean-pooled models): each served cosine split
    exactly into token-pair contributions, the top pairs and per-token totals."""
    body = await http.read_body(request, engine)
    result, fmt = await engine.handle(
        SIMILARITY, lambda: codec.similarity_request(body), scope_of(request)
    )
    return ChunkedResponse([await engine.render(result, codec.similarity_response, fmt)])


@metrics.api_route("/metrics", methods=["GET", "HEAD"], response_class=Response)
async def prometheus_metrics(engine: EngineDep) -> Response:
    """Prometheus text exposition."""
    return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def openapi_components() -> dict[str, Any]:
    """Schemas referenced by hand (the encode body is parsed by the codec, not FastAPI)."""
    components: dict[str, Any] = {}
    for model in (
        EncodeRequest,
        TokenizeRequest,
        EmbedSparseRequest,
        MultiVectorRequest,
        RerankRequest,
        ClassifyRequest,
        SimilarityRequest,
    ):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


PROTOCOL = Protocol("native", routers, openapi_components)
