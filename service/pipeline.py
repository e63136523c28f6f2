"""One encode request from body bytes to response bytes.

``prepare`` parses and validates everything (limits, indices, response size)
before any inference is queued, so a bad or oversized request costs nothing;
``finish`` trims, selects, reduces, pools and serialises. Both are plain
functions: the HTTP layer runs large ones off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from service import codecs, postprocess
from service.batcher import SequenceResult
from service.errors import InvalidInput, ModelNotFound, PayloadTooLarge
from service.runtime import ModelInfo
from service.schemas import EncodeOptions
from service.settings import Settings

MB = 1e6


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request: decoded arrays plus everything ``finish`` needs."""

    model: ModelInfo
    options: EncodeOptions
    sequences: list[np.ndarray]
    layers: list[int]
    heads: list[int]
    response_bytes: float

    @property
    def return_embeddings(self) -> bool:
        return wants_embeddings(self.options)


def wants_embeddings(options: EncodeOptions) -> bool:
    """Per-token embeddings are returned unless pooling replaces them (overridable)."""
    if options.return_embeddings is not None:
        return options.return_embeddings
    return options.pooling == "none"


def pydantic_message(exc: ValidationError) -> str:
    """The first validation problem as one line: ``field.path: message``."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"


def resolve_model(models: dict[str, ModelInfo], name: str | None, default: str) -> ModelInfo:
    key = default if name is None else name
    try:
        return models[key]
    except KeyError:
        raise ModelNotFound(
            f"model {key!r} is not served here (available: {', '.join(sorted(models))})"
        ) from None


def _check_limits(raw_inputs: list[Any], model: ModelInfo, settings: Settings) -> None:
    if len(raw_inputs) > settings.max_sequences:
        raise PayloadTooLarge(
            f"{len(raw_inputs)} sequences in one request; the limit is {settings.max_sequences}"
        )
    total = 0
    for i, item in enumerate(raw_inputs):
        n = codecs.declared_length(item)
        if n is None:
            continue  # decode_sequence explains what is wrong with it
        if n > model.max_seq_len:
            raise PayloadTooLarge(
                f"inputs[{i}] has {n} tokens; model {model.name!r} accepts at most "
                f"{model.max_seq_len}"
            )
        total += n
    if total > settings.max_tokens:
        raise PayloadTooLarge(
            f"{total} tokens in one request; the limit is {settings.max_tokens}"
        )


def _response_floats(lengths: list[int], d_model: int, options: EncodeOptions,
                     return_embeddings: bool, n_layers: int, n_heads: int) -> tuple[int, int]:
    """(all floats, attention floats) the response will carry."""
    attention_maps = 0
    if options.return_attention:
        reduce = options.attention.reduce
        attention_maps = 1 if reduce == "rollout" else n_layers * (
            1 if reduce in ("mean", "max") else n_heads)
    attention = sum(attention_maps * n * n for n in lengths)
    embeddings = sum(lengths) * d_model if return_embeddings else 0
    pooled = len(lengths) * d_model if options.pooling != "none" else 0
    return embeddings + attention + pooled, attention


def prepare(body: bytes, models: dict[str, ModelInfo], default_model: str,
            settings: Settings) -> PreparedRequest:
    """Parse, validate and decode; raise a ServiceError for anything a client got wrong."""
    payload = codecs.parse_json_object(body)
    if "inputs" not in payload:
        raise InvalidInput("'inputs' is required: a list of [seq_len, d_model] arrays")
    raw_inputs = payload.pop("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInput("'inputs' must be a list of sequences")
    if not raw_inputs:
        raise InvalidInput("'inputs' is empty: send at least one sequence")
    try:
        options = EncodeOptions.model_validate(payload)
    except ValidationError as exc:
        raise InvalidInput(pydantic_message(exc)) from None
    model = resolve_model(models, options.model, default_model)
    cfg = model.config
    _check_limits(raw_inputs, model, settings)
    layers = heads = []
    if options.return_attention:
        layers = postprocess.resolve_indices(options.attention.layers, cfg.n_layers, "layers")
        heads = postprocess.resolve_indices(options.attention.heads, cfg.n_heads, "heads")
    sequences = [
        codecs.decode_sequence(item, i, cfg.d_model) for i, item in enumerate(raw_inputs)
    ]
    floats, attention_floats = _response_floats(
        [len(s) for s in sequences], cfg.d_model, options, wants_embeddings(options),
        len(layers), len(heads),
    )
    size = floats * codecs.BYTES_PER_FLOAT[options.encoding_format]
    if size > settings.max_response_bytes:
        hint = (
            "select fewer layers or heads, use attention.reduce mean/max/rollout, "
            if attention_floats else ""
        ) + "send fewer or shorter sequences"
        if options.encoding_format == "float":
            hint += ", or use encoding_format=base64 (~2.6x smaller)"
        raise PayloadTooLarge(
            f"the response would be about {size / MB:.1f} MB ({floats:,} floats, "
            f"{attention_floats:,} of them attention); the limit is "
            f"{settings.max_response_bytes / MB:.1f} MB: {hint}"
        )
    return PreparedRequest(model, options, sequences, layers, heads, size)


def finish(request: PreparedRequest, results: list[SequenceResult]) -> bytes:
    """Per-sequence outputs -> the response body."""
    opts = request.options
    fmt = opts.encoding_format
    data = []
    tokens = 0
    for i, (hidden, attn) in enumerate(results):
        tokens += len(hidden)
        attention = None
        if attn is not None:
            attention = codecs.encode_array(
                postprocess.select_attention(attn, request.layers, request.heads,
                                             opts.attention.reduce), fmt)
        pooled = None
        if opts.pooling != "none":
            pooled = codecs.encode_array(postprocess.pool(hidden, opts.pooling, opts.normalize),
                                         fmt)
        data.append({
            "index": i,
            "embeddings": codecs.encode_array(hidden, fmt) if request.return_embeddings else None,
            "attention": attention,
            "pooled": pooled,
        })
    return codecs.dumps({
        "model": request.model.name,
        "data": data,
        "usage": {"sequences": len(results), "tokens": tokens},
    })
