"""Native bodies <-> the engine's types: ``/v1/encode``, ``/v1/tokenize``, ``/v1/rerank``,
``/v1/explain/similarity``.

Input arrays are nested JSON floats or ``{"shape", "data"}`` base64 objects;
they are decoded straight to numpy (never through pydantic) and only once the
engine has checked the request's counts and lengths.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import math
import uuid
from functools import partial
from typing import Any

import numpy as np

from service.engine import (
    ArrayInput,
    AttentionSpec,
    EncodeRequest,
    EncodeResult,
    InputItem,
    MaxSimExplanation,
    MultiVectorItem,
    MultiVectorResult,
    Ranked,
    RerankRequest,
    RerankResult,
    SimilarityExplanation,
    SimilarityRequest,
    SimilarityResult,
    SpannedText,
    SparseRequest,
    SparseResult,
    TokenizeRequest,
    TokenizeResult,
    WireCost,
)
from service.engine import MultiVectorRequest as EngineMultiVectorRequest
from service.engine import Prune as EnginePrune
from service.errors import InvalidInput
from service.protocols import wire
from service.protocols.native.schemas import (
    AttentionOptions,
    EmbedSparseRequest,
    EncodeOptions,
    EncodeOutputsOptions,
)
from service.protocols.native.schemas import MultiVectorRequest as MultiVectorBody
from service.protocols.native.schemas import RerankRequest as RerankBody
from service.protocols.native.schemas import SimilarityRequest as SimilarityBody
from service.protocols.native.schemas import TokenizeRequest as TokenizeBody
from service.protocols.quantized import pooled_array

ARRAYS = {"float": wire.JSON_ARRAYS, "base64": wire.BASE64_ARRAYS}
# Upper bounds of an answer's envelope: {"model":..,"data":[..],"usage":{..}} once, and per
# item {"index":N,"tokens":[..],"embeddings":..,"attention":..,"attention_indices":..,
# "attention_summaries":{name: ..},"hidden_states":..,"pooled":..} (nulls and the six
# summary names included),
# each listed token "..", (and, for /v1/tokenize, its id).
ENCODE_COST = {
    fmt: WireCost(**arrays, per_sequence=256.0, per_token=3.0, fixed=128.0)
    for fmt, arrays in ARRAYS.items()
}
# /v1/embed_sparse: per nonzero its index and value (and with return_text its token or
# stem, "..",); per vector {"index":N,"indices":[..],"values":[..],"text":[..]}.
SPARSE_COST = WireCost(
    per_float=wire.JSON_SPARSE_INDEX + wire.JSON_SPARSE_VALUE,
    per_array=8.0,
    per_sequence=64.0,
    per_token=3.0,
    fixed=128.0,
)
# /v1/multi-vector: per item {"object":"embeddings","index":N,"embeddings":..,"dense":..,
# "sparse":{"indices":[..],"values":[..],"text":[..]}}; a sparse nonzero is counted as a
# listed token (``multi_vector.answer_shape``): its index, value and token "..",.
MULTI_VECTOR_COST = {
    fmt: WireCost(
        **arrays,
        per_sequence=192.0,
        per_token=3.0 + wire.JSON_SPARSE_INDEX + wire.JSON_SPARSE_VALUE,
        fixed=128.0,
    )
    for fmt, arrays in ARRAYS.items()
}
TOKENIZE_COST = {
    fmt: WireCost(**arrays, per_sequence=96.0, per_token=3.0 + 12.0, fixed=128.0)
    for fmt, arrays in ARRAYS.items()
}


def attention_spec(options: AttentionOptions) -> AttentionSpec:
    """The attention selection of a request's ``attention`` object."""
    return AttentionSpec(
        options.layers,
        options.heads,
        options.reduce,
        options.measure,
        top_k=options.top_k,
        threshold=options.threshold,
        dtype=options.dtype,
        maps=options.maps,
        summaries=tuple(options.summaries or ()),
        summaries_per_token=options.summaries_per_token,
    )


def encode_request(body: bytes) -> tuple[EncodeRequest | EngineMultiVectorRequest, str]:
    """An encode body -> (EncodeRequest, encoding format of its answer); with ``output``,
    a multi-vector request instead (``_outputs_request``); InvalidJSON or InvalidInput on
    a malformed one."""
    payload = wire.parse_json_object(body)
    if "inputs" not in payload:
        raise InvalidInput(
            "is required: a list of [seq_len, d_model] arrays or texts", field=("inputs",)
        )
    raw_inputs = payload.pop("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInput("must be a list of sequences", field=("inputs",))
    if "output" in payload:  # one key look-up on the encode path
        return _outputs_request(raw_inputs, payload)
    options = wire.parse_options(EncodeOptions, payload)
    request = EncodeRequest(
        inputs=wire.LazyItems(raw_inputs, _input_item),
        wire_cost=ENCODE_COST[options.encoding_format],
        model=options.model,
        return_attention=options.return_attention,
        attention=attention_spec(options.attention),
        return_hidden_states=options.return_hidden_states,
        hidden_layers=options.hidden_states.layers,
        pooling=options.pooling,
        normalize=options.normalize,
        embedding_type=options.embedding_type,
        quantization_ranges=options.ranges(),
        return_embeddings=wants_embeddings(options),
        truncate=options.truncate,
        truncation_direction=options.truncation_direction,
        prompt_name=options.prompt_name,
        prompt=options.prompt,
        task=options.task,
    )
    return request, options.encoding_format


def _outputs_request(
    raw_inputs: list[Any], payload: dict[str, Any]
) -> tuple[EngineMultiVectorRequest, str]:
    """An encode body with ``output``: its texts' late-interaction outputs of one run, as
    /v1/multi-vector's request (the model's own refusal if it has no late interaction)."""
    options = wire.parse_options(EncodeOutputsOptions, payload)
    for item in raw_inputs:
        if not isinstance(item, str):
            raise InvalidInput(
                "takes texts only: inputs must be strings (arrays, token ids and spans "
                "take no output)",
                field=("output",),
            )
    request = EngineMultiVectorRequest(
        texts=raw_inputs,
        wire_cost=MULTI_VECTOR_COST[options.encoding_format],
        model=options.model,
        input_type=options.input_type,
        outputs=tuple(dict.fromkeys(options.output)),
        truncate=options.truncate,
        return_text=options.return_text,
        field="inputs",
    )
    return request, options.encoding_format


def encode_or_outputs_response(
    result: EncodeResult | MultiVectorResult, encoding_format: str
) -> bytes:
    """/v1/encode's answer: ``encode_response``'s, or with ``output`` each item's outputs
    under their names (``{"model", "data": [{"index", "multi_vector", "dense",
    "sparse"}], "usage"}``, each only where asked)."""
    if isinstance(result, EncodeResult):
        return encode_response(result, encoding_format)

    return wire.dumps(
        {
            "model": result.model,
            "data": [
                late_item(x, encoding_format, "multi_vector", {"index": i})
                for i, x in enumerate(result.items)
            ],
            "usage": {"sequences": len(result.items), "tokens": result.tokens},
        }
    )


def wants_embeddings(options: EncodeOptions) -> bool:
    """Per-token embeddings are returned unless pooling replaces them (overridable)."""
    if options.return_embeddings is not None:
        return options.return_embeddings
    return options.pooling == "none"


def _input_item(index: int, item: Any) -> InputItem:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and "text" in item:
        return _spanned_text(item, ("inputs", index))
    if isinstance(item, dict):  # its form is cheap to check: before any length is judged
        _check_base64_object(item, ("inputs", index))
    return ArrayInput(rows=_declared_length(item), decode=partial(_decode_array, item, index))


def _spanned_text(item: dict[str, Any], where: tuple[str | int, ...]) -> SpannedText:
    """``{"text", "spans": [[start, end], ...]}``: character offsets, end exclusive, each
    within the text, non-empty and not overlapping another (late chunking)."""
    unknown = set(item) - {"text", "spans"}
    if unknown:
        raise InvalidInput(f"unknown keys {sorted(unknown)}", field=where)
    text, spans = item["text"], item.get("spans")
    if not isinstance(text, str):
        raise InvalidInput("must be a string", field=(*where, "text"))
    if not isinstance(spans, list) or not spans:
        raise InvalidInput(
            "must be a non-empty list of [start, end] pairs", field=(*where, "spans")
        )
    pairs: list[tuple[int, int]] = []
    for k, span in enumerate(spans):
        at = (*where, "spans", k)
        if (
            not isinstance(span, list)
            or len(span) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)
        ):
            raise InvalidInput("must be [start, end]: two integers", field=at)
        begin, end = span
        if not 0 <= begin < end <= len(text):
            problem = "is empty or reversed" if begin >= end else "is outside the text"
            raise InvalidInput(
                f"[{begin}, {end}) {problem}: spans are character offsets with "
                f"0 <= start < end <= {len(text)} (the text's length)",
                field=at,
            )
        pairs.append((begin, end))
    order = sorted(range(len(pairs)), key=lambda k: pairs[k])
    for before, after in itertools.pairwise(order):
        if pairs[after][0] < pairs[before][1]:
            raise InvalidInput(
                f"[{pairs[after][0]}, {pairs[after][1]}) overlaps span {before} "
                f"[{pairs[before][0]}, {pairs[before][1]})",
                field=(*where, "spans", after),
            )
    return SpannedText(text, tuple(pairs))


def _declared_length(item: Any) -> int | None:
    """Sequence length of an input item without decoding it (for early limit checks)."""
    if isinstance(item, list):
        return len(item)
    if isinstance(item, dict) and isinstance(item.get("shape"), list) and item["shape"]:
        first = item["shape"][0]
        return first if isinstance(first, int) and not isinstance(first, bool) else None
    return None


def _decode_array(item: Any, index: int) -> np.ndarray:
    """One input item -> a float32 array (the engine checks its shape against the model)."""
    where = ("inputs", index)
    if isinstance(item, dict):
        return _decode_base64_array(item, where)
    if isinstance(item, list):
        parsed = wire.float32_numbers(item)  # beyond float32 is inf, refused as such
        if parsed is None:
            raise InvalidInput(
                "must be a rectangular [seq_len, d_model] array of numbers", field=where
            )
        return parsed
    raise InvalidInput(
        "must be a [seq_len, d_model] array, a {shape, data} base64 object or a text",
        field=where,
    )


def _check_base64_object(item: dict[str, Any], where: tuple[str | int, ...]) -> None:
    """Keys, dtype, shape and data's type of a {shape, data, dtype} object (no decoding)."""
    unknown = set(item) - {"shape", "data", "dtype"}
    if unknown:
        raise InvalidInput(f"unknown keys {sorted(unknown)}", field=where)
    shape, data = item.get("shape"), item.get("data")
    if item.get("dtype", "float32") != "float32":
        raise InvalidInput("dtype must be 'float32'", field=where)
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):
        raise InvalidInput(
            "'shape' must be [seq_len, d_model]: rank 2, non-negative integers", field=where
        )
    if not isinstance(data, str):
        raise InvalidInput("'data' must be a base64 string", field=where)


def _decode_base64_array(item: dict[str, Any], where: tuple[str | int, ...]) -> np.ndarray:
    _check_base64_object(item, where)
    shape, data = item["shape"], item["data"]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("'data' is not valid base64", field=where) from None
    expected = math.prod(shape) * wire.FLOAT32_LE.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"'data' holds {len(raw)} bytes but shape {shape} needs {expected}", field=where
        )
    try:
        array = np.frombuffer(raw, dtype=wire.FLOAT32_LE).reshape(shape)
    except ValueError:  # e.g. a dimension beyond what numpy can index
        raise InvalidInput(f"'shape' {shape} cannot be represented", field=where) from None
    return array.astype(np.float32, copy=False)


def encode_array(array: np.ndarray, encoding_format: str) -> Any:
    """Answer form of an array: itself (orjson writes it) or a Base64Array dict; quantized
    vectors as integers (``quantized.pooled_array``)."""
    quantized = pooled_array(array, encoding_format)
    if quantized is not None:
        return quantized
    if array.dtype in (np.float16, np.int32):  # attention asked as float16, its key indices
        array = wire.little_endian(array)
        if encoding_format == "base64":
            data = wire.base64_value(array.tobytes())
            return {"shape": list(array.shape), "dtype": array.dtype.name, "data": data}
        return array if array.dtype == np.int32 else array.astype(np.float32)
    array = wire.float32_le(array)
    if encoding_format == "base64":
        return {"shape": list(array.shape), "dtype": "float32", "data": wire.base64_float32(array)}
    return array


def encode_response(result: EncodeResult, encoding_format: str) -> bytes:
    def arr(value: np.ndarray | None) -> Any:
        return None if value is None else encode_array(value, encoding_format)

    return wire.dumps(
        {
            "model": result.model,
            "data": [
                {
                    "index": i,
                    "tokens": out.tokens,
                    "embeddings": arr(out.embeddings),
                    "attention": arr(out.attention),
                    "attention_indices": arr(out.attention_indices),
                    "attention_summaries": None
                    if out.attention_summaries is None
                    else {k: arr(v) for k, v in out.attention_summaries.items()},
                    "hidden_states": arr(out.hidden_states),
                    "pooled": arr(out.pooled),
                    "span_embeddings": arr(out.span_embeddings),
                }
                for i, out in enumerate(result.outputs)
            ],
            "usage": {"sequences": len(result.outputs), "tokens": result.tokens},
        }
    )


def sparse_request(body: bytes) -> tuple[SparseRequest, bool]:
    """An embed_sparse body -> (SparseRequest, whether the answer names the stems)."""
    options = wire.parse_options(EmbedSparseRequest, wire.parse_json_object(body))
    request = SparseRequest(
        texts=options.inputs,
        wire_cost=SPARSE_COST,
        model=options.model,
        kind=options.kind,
        top_k=options.top_k,
        threshold=options.threshold,
        alpha=options.alpha,
        truncate=options.truncate,
        truncation_direction=options.truncation_direction,
        return_text=options.return_text,
    )
    return request, options.return_text


def sparse_response(result: SparseResult, return_text: bool) -> bytes:
    return wire.dumps(
        {
            "model": result.model,
            "data": [
                {
                    "index": i,
                    "indices": vector.indices,
                    "values": vector.values,
                    **({"text": vector.stems} if return_text else {}),
                }
                for i, vector in enumerate(result.vectors)
            ],
            "usage": {"sequences": len(result.vectors), "tokens": result.tokens},
        }
    )


def tokenize_request(body: bytes) -> tuple[TokenizeRequest, str]:
    """A tokenize body -> (TokenizeRequest, encoding_format of its answer)."""
    options = wire.parse_options(TokenizeBody, wire.parse_json_object(body))
    texts = [options.text] if isinstance(options.text, str) else options.text
    request = TokenizeRequest(
        texts=texts,
        wire_cost=TOKENIZE_COST[options.encoding_format],
        model=options.model,
        return_embeddings=options.return_embeddings,
        truncate=options.truncate,
        truncation_direction=options.truncation_direction,
    )
    return request, options.encoding_format


def tokenize_response(result: TokenizeResult, encoding_format: str) -> bytes:
    return wire.dumps(
        {
            "model": result.model,
            "data": [
                {
                    "index": i,
                    "tokens": item.tokens,
                    "ids": item.ids,
                    "embeddings": None
                    if item.embeddings is None
                    else encode_array(item.embeddings, encoding_format),
                }
                for i, item in enumerate(result.items)
            ],
            "usage": {"sequences": len(result.items), "tokens": result.tokens},
        }
    )


# A rerank answer's attention as nested JSON: per float, per row (as the encode answer's).
RERANK_ATTENTION_COST = WireCost(**ARRAYS["float"], per_sequence=256.0, per_token=3.0)


def rerank_request(body: bytes) -> tuple[RerankRequest, tuple[list[str], bool]]:
    """A /v1/rerank body -> the engine's request, and (documents, return_documents)."""
    options = wire.parse_options(RerankBody, wire.parse_json_object(body))
    documents = [d if isinstance(d, str) else d.text for d in options.documents]
    request = RerankRequest(
        query=options.query,
        documents=documents,
        model=options.model,
        top_n=options.top_n,
        raw_scores=options.raw_scores,
        truncate=options.truncate,
        truncation_direction=options.truncation_direction,
        return_attention=options.return_attention,
        attention=attention_spec(options.attention),
        top_tokens=options.top_tokens,
        wire_cost=RERANK_ATTENTION_COST,
        instruction=options.instruction,
    )
    return request, (documents, options.return_documents)


def rerank_response(result: RerankResult, documents: list[str], return_documents: bool) -> bytes:
    """Cohere's ``{id, results: [{index, relevance_score, document?}], meta}`` with Jina's
    ``model`` and ``usage``; ``explanation`` where attention was asked."""
    return wire.dumps(
        {
            "id": str(uuid.uuid4()),
            "model": result.model,
            "results": [_ranked(r, documents, return_documents) for r in result.results],
            "meta": {
                "billed_units": {"search_units": 1},
                "tokens": {"input_tokens": result.tokens},
            },
            "usage": {"total_tokens": result.tokens, "prompt_tokens": result.tokens},
        }
    )


def _ranked(ranked: Ranked, documents: list[str], return_documents: bool) -> dict[str, Any]:
    item: dict[str, Any] = {"index": ranked.index, "relevance_score": ranked.score}
    if return_documents:
        item["document"] = {"text": documents[ranked.index]}
    x = ranked.explanation
    if isinstance(x, MaxSimExplanation):  # a multi-vector model's MaxSim, split
        item["explanation"] = {
            "query_tokens": x.query_tokens,
            "document_tokens": x.document_tokens,
            "matches": [
                {"query_index": q, "document_index": d, "score": term}
                for q, (d, term) in enumerate(zip(x.best, x.terms, strict=True))
            ],
        }
    elif x is not None:
        item["explanation"] = {
            "query_tokens": x.query_tokens,
            "document_tokens": x.document_tokens,
            "attention": x.attention,
            "top_tokens": [
                {"index": i, "token": token, "weight": weight} for i, token, weight in x.top_tokens
            ],
        }
    return item


# A similarity answer beyond its arrays and listed tokens (limits.AnswerShape counts
# those): per item its keys, index and score; per top pair its five keys and braces;
# per listed token its quotes and separator, and its total (a float in the totals).
SIMILARITY_ITEM_BYTES = 256.0
SIMILARITY_PAIR_BYTES = 96.0
SIMILARITY_TOKEN_BYTES = 3.0 + 18.0


def similarity_request(body: bytes) -> tuple[SimilarityRequest, str]:
    """A /v1/explain/similarity body -> the engine's request, and its answer's format."""
    options = wire.parse_options(SimilarityBody, wire.parse_json_object(body))
    pairs = max(options.top_pairs, 0)
    cost = WireCost(
        **ARRAYS[options.encoding_format],
        per_sequence=SIMILARITY_ITEM_BYTES + SIMILARITY_PAIR_BYTES * pairs,
        per_token=SIMILARITY_TOKEN_BYTES,
        fixed=128.0,
    )
    request = SimilarityRequest(
        query=options.query,
        documents=options.documents,
        wire_cost=cost,
        model=options.model,
        top_pairs=options.top_pairs,
        truncate=options.truncate,
    )
    return request, options.encoding_format


def similarity_response(result: SimilarityResult, encoding_format: str) -> bytes:
    """``{"model", "data": [one item per document, in order], "usage"}``."""
    return wire.dumps(
        {
            "model": result.model,
            "data": [_similarity_item(x, encoding_format) for x in result.explanations],
            "usage": {"sequences": result.sequences, "tokens": result.tokens},
        }
    )


def _similarity_item(x: SimilarityExplanation, encoding_format: str) -> dict[str, Any]:
    return {
        "index": x.index,
        "score": x.score,
        "query_tokens": x.query_tokens,
        "document_tokens": x.document_tokens,
        "contributions": encode_array(x.contributions, encoding_format),
        "top_pairs": [
            {
                "query_index": p.query_index,
                "document_index": p.document_index,
                "query_token": x.query_tokens[p.query_index],
                "document_token": x.document_tokens[p.document_index],
                "contribution": p.contribution,
            }
            for p in x.top_pairs
        ],
        "query_totals": x.query_totals,
        "document_totals": x.document_totals,
    }


def multi_vector_request(body: bytes) -> tuple[EngineMultiVectorRequest, str]:
    """A /v1/multi-vector body -> the engine's request, and its arrays' format."""
    options = wire.parse_options(MultiVectorBody, wire.parse_json_object(body))
    texts = [options.input] if isinstance(options.input, str) else options.input
    request = EngineMultiVectorRequest(
        texts=texts,
        wire_cost=MULTI_VECTOR_COST[options.embedding_type],
        model=options.model,
        input_type=options.input_type,
        outputs=tuple(dict.fromkeys(options.output)),
        truncate=options.truncate,
        return_text=options.return_text,
        half=options.dtype == "float16",
        prune=None
        if options.prune is None
        else EnginePrune(options.prune.method, options.prune.k, options.prune.fraction),
    )
    return request, options.embedding_type


def multi_vector_response(result: MultiVectorResult, embedding_type: str) -> bytes:
    """Jina's ``{model, object, data: [{object, index, embeddings}], usage}``, each item
    with its ``dense`` and ``sparse`` vectors where asked."""

    return wire.dumps(
        {
            "model": result.model,
            "object": "list",
            "data": [
                late_item(x, embedding_type, "embeddings", {"object": "embeddings", "index": i})
                for i, x in enumerate(result.items)
            ],
            "usage": {"total_tokens": result.tokens, "prompt_tokens": result.tokens},
        }
    )


def late_item(
    x: MultiVectorItem, encoding_format: str, vectors_key: str, head: dict[str, Any]
) -> dict[str, Any]:
    """One text's late-interaction outputs after ``head``: its token vectors under
    ``vectors_key``, its ``dense`` vector and ``sparse`` vector, each where asked."""
    out = dict(head)
    if x.vectors is not None:
        out[vectors_key] = encode_array(x.vectors, encoding_format)
    if x.dense is not None:
        out["dense"] = encode_array(x.dense, encoding_format)
    if x.sparse is not None:
        out["sparse"] = {"indices": x.sparse.indices, "values": x.sparse.values}
        if x.sparse.stems:
            out["sparse"]["text"] = x.sparse.stems
    return out
