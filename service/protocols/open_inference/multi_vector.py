"""Late-interaction (multi-vector) models over the Open Inference Protocol (HTTP ``/v2``
and gRPC alike): ColBERT, bge-m3 and sentence-transformers MultiVectorEncoder exports.

Such a model's ``/v2`` model takes ``text`` BYTES [n], read as documents or, with
``parameters.input_type`` "query", as queries (``/v1/multi-vector``'s ``input_type``),
each cut to its side's length unless ``parameters.truncate`` is false. Its outputs, each
answered only where asked (``outputs``; none named: every one the model has), all from
one run of the multi-vector graph:

- ``multi_vectors``: FP32 [n, T, dim], each text's token vectors, zero-padded to the most
  any text keeps (T), FP16 with ``parameters.multi_vector_dtype`` "FP16";
- ``multi_vector_lengths``: INT32 [n], each text's count of vectors (its rows of T);
- ``dense``: FP32 [n, d], its pooled vector (models with a pooling, e.g. bge-m3);
- ``sparse_indices`` INT64 [nnz], ``sparse_values`` FP32 [nnz], ``sparse_lengths`` INT32
  [n]: its sparse vector (bge-m3), CSR-style: text i's are the next ``sparse_lengths[i]``.

Sent ``query`` BYTES [1] and ``documents`` BYTES [n] instead, it is a reranker's model
(``rerank.py``'s form): ``scores`` FP32 [n], each document's MaxSim with the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from service.engine import (
    MULTI_VECTOR,
    RERANK,
    ModelInfo,
    MultiVectorRequest,
    MultiVectorResult,
    RequestKind,
    RerankRequest,
    RerankResult,
)
from service.engine.kind import Serving, either
from service.errors import InvalidInput, quoted
from service.protocols.open_inference import rerank
from service.protocols.open_inference.tensors import (
    CLASSIFY_INPUTS,
    COST,
    OUTPUT_DENSE,
    OUTPUT_MULTI_VECTOR_LENGTHS,
    OUTPUT_MULTI_VECTORS,
    OUTPUT_SCORES,
    OUTPUT_SPARSE_INDICES,
    OUTPUT_SPARSE_LENGTHS,
    OUTPUT_SPARSE_VALUES,
    InputTensor,
    asks_scores,
    decode_input,
    is_multi_vector,
)

__all__ = ["LATE_INTERACTION", "is_multi_vector", "output_arrays", "request"]

SIDES = ("query", "document")
DTYPES = {"FP32": "<f4", "FP16": "<f2"}
# The engine's output (MultiVectorRequest.outputs) each tensor is made from.
ENGINE_OUTPUTS = {
    OUTPUT_MULTI_VECTORS: "multi_vector",
    OUTPUT_MULTI_VECTOR_LENGTHS: "multi_vector",
    OUTPUT_DENSE: "dense",
    OUTPUT_SPARSE_INDICES: "sparse",
    OUTPUT_SPARSE_VALUES: "sparse",
    OUTPUT_SPARSE_LENGTHS: "sparse",
}
# Beyond tensors.COST's floats (the padded vectors, priced padded by the engine): a sparse
# nonzero (counted as a listed token) is an INT64 and an FP32, raw or as JSON numbers (20
# digits and a comma; a float's 17); each text's two lengths (INT32: 11 characters and a
# comma as JSON).
COSTS = {
    True: replace(COST[True], per_token=8.0 + 4.0, per_sequence=2 * 4.0),
    False: replace(
        COST[False], per_token=21.0 + 17.0, per_sequence=COST[False].per_sequence + 2 * 12.0
    ),
}

Request = MultiVectorRequest | RerankRequest
Result = MultiVectorResult | RerankResult


def _kind(request: Request, serving: Serving) -> RequestKind[Request, Any, Result]:
    kind = RERANK if isinstance(request, RerankRequest) else MULTI_VECTOR
    return cast(RequestKind[Request, Any, Result], kind)


# Texts' vectors (MULTI_VECTOR), or documents scored against a query (RERANK: MaxSim on
# such a model), by the inputs sent.
LATE_INTERACTION = either("late_interaction", _kind)


def request(
    inputs: list[InputTensor], params: dict[str, Any], outputs: dict[str, bool], info: ModelInfo
) -> Request:
    """The input tensors, parameters and outputs asked -> the engine's request: a
    reranker's for a query and documents, else the texts' vectors."""
    if asks_scores([spec.name for spec in inputs]):
        others = [name for name in outputs if name != OUTPUT_SCORES]
        if others:
            raise InvalidInput(
                f"a query and documents are answered {OUTPUT_SCORES!r} only; {others} need "
                "input 'text'"
            )
        return rerank.rerank_request(inputs, params, info)
    if OUTPUT_SCORES in outputs:
        raise InvalidInput(f"output {OUTPUT_SCORES!r} needs inputs 'query' and 'documents'")
    allowed = {name: dtype for name, dtype, _ in CLASSIFY_INPUTS}
    if len(inputs) != 1:
        raise InvalidInput(
            f"a multi-vector model takes input 'text' (or 'query' and 'documents'): got "
            f"{len(inputs)} inputs"
        )
    _, texts = decode_input(inputs[0], allowed)
    input_type = params.get("input_type", "document")
    if input_type not in SIDES:
        raise InvalidInput(
            f"parameters.input_type must be one of {list(SIDES)}, got {quoted(input_type)}"
        )
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise InvalidInput("parameters.truncate must be true or false")
    dtype = params.get("multi_vector_dtype", "FP32")
    if dtype not in DTYPES:
        raise InvalidInput(
            f"parameters.multi_vector_dtype must be one of {list(DTYPES)}, got {quoted(dtype)}"
        )
    return MultiVectorRequest(
        # Read lazily: the engine checks their count before any is decoded.
        texts=cast(list[str], texts),
        wire_cost=COSTS[all(outputs.values())],
        model=info.name,
        input_type=input_type,
        outputs=tuple(dict.fromkeys(ENGINE_OUTPUTS[name] for name in outputs)),
        truncate=truncate,
        half=dtype == "FP16",
        field="text",
        padded=True,
    )


def output_arrays(result: MultiVectorResult, names: Sequence[str]) -> list[tuple[str, str, Any]]:
    """(name, datatype, little-endian array) of each requested output, in order."""
    items = result.items
    out: list[tuple[str, str, Any]] = []
    for name in names:
        if name == OUTPUT_MULTI_VECTORS:
            vectors = [x.vectors for x in items if x.vectors is not None]
            dtype = np.dtype(DTYPES["FP16" if vectors[0].dtype == np.float16 else "FP32"])
            most = max(len(v) for v in vectors)
            padded = np.zeros((len(vectors), most, vectors[0].shape[1]), dtype=dtype)
            for row, v in enumerate(vectors):
                padded[row, : len(v)] = v
            out.append((name, "FP16" if dtype == np.float16 else "FP32", padded))
        elif name == OUTPUT_MULTI_VECTOR_LENGTHS:
            counts = [len(x.vectors) for x in items if x.vectors is not None]
            out.append((name, "INT32", np.array(counts, dtype="<i4")))
        elif name == OUTPUT_DENSE:
            dense = np.stack([x.dense for x in items if x.dense is not None])
            out.append((name, "FP32", np.ascontiguousarray(dense, dtype="<f4")))
        else:
            sparse = [x.sparse for x in items if x.sparse is not None]
            if name == OUTPUT_SPARSE_INDICES:
                indices = [i for s in sparse for i in s.indices]
                out.append((name, "INT64", np.array(indices, dtype="<i8")))
            elif name == OUTPUT_SPARSE_VALUES:
                values = [v for s in sparse for v in s.values]
                out.append((name, "FP32", np.array(values, dtype="<f4")))
            else:
                lengths = [len(s.indices) for s in sparse]
                out.append((name, "INT32", np.array(lengths, dtype="<i4")))
    return out
