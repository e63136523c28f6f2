"""OpenAI embeddings bodies <-> the engine's types.

Vectors are the model's own sentence-embedding pooling (its manifest; mean for
models that record none), L2-normalised, optionally shortened to ``dimensions``.
"""

from __future__ import annotations

from typing import Any

from service.engine import EncodeRequest, EncodeResult, InputItem, TokenIds, WireCost
from service.errors import InvalidInput
from service.protocols import wire
from service.protocols.openai.schemas import EmbeddingsOptions
from service.protocols.quantized import pooled_array

# Upper bounds of an answer: {"object":"list","data":[..],"model":..,"usage":{..}} once,
# {"object":"embedding","index":N,"embedding":..} per item, the vector itself (a base64
# string is quoted, no shape).
COST = {
    "float": WireCost(**wire.JSON_ARRAYS, per_sequence=64.0, fixed=128.0),
    "base64": WireCost(per_float=16.0 / 3.0, per_array=8.0, per_sequence=64.0, fixed=128.0),
}


def embeddings_request(body: bytes, *, truncate: bool) -> tuple[EncodeRequest, str]:
    """An embeddings body -> (EncodeRequest, encoding format of its answer)."""
    payload = wire.parse_json_object(body)
    if "input" not in payload:
        raise InvalidInput("is required: a text, a list of texts, or token ids", field=("inputs",))
    raw = payload.pop("input")
    options = wire.parse_options(EmbeddingsOptions, payload)
    request = EncodeRequest(
        inputs=_inputs(raw),
        wire_cost=COST[options.encoding_format],
        model=options.model,
        pooling="model",
        normalize=True,
        dimensions=options.dimensions,
        embedding_type=options.embedding_type,
        quantization_ranges=options.ranges(),
        return_embeddings=False,
        truncate=truncate,
        prompt_name=options.prompt_name,
        task=options.task,
    )
    return request, options.encoding_format


def _inputs(raw: Any) -> list[InputItem] | wire.LazyItems[InputItem]:
    if isinstance(raw, str):
        return [_text(0, raw)]
    if not isinstance(raw, list):
        raise InvalidInput(
            "must be a text, a list of texts, or token ids (a list of integers, or a list of "
            "such lists)",
            field=("inputs",),
        )
    if raw and _is_int(raw[0]):  # one sequence of token ids
        return [_token_ids(0, raw)]
    return wire.LazyItems(raw, _item)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(index: int, text: str) -> str:
    if not text:
        # OpenAI refuses empty strings too; for us it would be [CLS][SEP] alone.
        raise InvalidInput("must not be an empty string", field=("inputs", index))
    return text


def _token_ids(index: int, ids: list[Any]) -> TokenIds:
    if not all(_is_int(t) for t in ids):
        raise InvalidInput("token ids must all be integers", field=("inputs", index))
    return TokenIds(ids)


def _item(index: int, item: Any) -> InputItem:
    if isinstance(item, str):
        return _text(index, item)
    if isinstance(item, list):
        return _token_ids(index, item)
    raise InvalidInput("must be a text or a list of token ids", field=("inputs", index))


def embeddings_response(result: EncodeResult, encoding_format: str) -> bytes:
    data = []
    for i, out in enumerate(result.outputs):
        assert out.pooled is not None  # the request always pools
        vector: Any = pooled_array(out.pooled, encoding_format)
        if isinstance(vector, dict):  # quantized, base64: OpenAI's field is the string
            vector = vector["data"]
        elif vector is None:
            vector = (
                wire.base64_float32(out.pooled)
                if encoding_format == "base64"
                else wire.float32_le(out.pooled)
            )
        data.append({"object": "embedding", "index": i, "embedding": vector})
    return wire.dumps(
        {
            "object": "list",
            "data": data,
            "model": result.model,
            "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        }
    )
