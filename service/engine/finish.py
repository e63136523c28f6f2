"""Per-sequence model outputs -> the answer: attention selected and reduced, hidden
states picked, vectors pooled (per span too), non-finite outputs refused."""

from __future__ import annotations

import numpy as np

from model_export.manifest import graph_io
from service.engine import attention_answer, postprocess, quantize
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
    attention = indices = summaries = None
    if request.return_attention:
        attention, indices, summaries = _attention(prepared, i, outputs)
    hidden_states = None
    if request.return_hidden_states:
        hidden_states = outputs[graph_io.OUTPUT_HIDDEN_STATES][prepared.hidden_layers]
    pooled, dense = None, prepared.model.dense
    if prepared.pooling != "none":
        skip = prepared.pool_skip[i] if prepared.pool_skip else 0
        pooled = postprocess.pool(
            hidden, prepared.pooling, request.normalize, request.dimensions, skip, dense
        )
    spans = prepared.span_tokens[i] if prepared.span_tokens else None
    span_embeddings = None
    if spans is not None:
        span_embeddings = np.stack(
            [
                postprocess.pool(
                    hidden[held], prepared.pooling, request.normalize, request.dimensions, 0, dense
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
        attention_indices=indices,
        attention_summaries=summaries,
    )


Maps = tuple[np.ndarray | None, np.ndarray | None, dict[str, np.ndarray] | None]


def _attention(prepared: PreparedEncode, i: int, outputs: SequenceResult) -> Maps:
    """One sequence's (maps, their key indices if rows are cut, summaries if asked)."""
    spec, layers, heads = prepared.request.attention, prepared.layers, prepared.heads
    keys = prepared.kept_keys[i]
    summaries = None
    if prepared.compact:  # the graph's sorted rows and row statistics, for every head
        chosen = np.ix_(layers, heads)
        if spec.summaries:
            rows = outputs[graph_io.OUTPUT_SUMMARIES][chosen]
            summaries = attention_answer.pick_summaries(rows, spec)
        if not spec.maps:
            return None, None, summaries
        values = outputs[graph_io.OUTPUT_TOP_WEIGHTS][chosen]
        order = outputs[graph_io.OUTPUT_TOP_INDICES][chosen]
        return (*attention_answer.compact_maps(values, order, spec, keys), summaries)
    if prepared.selected:  # only the asked layers (ascending) and heads (in order)
        options = prepared.run_options
        assert options.layers is not None
        full = outputs[graph_io.OUTPUT_SELECTED_HALF if options.half else graph_io.OUTPUT_SELECTED]
        layers = [options.layers.index(layer) for layer in layers]
        heads = list(range(len(heads)))
    else:
        full = outputs[graph_io.OUTPUT_ATTENTIONS]
    if spec.summaries:
        rows = attention_answer.summaries_of(full[np.ix_(layers, heads)])
        summaries = attention_answer.pick_summaries(rows, spec)
    if not spec.maps:
        return None, None, summaries
    maps = postprocess.select_attention(
        full,
        layers,
        heads,
        spec.reduce,
        outputs[graph_io.OUTPUT_VALUE_NORMS] if spec.measure == "norms" else None,
    )
    if not spec.sparse:
        return attention_answer.as_dtype(maps, spec), None, summaries
    values, order = attention_answer.top_rows(maps, keys)
    return (*attention_answer.compact_maps(values, order, spec, keys), summaries)
