"""``POST /v1/embeddings``: OpenAI's embeddings API (``GET /v1/models`` is the native one,
whose cards carry OpenAI's model fields)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.engine.scope import Access
from service.protocols import http
from service.protocols.http import EngineDep, json_request_body, protocol_route
from service.protocols.openai import codec
from service.protocols.openai.errors import render
from service.protocols.openai.schemas import EmbeddingsRequest, EmbeddingsResponse, OpenAIError
from service.protocols.protocol import Protocol

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIError, "description": text}
    for code, text in (
        (400, "Malformed or invalid request, or a text beyond the model's length."),
        (401, "Missing or wrong API key, when the server has one."),
        (404, "Unknown model."),
        (413, "Too many inputs or tokens, body or response too large."),
        (415, "Content-Type is not application/json."),
        (429, "Too many requests in progress; honour Retry-After."),
        (503, "Models not loaded or warm-up not finished."),
    )
}

router = APIRouter(prefix="/v1", tags=["openai"], route_class=protocol_route(render, Access.WORK))
routers = (router,)


@router.post(
    "/embeddings",
    response_model=None,
    responses={200: {"model": EmbeddingsResponse}, **ERROR_RESPONSES},
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
