"""``POST /v1/rerank`` in the shape Cohere's and Jina's rerank APIs share, which their
SDKs and the Cohere/Jina rerankers of LangChain and LlamaIndex parse: ``{id, model,
results: [{index, relevance_score, document?: {text}}], meta, usage}``, the highest
score first. Documents are strings, or objects with ``text`` (Cohere v1 and Jina
accept both). Fields those clients send that change nothing here (``rank_fields``,
``max_chunks_per_doc``) are ignored; ``max_tokens_per_doc`` is the model's window.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.engine import PairsRequest, PairsResult
from service.protocols import wire


class Document(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str


class RerankRequest(BaseModel):
    """A query and documents scored by a cross-encoder (a reranker model)."""

    model_config = ConfigDict(extra="ignore")
    query: str = Field(description="The query each document is scored against.")
    documents: list[str | Document] = Field(
        description="The documents: strings, or objects with `text`; one score each."
    )
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    top_n: int | None = Field(None, description="Return the best n (>= 1); default: all.")
    return_documents: bool = Field(False, description="Each result carries its document.")
    raw_scores: bool = Field(False, description="The logit, not the checkpoint's activation.")
    truncate: bool = Field(
        True, description="Cut each document to fit the model's window (else 413 when over)."
    )
    truncation_direction: Literal["right", "left"] = Field(
        "right", description="With truncate: keep a document's first tokens (right) or last."
    )


class RerankResult(BaseModel):
    index: int = Field(description="The document's position in the request.")
    relevance_score: float
    document: Document | None = Field(None, description="With return_documents.")


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    meta: dict[str, object]
    usage: dict[str, int]


def request(body: bytes) -> tuple[PairsRequest, tuple[int | None, list[str] | None]]:
    """A body -> the engine's request, and (top_n, the documents to return or None)."""
    from service.errors import InvalidInput

    options = wire.parse_options(RerankRequest, wire.parse_json_object(body))
    if options.top_n is not None and options.top_n < 1:
        raise InvalidInput(f"must be at least 1, got {options.top_n}", field=("top_n",))
    texts = [d if isinstance(d, str) else d.text for d in options.documents]
    pairs = PairsRequest(
        task="rerank",
        model=options.model,
        query=options.query,
        documents=texts,
        raw_scores=options.raw_scores,
        truncate=options.truncate,
        truncation_direction=options.truncation_direction,
    )
    return pairs, (options.top_n, texts if options.return_documents else None)


def response(result: PairsResult, kept: tuple[int | None, list[str] | None]) -> bytes:
    top_n, texts = kept
    scores = result.scores[:, 0]
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[:top_n]
    return wire.dumps(
        {
            "id": str(uuid.uuid4()),
            "model": result.model,
            "results": [
                {
                    "index": i,
                    "relevance_score": float(scores[i]),
                    **({"document": {"text": texts[i]}} if texts is not None else {}),
                }
                for i in order
            ],
            "meta": {
                "api_version": {"version": "2"},
                "billed_units": {"search_units": 1},
            },
            "usage": {"total_tokens": result.tokens, "prompt_tokens": result.tokens},
        }
    )
