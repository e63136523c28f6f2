"""Rerankers over the Open Inference Protocol (HTTP ``/v2`` and gRPC alike).

A reranker's ``/v2`` model takes ``query`` BYTES [1] and ``documents`` BYTES [n] and
answers ``scores`` FP32 [n], in the documents' order (the client sorts): the scores
``/v1/rerank`` gives (the model's score function; ``parameters.raw_scores`` for the
logits), each document cut to fit unless ``parameters.truncate`` is false; an LLM
reranker's instruction is ``parameters.instruction``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from service.engine import ModelInfo, RerankRequest, RerankResult
from service.errors import InvalidInput, quoted
from service.protocols.open_inference.tensors import (
    RERANK_INPUTS,
    RERANK_OUTPUTS,
    InputTensor,
    Texts,
    decode_input,
)

INPUT_QUERY, INPUT_DOCUMENTS = (name for name, _, _ in RERANK_INPUTS)
OUTPUT_SCORES = RERANK_OUTPUTS[0][0]


def is_reranker(info: ModelInfo) -> bool:
    return info.manifest.task == "rerank"


def rerank_request(
    inputs: list[InputTensor], params: dict[str, Any], info: ModelInfo
) -> RerankRequest:
    """The ``query`` and ``documents`` tensors and parameters -> the engine's request."""
    allowed = {name: dtype for name, dtype, _ in RERANK_INPUTS}
    tensors: dict[str, Texts] = {}
    for spec in inputs:
        name, tensor = decode_input(spec, allowed)
        if name in tensors:
            raise InvalidInput(f"input {quoted(name)} is given twice")
        tensors[name] = cast(Texts, tensor)
    missing = [name for name in allowed if name not in tensors]
    if missing:
        raise InvalidInput(f"a reranker takes inputs {sorted(allowed)}: {missing} missing")
    query = tensors[INPUT_QUERY]
    if len(query) != 1:
        raise InvalidInput(f"input 'query' must hold one string, got {len(query)}")
    for key in ("raw_scores", "truncate"):
        if not isinstance(params.get(key, True), bool):
            raise InvalidInput(f"parameters.{key} must be true or false")
    instruction = params.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise InvalidInput("parameters.instruction must be a string")
    return RerankRequest(
        query=str(query[0]),
        # Read lazily: the engine checks their count before any is decoded.
        documents=cast(Sequence[str], tensors[INPUT_DOCUMENTS]),  # type: ignore[arg-type]
        model=info.name,
        raw_scores=params.get("raw_scores", False),
        truncate=params.get("truncate", True),
        instruction=instruction,
    )


def scores(result: RerankResult) -> np.ndarray:
    """FP32 [n] little-endian, in the documents' order."""
    out = np.zeros(len(result.results), dtype="<f4")
    for ranked in result.results:
        out[ranked.index] = ranked.score
    return out
