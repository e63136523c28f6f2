"""One request from body bytes to response bytes.

``prepare`` parses and validates everything (limits, indices, response size)
before any inference is queued, so a bad or oversized request costs nothing;
``finish`` trims, selects, reduces, pools and serialises. Both are plain
functions: the HTTP layer runs large ones off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from service import codecs, postprocess
from service.batcher import SequenceResult
from service.errors import InvalidInput, ModelNotFound, PayloadTooLarge, UnsupportedByModel
from service.runtime import ModelInfo, ModelRuntime
from service.schemas import EncodeOptions, TokenizeRequest
from service.settings import Settings

MB = 1e6
Options = TypeVar("Options", bound=BaseModel)


@dataclass(frozen=True)
class PreparedRequest:
    """A validated encode request: decoded arrays plus everything ``finish`` needs."""

    model: ModelInfo
    options: EncodeOptions
    sequences: list[np.ndarray]
    tokens: list[list[str] | None]  # the tokens of text items, None for array items
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


def parse_options(model: type[Options], payload: dict[str, Any]) -> Options:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise InvalidInput(pydantic_message(exc)) from None


def resolve_model(
    runtimes: dict[str, ModelRuntime], name: str | None, default: str
) -> ModelRuntime:
    key = default if name is None else name
    try:
        return runtimes[key]
    except KeyError:
        raise ModelNotFound(
            f"model {key!r} is not served here (available: {', '.join(sorted(runtimes))})"
        ) from None


def _tokenize(
    runtime: ModelRuntime, texts: list[str], truncate: bool
) -> list[tuple[list[str], list[int], list[int]]]:
    """Tokenize text items; 422 for a model without a tokenizer."""
    if not runtime.info.has_tokenizer:
        raise UnsupportedByModel(
            f"model {runtime.info.name!r} has no tokenizer: send token embeddings as arrays, or "
            "use a model exported from a checkpoint with a tokenizer (e.g. minilm-l6)"
        )
    return runtime.tokenize(texts, truncate=truncate)


def _check_counts(
    n_sequences: int,
    lengths: list[int | None],
    model: ModelInfo,
    settings: Settings,
    what: str = "inputs",
) -> None:
    if n_sequences > settings.max_sequences:
        raise PayloadTooLarge(
            f"{n_sequences} sequences in one request; the limit is {settings.max_sequences}"
        )
    for i, n in enumerate(lengths):
        if n is not None and n > model.max_seq_len:
            raise PayloadTooLarge(
                f"{what}[{i}] has {n} tokens; model {model.name!r} accepts at most "
                f"{model.max_seq_len} (shorten it; for texts, or set truncate=true)"
            )
    total = sum(n for n in lengths if n is not None)
    if total > settings.max_tokens:
        raise PayloadTooLarge(f"{total} tokens in one request; the limit is {settings.max_tokens}")


def _response_floats(
    lengths: list[int], d_model: int, options: EncodeOptions, n_layers: int, n_heads: int
) -> tuple[int, int]:
    """(all floats, attention floats) the response will carry."""
    attention_maps = 0
    if options.return_attention:
        reduce = options.attention.reduce
        attention_maps = (
            1 if reduce == "rollout" else n_layers * (1 if reduce in ("mean", "max") else n_heads)
        )
    attention = sum(attention_maps * n * n for n in lengths)
    embeddings = sum(lengths) * d_model if wants_embeddings(options) else 0
    pooled = len(lengths) * d_model if options.pooling != "none" else 0
    return embeddings + attention + pooled, attention


def _check_response_size(
    lengths: list[int],
    model: ModelInfo,
    options: EncodeOptions,
    layers: list[int],
    heads: list[int],
    settings: Settings,
) -> float:
    floats, attention_floats = _response_floats(
        lengths, model.config.d_model, options, len(layers), len(heads)
    )
    size = floats * codecs.BYTES_PER_FLOAT[options.encoding_format]
    if size > settings.max_response_bytes:
        hint = (
            "select fewer attention.layers or attention.heads, use attention.reduce "
            "mean/max/rollout, "
            if attention_floats
            else ""
        ) + "send fewer or shorter sequences"
        if options.encoding_format == "float":
            hint += ", or use encoding_format=base64 (~2.6x smaller)"
        raise PayloadTooLarge(
            f"the response would be about {size:,.0f} bytes ({size / MB:.2f} MB: {floats:,} "
            f"floats, {attention_floats:,} of them attention); the limit is "
            f"{settings.max_response_bytes:,} bytes: {hint}"
        )
    return size


def prepare(
    body: bytes, runtimes: dict[str, ModelRuntime], default_model: str, settings: Settings
) -> PreparedRequest:
    """Parse, validate and decode an encode request; raise a ServiceError on client mistakes."""
    payload = codecs.parse_json_object(body)
    if "inputs" not in payload:
        raise InvalidInput("'inputs' is required: a list of [seq_len, d_model] arrays or texts")
    raw_inputs = payload.pop("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInput("'inputs' must be a list of sequences")
    if not raw_inputs:
        raise InvalidInput("'inputs' is empty: send at least one sequence")
    options = parse_options(EncodeOptions, payload)
    runtime = resolve_model(runtimes, options.model, default_model)
    info, cfg = runtime.info, runtime.info.config
    if len(raw_inputs) > settings.max_sequences:  # before tokenizing a huge list
        _check_counts(len(raw_inputs), [], info, settings)
    text_at = [i for i, item in enumerate(raw_inputs) if isinstance(item, str)]
    encoded = (
        _tokenize(runtime, [raw_inputs[i] for i in text_at], options.truncate) if text_at else []
    )
    text_of = dict(zip(text_at, encoded, strict=True))
    lengths = [
        len(text_of[i][0]) if i in text_of else codecs.declared_length(item)
        for i, item in enumerate(raw_inputs)
    ]
    _check_counts(len(raw_inputs), lengths, info, settings)
    # Checked even without return_attention: a wrong index is wrong either way.
    layers = postprocess.resolve_indices(options.attention.layers, cfg.n_layers, "layers")
    heads = postprocess.resolve_indices(options.attention.heads, cfg.n_heads, "heads")
    if options.attention.reduce == "rollout":
        layers = sorted(set(layers))  # rollout multiplies layers bottom-up, each once
    if options.normalize and options.pooling == "none":
        raise InvalidInput("normalize applies to pooled vectors: set pooling (mean, cls, max)")
    sequences: list[np.ndarray | None] = [
        None if i in text_of else codecs.decode_sequence(item, i, cfg.d_model)
        for i, item in enumerate(raw_inputs)
    ]
    if encoded:
        embedded = runtime.embed_tokens(
            [ids for _, ids, _ in encoded], [types for _, _, types in encoded]
        )
        for i, array in zip(text_at, embedded, strict=True):
            sequences[i] = array
    arrays = [s for s in sequences if s is not None]
    size = _check_response_size([len(s) for s in arrays], info, options, layers, heads, settings)
    tokens = [text_of[i][0] if i in text_of else None for i in range(len(raw_inputs))]
    return PreparedRequest(info, options, arrays, tokens, layers, heads, size)


def finish(request: PreparedRequest, results: list[SequenceResult]) -> bytes:
    """Per-sequence outputs -> the encode response body."""
    opts = request.options
    fmt = opts.encoding_format
    data = []
    for i, (hidden, attn) in enumerate(results):
        if not np.isfinite(hidden).all() or (attn is not None and not np.isfinite(attn).all()):
            # Finite inputs can still overflow inside the model (e.g. |x| ~ 1e20 in
            # LayerNorm's variance); never answer 200 with NaN.
            raise InvalidInput(
                f"inputs[{i}] overflows the model (non-finite outputs): its values are too "
                f"large (max |x| {float(np.abs(request.sequences[i]).max()):.3g})"
            )
        attention = None
        if attn is not None:
            attention = codecs.encode_array(
                postprocess.select_attention(
                    attn, request.layers, request.heads, opts.attention.reduce
                ),
                fmt,
            )
        pooled = None
        if opts.pooling != "none":
            pooled = codecs.encode_array(
                postprocess.pool(hidden, opts.pooling, opts.normalize), fmt
            )
        data.append(
            {
                "index": i,
                "tokens": request.tokens[i],
                "embeddings": codecs.encode_array(hidden, fmt)
                if request.return_embeddings
                else None,
                "attention": attention,
                "pooled": pooled,
            }
        )
    return codecs.dumps(
        {
            "model": request.model.name,
            "data": data,
            "usage": {"sequences": len(results), "tokens": sum(len(h) for h, _ in results)},
        }
    )


def tokenize(
    body: bytes, runtimes: dict[str, ModelRuntime], default_model: str, settings: Settings
) -> bytes:
    """``POST /v1/tokenize``: texts -> tokens, ids and (optionally) token embeddings."""
    options = parse_options(TokenizeRequest, codecs.parse_json_object(body))
    runtime = resolve_model(runtimes, options.model, default_model)
    texts = [options.text] if isinstance(options.text, str) else options.text
    if not texts:
        raise InvalidInput("'text' is empty: send at least one string")
    if len(texts) > settings.max_sequences:  # before tokenizing a huge list
        _check_counts(len(texts), [], runtime.info, settings, "text")
    encoded = _tokenize(runtime, texts, options.truncate)
    _check_counts(len(texts), [len(t) for t, _, _ in encoded], runtime.info, settings, "text")
    embeddings: list[Any] = [None] * len(texts)
    if options.return_embeddings:
        _check_response_size(
            [len(t) for t, _, _ in encoded],
            runtime.info,
            EncodeOptions(encoding_format=options.encoding_format),
            [],
            [],
            settings,
        )
        arrays = runtime.embed_tokens(
            [ids for _, ids, _ in encoded], [types for _, _, types in encoded]
        )
        embeddings = [codecs.encode_array(a, options.encoding_format) for a in arrays]
    return codecs.dumps(
        {
            "model": runtime.info.name,
            "data": [
                {"index": i, "tokens": tokens, "ids": ids, "embeddings": embeddings[i]}
                for i, (tokens, ids, _) in enumerate(encoded)
            ],
            "usage": {"sequences": len(texts), "tokens": sum(len(t) for t, _, _ in encoded)},
        }
    )
