"""TEI's request bodies (its ``router/src/http/types.rs``, 1.9): small fields validated
here; unknown fields are ignored, as TEI ignores them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Texts = str | list[str]


class EmbedRequest(BaseModel):
    """``POST /embed`` and ``POST /`` (huggingface_hub's feature_extraction)."""

    model_config = ConfigDict(extra="ignore")
    inputs: Texts = Field(description="A text or a list of texts; one vector each.")
    normalize: bool = Field(True, description="L2-normalise each vector (TEI's default).")
    truncate: bool | None = Field(
        None, description="Cut texts to the model's length; default: the server's (off)."
    )
    truncation_direction: Literal["Right", "right", "Left", "left"] = "Right"
    prompt_name: str | None = Field(None, description="Not supported: models declare none.")
    dimensions: int | None = Field(
        None, description="Matryoshka truncation (models trained for it)."
    )
    encoding_format: Literal["float"] = "float"


class EmbedAllRequest(BaseModel):
    """``POST /embed_all``: every token's embedding (special tokens included)."""

    model_config = ConfigDict(extra="ignore")
    inputs: Texts
    truncate: bool | None = None
    truncation_direction: Literal["Right", "right", "Left", "left"] = "Right"
    prompt_name: str | None = None


class EmbedSparseRequest(BaseModel):
    """``POST /embed_sparse``: BM42 vectors in TEI's ``[[{index, value}]]`` shape."""

    model_config = ConfigDict(extra="ignore")
    inputs: Texts
    truncate: bool | None = None
    truncation_direction: Literal["Right", "right", "Left", "left"] = "Right"
    prompt_name: str | None = None


class SimilarityInputs(BaseModel):
    source_sentence: str
    sentences: list[str]


class SimilarityRequest(BaseModel):
    """``POST /similarity``: cosine of the source sentence with each of the sentences."""

    model_config = ConfigDict(extra="ignore")
    inputs: SimilarityInputs
    truncate: bool | None = None
    truncation_direction: Literal["Right", "right", "Left", "left"] = "Right"
    prompt_name: str | None = None


class ErrorBody(BaseModel):
    error: str
    error_type: str
