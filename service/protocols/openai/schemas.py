"""OpenAI's embeddings wire contract, as pydantic models (for validation and OpenAPI).

``input`` is decoded by the codec, not pydantic, so a list of a million items is
refused by the engine's count limit before a million objects are validated.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.protocols.quantized import QuantizedOptions

EncodingFormat = Literal["float", "base64"]


class EmbeddingsOptions(QuantizedOptions):
    """Every field of an embeddings request except ``input`` (embedding_type and
    quantization_ranges are not OpenAI's: the openai client sends them with extra_body)."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="Model name, as GET /v1/models lists it.")
    encoding_format: EncodingFormat = Field(
        "float",
        description="float: JSON numbers; base64: standard base64 of little-endian float32.",
    )
    dimensions: int | None = Field(
        None,
        ge=1,
        description="Shorten each vector to this many dimensions (then renormalise); only "
        "for models whose manifest declares Matryoshka dimensions.",
    )
    user: str | None = Field(None, description="Accepted and ignored.")
    prompt_name: str | None = Field(
        None,
        max_length=64,
        description="Not OpenAI's: one of the model's prompts (sentence-transformers'), "
        "prepended to each text (the openai client sends it with extra_body); default: "
        "the model's default prompt, if it has one.",
    )
    task: str | None = Field(
        None,
        max_length=64,
        description="Not OpenAI's: models with task adapters (Jina v3's LoRA: "
        "retrieval.query, retrieval.passage, text-matching…), the task whose adapter runs "
        "(the openai client sends it with extra_body; a wrong name's 422 lists them); "
        "default: the model's default task, else none.",
    )


class EmbeddingsRequest(EmbeddingsOptions):
    """``POST /v1/embeddings``."""

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text, a list of texts, or token ids of the model's own tokenizer "
        "(one list of ints, or a list of them)."
    )


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="The vector, or its base64 form.")


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail
