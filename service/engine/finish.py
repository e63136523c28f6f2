"""Per-sequence model outputs -> the answer: attention selected and reduced, hidden
states picked, vectors pooled (per span too), non-finite outputs refused."""

from __future__ import annotations

import numpy as np

from model_export.manifest import graph_io
from service.engine import postprocess, quantize
from service.engine.prepare import PreparedEncode
from service.engine.types import EncodeResult, SequenceOutput
from service.errors import InvalidInput
from service.inference_lanes import SequenceResult


def finish(prepared: PreparedEncode, results: list[SequenceResult]) -> EncodeResult:
    """The answer to ``prepared`` (or a part of it) from its sequences' outputs."""
    answers = [_output(prepared, i, outputs) for i, outputs in enumerate(results)]
    return EncodeResult(
        prepared.model.name, answers, prepared.response_bytes, prepared.model.version
    )


def _output(prepared: PreparedEncode, i: int, outputs: SequenceResult) -> SequenceOutput:
    request = prepared.request
    if not all(np.isfinite(value).all() for value in outputs.values()):
        # Finite inputs can still overflow inside the model (e.g. |x| ~ 1e20 in
        # LayerNorm's variance); never answer with NaN.
        raise InvalidInput(
            "overflows the model (non-finite outputs): its values are too large "
            f"(max |x| {float(np.abs(prepared.sequences[i]).max()):.3g})",
            field=("inputs", prepared.first_index + i),
        )
    hidden = outputs[graph_io.OUTPUT_HIDDEN]
    attention = None
    if request.return_attention:
        attention = postprocess.select_attention(
            outputs[graph_io.OUTPUT_ATTENTIONS],
            prepared.layers,
            prepared.heads,
            request.attention.reduce,
            outputs[graph_io.OUTPUT_VALUE_NORMS] if request.attention.measure == "norms" else None,
        )
    hidden_states = None
    if request.return_hidden_states:
        hidden_states = outputs[graph_io.OUTPUT_HIDDEN_STATES][prepared.hidden_layers]
    pooled = None
    if prepared.pooling != "none":
        skip = prepared.pool_skip[i] if prepared.pool_skip else 0
        pooled = postprocess.pool(
            hidden, prepared.pooling, request.normalize, request.dimensions, skip
        )
    spans = prepared.span_tokens[i] if prepared.span_tokens else None
    span_embeddings = None
    if spans is not None:
        span_embeddings = np.stack(
            [
                postprocess.pool(
                    hidden[held], prepared.pooling, request.normalize, request.dimensions
                )
                for held in spans
            ]
        )
    kind, ranges = request.embedding_type, prepared.quantization_ranges
    if pooled is not None:
        pooled = quantize.quantize(pooled, kind, ranges)
    if span_embeddings is not None and kind != "float":
        span_embeddings = np.stack([quantize.quantize(v, kind, ranges) for v in span_embeddings])
    return SequenceOutput(
        tokens=prepared.tokens[i],
        length=len(hidden),
        embeddings=hidden if request.return_embeddings else None,
        attention=attention,
        hidden_states=hidden_states,
        pooled=pooled,
        span_embeddings=span_embeddings,
    )
