"""Compact attention answers: top-k or thresholded rows, float16 maps, per-head summaries.

Where a request asks for the weights themselves (reduce none, measure weights) and
no hidden states, and the model has the compact graph, the top-k rows and the
summaries are computed inside onnxruntime, layer by layer (``graph_io.
GRAPH_COMPACT_ATTENTION``): the full maps are never stacked or copied out. Everything
else (a reduction, rollout, norms, or a model exported before the compact graph)
takes the full maps and does the same here in numpy, with the same answers: rows
sorted largest first, ties to the lower key index, as ONNX's TopK orders them.

A threshold t keeps the keys with weight > t: a row of weights sums to 1, so fewer
than 1/t of them, and the compact graph's top ⌊1/t⌋ + 1 always holds them all (a
row that need not sum to 1, a max over heads or norms, is priced at every key).

Full maps of fewer layers or heads than the model has, or in float16, come from the
selected-maps graph (``graph_io.GRAPH_SELECTED_ATTENTION``) where the model has it:
the maps nobody asked for, and a float16 answer's float32 maps, are freed layer by
layer inside the run instead of being stacked and copied out.
"""

from __future__ import annotations

import math

import numpy as np

from model_export.manifest import graph_io
from service.engine.types import AttentionSpec
from service.errors import InvalidInput

SUMMARY_INDEX = {name: i for i, name in enumerate(graph_io.SUMMARIES)}
# Where the answer leaves a thresholded row's unused places: no key, weight 0.
NO_KEY = -1


def check_spec(spec: AttentionSpec, lengths: list[int], asked: bool) -> None:
    """422s for options that no sequence of ``lengths`` can satisfy, naming the field
    (protocols whose schemas already bound them reach here too); whether anything is
    answered at all only when attention is ``asked`` for."""
    if spec.top_k is not None and spec.threshold is not None:
        raise InvalidInput("choose top_k or threshold, not both", field=("attention", "threshold"))
    if spec.top_k is not None:
        if spec.top_k < 1:
            raise InvalidInput("must be at least 1", field=("attention", "top_k"))
        short = [i for i, n in enumerate(lengths) if spec.top_k > n]
        if short:
            raise InvalidInput(
                f"{spec.top_k} is more keys than input {short[0]} has ({lengths[short[0]]} "
                "tokens): ask for at most that many",
                field=("attention", "top_k"),
            )
    if spec.threshold is not None and not 0.0 <= spec.threshold <= 1.0:
        raise InvalidInput("must be within [0, 1]", field=("attention", "threshold"))
    if spec.dtype not in ("float32", "float16"):
        raise InvalidInput("must be float32 or float16", field=("attention", "dtype"))
    unknown = [name for name in spec.summaries if name not in SUMMARY_INDEX]
    if unknown:
        raise InvalidInput(
            f"unknown summaries {unknown}: choose from {list(graph_io.SUMMARIES)}",
            field=("attention", "summaries"),
        )
    if len(set(spec.summaries)) != len(spec.summaries):
        raise InvalidInput("name each summary at most once", field=("attention", "summaries"))
    if asked and not spec.maps and not spec.summaries:
        raise InvalidInput(
            "without maps, ask for summaries: nothing would be returned",
            field=("attention", "maps"),
        )


def kept_keys(spec: AttentionSpec, n: int) -> int:
    """Keys per row a sequence of ``n`` tokens keeps at most (n: all of them)."""
    if not spec.maps:
        return 1  # the compact graph's least run; nothing of it is answered
    if spec.top_k is not None:
        return spec.top_k
    if spec.threshold is not None:
        # A row that sums to 1 holds fewer than 1/t values above t; a t so small that 1/t
        # reaches n (or overflows, as 1/5e-324 does) keeps every key. Rows that need not
        # sum to 1 (the max over heads, attention norms) may keep every key.
        if not stochastic_rows(spec) or spec.threshold * n <= 1.0:
            return n
        return min(n, math.floor(1.0 / spec.threshold) + 1)
    return n


def stochastic_rows(spec: AttentionSpec) -> bool:
    """Does each row of the answered maps sum to 1? The weights, their mean over heads
    and any rollout do; their max over heads and attention norms need not."""
    return spec.reduce == "rollout" or (spec.measure == "weights" and spec.reduce != "max")


def in_graph(spec: AttentionSpec, hidden_states: bool, has_graph: bool) -> bool:
    """Does the compact graph answer this request? It has the weights' top-k rows and
    summaries, not reductions, norms or hidden states."""
    return (
        has_graph
        and (spec.sparse or not spec.maps)
        and spec.reduce == "none"
        and spec.measure == "weights"
        and not hidden_states
    )


def half_in_graph(spec: AttentionSpec) -> bool:
    """Are the maps answered as the selected-maps graph casts them, float16? Only when
    nothing is computed from them here (a reduction, top rows, summaries), which
    float32 maps keep exact."""
    return (
        spec.dtype == "float16" and spec.reduce == "none" and not spec.sparse and not spec.summaries
    )


def selected_in_graph(
    spec: AttentionSpec,
    hidden_states: bool,
    kept: tuple[int, int],
    model: tuple[int, int],
    has_graph: bool,
) -> bool:
    """Does the selected-maps graph answer this request, returning less than the full
    graph would: ``kept`` (layers, heads) fewer than the ``model``'s, or float16? It has
    the weights, not norms or hidden states."""
    return (
        has_graph
        and spec.measure == "weights"
        and not hidden_states
        and (kept != model or half_in_graph(spec))
    )


def selected_maps(spec: AttentionSpec, layers: int, heads: int) -> float:
    """The selected-maps graph's outputs per sequence, in float32 maps (a float16 one
    counts half)."""
    return layers * heads * (0.5 if half_in_graph(spec) else 1.0)


def top_rows(maps: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[..., n, n] -> each row's ``k`` largest values and their int32 key indices,
    largest first, ties to the lower index."""
    order = np.argsort(-maps, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(maps, order, axis=-1), order.astype(np.int32)


def above(values: np.ndarray, indices: np.ndarray, threshold: float) -> tuple[np.ndarray, ...]:
    """Sorted rows cut to the values > ``threshold``: as wide as the fullest row, the
    others padded with key NO_KEY and value 0."""
    kept = values > threshold
    width = max(int(kept.sum(axis=-1).max(initial=0)), 1)
    values, indices, kept = values[..., :width], indices[..., :width], kept[..., :width]
    return np.where(kept, values, 0).astype(values.dtype), np.where(kept, indices, NO_KEY)


def summaries_of(maps: np.ndarray) -> np.ndarray:
    """[..., n, n] weights -> [..., n, 6]: ``graph_io.SUMMARIES`` of each query row, as
    the compact graph computes them (``model_export.compact_attention``)."""
    n = maps.shape[-1]
    rows = np.arange(n)
    entropy = -(maps * np.log(np.maximum(maps, 1e-30))).sum(axis=-1)
    previous = np.zeros(maps.shape[:-1], dtype=maps.dtype)
    following = np.zeros(maps.shape[:-1], dtype=maps.dtype)
    previous[..., 1:] = maps[..., rows[1:], rows[1:] - 1]
    following[..., :-1] = maps[..., rows[:-1], rows[:-1] + 1]
    distance = (maps * np.abs(rows[None, :] - rows[:, None])).sum(axis=-1)
    parts = (entropy, maps[..., 0], maps[..., rows, rows], previous, following, distance)
    return np.stack(parts, axis=-1).astype(np.float32)


def pick_summaries(rows: np.ndarray, spec: AttentionSpec) -> dict[str, np.ndarray]:
    """[L', H', n, 6] row statistics -> the asked ones by name: per token [L', H', n], or
    per sequence the mean over its query rows [L', H']."""
    picked = {}
    for name in spec.summaries:
        value = rows[..., SUMMARY_INDEX[name]]
        if not spec.summaries_per_token:
            value = value.mean(axis=-1, dtype=np.float64).astype(np.float32)
        picked[name] = np.ascontiguousarray(value)
    return picked


def compact_maps(
    values: np.ndarray, indices: np.ndarray, spec: AttentionSpec, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted rows (the graph's, or ``top_rows``') -> the answer's: the first ``k`` or
    those above the threshold, in the asked dtype."""
    values, indices = values[..., :k], indices[..., :k]
    if spec.threshold is not None:
        values, indices = above(values, indices, spec.threshold)
    return as_dtype(values, spec), np.ascontiguousarray(indices, dtype=np.int32)


def as_dtype(maps: np.ndarray, spec: AttentionSpec) -> np.ndarray:
    return np.ascontiguousarray(maps, dtype=np.float16 if spec.dtype == "float16" else np.float32)
