"""``POST /v1/embeddings``: OpenAI's embeddings API (``GET /v1/models`` is the native one,
whose cards carry OpenAI's model fields)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.engine.scope import Access
from service.protocols import http
from service.protocols.http import EngineDep, error_responses, json_request_body, protocol_route
from service.protocols.openai import codec
from service.protocols.openai.errors import render, status_for
from service.protocols.openai.schemas import EmbeddingsRequest, EmbeddingsResponse, OpenAIError
from service.protocols.protocol import Protocol

router = APIRouter(
    prefix="/v1",
    tags=["openai"],
    route_class=protocol_route(render, Access.WORK, "openai"),
    responses=error_responses(OpenAIError, Access.WORK, status_for),
)
routers = (router,)


@router.post(
    "/embeddings",
    response_model=None,
    responses={200: {"model": EmbeddingsResponse}},
    openapi_extra=json_request_body("EmbeddingsRequest"),
)
async def create_embeddings(request: Request, engine: EngineDep) -> Response:
    """One L2-normalised vector per input (the model's own pooling), as OpenAI answers."""
    truncate = engine.settings.openai_truncate
    return await http.encode(
        request,
        engine,
        lambda body: codec.embeddings_request(body, truncate=truncate),
        codec.embeddings_response,
    )


def openapi_components() -> dict[str, Any]:
    schema = EmbeddingsRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    return {**schema.pop("$defs", {}), "EmbeddingsRequest": schema}


PROTOCOL = Protocol("openai", routers, openapi_components)
