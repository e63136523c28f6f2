"""TEI's request bodies (its ``router/src/http/types.rs``, 1.9): small fields validated
here; unknown fields are ignored, as TEI ignores them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.protocols.quantized import QuantizedOptions

Texts = str | list[str]


class Truncation(BaseModel):
    """How to cut texts longer than the model takes."""

    model_config = ConfigDict(extra="ignore")
    truncate: bool | None = Field(
        None, description="Cut texts to the model's length; default: the server's (off)."
    )
    truncation_direction: Literal["Right", "right", "Left", "left"] = "Right"


class CutOptions(Truncation):
    """What every TEI embedding route takes besides its inputs: how to cut them, a prompt."""

    prompt_name: str | None = Field(
        None,
        max_length=64,
        description="One of the model's prompts (sentence-transformers'), prepended to each "
        "input; default: the model's default prompt, if it has one.",
    )


class TextOptions(CutOptions):
    inputs: Texts = Field(description="A text or a list of texts; one answer each.")


class TaskOption(BaseModel):
    """The task adapter of a model that has them (the embedding routes)."""

    task: str | None = Field(
        None,
        max_length=64,
        description="Not TEI's: models with task adapters (Jina v3's LoRA: "
        "retrieval.query, retrieval.passage, text-matching…), the task whose adapter runs "
        "(a wrong name's 422 lists them); default: the model's default task, else none.",
    )


class EmbedRequest(TextOptions, TaskOption, QuantizedOptions):
    """``POST /embed`` and ``POST /`` (huggingface_hub's feature_extraction); not TEI's:
    embedding_type and quantization_ranges (quantized vectors as JSON integers)."""

    normalize: bool = Field(True, description="L2-normalise each vector (TEI's default).")
    dimensions: int | None = Field(
        None, description="Matryoshka truncation (models trained for it)."
    )
    encoding_format: Literal["float"] = "float"


class EmbedAllRequest(TextOptions, TaskOption):
    """``POST /embed_all``: every token's embedding (special tokens included)."""


class EmbedSparseRequest(TextOptions):
    """``POST /embed_sparse``: BM42 vectors in TEI's ``[[{index, value}]]`` shape."""


class TokenizeRequest(TextOptions):
    """``POST /tokenize``: each text's tokens, with where they came from."""

    add_special_tokens: bool = Field(True, description="Include the model's [CLS], [SEP]...")


class DecodeRequest(BaseModel):
    """``POST /decode``: token ids back to text."""

    model_config = ConfigDict(extra="ignore")
    ids: list[int] | list[list[int]] = Field(description="One list of ids, or several.")
    skip_special_tokens: bool = True


class SimilarityInputs(BaseModel):
    source_sentence: str
    sentences: list[str]


class SimilarityRequest(CutOptions):
    """``POST /similarity``: cosine of the source sentence with each of the sentences."""

    inputs: SimilarityInputs


class RerankRequest(Truncation):
    """``POST /rerank``: texts scored against a query by a reranker (cross-encoder); with
    truncate, each text is cut so its pair fits the model (the query never is)."""

    query: str
    texts: list[str]
    raw_scores: bool = Field(False, description="The logits, not the model's score function.")
    return_text: bool = Field(False, description="Each result with its text.")
    instruction: str | None = Field(
        None,
        description="LLM rerankers: the task instruction filled into the model's prompt "
        "(not TEI's: attnserve's field); default the model's own.",
    )


# A text, or a pair read together ([a, b]); TEI's Sequence.
Sequence = str | Annotated[list[str], Field(min_length=2, max_length=2)]


class PredictRequest(Truncation):
    """``POST /predict``: a score per label, for classification models."""

    inputs: Sequence | list[Sequence] = Field(
        description="A text, a pair [a, b], or a list of texts and pairs."
    )
    raw_scores: bool = Field(False, description="The logits, not the model's score function.")


class ErrorBody(BaseModel):
    error: str
    error_type: str
