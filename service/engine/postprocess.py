"""Numpy work on one sequence's outputs: attention selection, reduction, rollout, pooling."""

from __future__ import annotations

from collections import Counter

import numpy as np

from service.dense import DenseWeights, apply_dense
from service.errors import FieldPath, InvalidInput

# Offending indices named in an error, at most (the list itself may be huge).
SHOWN_INDICES = 10


def resolve_indices(indices: list[int] | None, size: int, what: str, where: FieldPath) -> list[int]:
    """Normalise (possibly negative) indices into [0, size); reject out-of-range and
    repeated ones.

    Repeats are refused, not deduplicated: each one would multiply the work and the
    answer, and ``[0, 0]`` asking for two copies of one map is a mistake worth naming.
    So a resolved list is never longer than ``size``. ``what`` names the things
    indexed (layers, heads), ``where`` the request's field.
    """
    if indices is None:
        return list(range(size))
    if not indices:
        raise InvalidInput("must not be empty (omit it for all)", field=where)
    bad = [i for i in indices if not -size <= i < size]
    if bad:
        raise InvalidInput(
            f"{_shown(bad)} out of range: the model has {size} {what} (valid: {-size}..{size - 1})",
            field=where,
        )
    resolved = [i % size for i in indices]
    if len(set(resolved)) != len(resolved):
        counts = Counter(resolved)
        repeated = sorted(i for i, count in counts.items() if count > 1)
        raise InvalidInput(
            f"{what} {_shown(repeated)} repeated (negative indices count from the end): "
            "name each at most once",
            field=where,
        )
    return resolved


def _shown(values: list[int]) -> str:
    head = ", ".join(map(str, values[:SHOWN_INDICES]))
    return f"[{head}{', ...' if len(values) > SHOWN_INDICES else ''}]"


def rollout(
    attn: np.ndarray,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    norms: np.ndarray | None = None,
) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020) of [L, H, n, n] -> [1, 1, n, n].

    The chosen heads (default all) of the chosen layers (default all, bottom-up) are
    averaged, each layer mixed with the identity
    for the residual path (0.5 A + 0.5 I, rows renormalised) and the layers
    multiplied in order: R = Â_L ... Â_1. With ``norms`` [L, H, n] the maps are
    attention norms (``scaled``), each averaged map's rows normalised to sum to 1
    before the mixing. One layer at a time, so the float64 work is a few [n, n]
    matrices whatever the depth.
    """
    n = attn.shape[-1]
    eye = np.eye(n, dtype=np.float64)
    result = eye
    for index in range(len(attn)) if layers is None else layers:
        chosen = scaled(attn, norms, index, heads)  # (H', n, n)
        averaged = chosen.mean(axis=0, dtype=np.float64)
        if norms is not None:
            averaged /= np.maximum(averaged.sum(axis=-1, keepdims=True), 1e-30)
        mixed = 0.5 * averaged + 0.5 * eye
        mixed /= mixed.sum(axis=-1, keepdims=True)
        result = mixed @ result
    return result.astype(np.float32)[None, None]


def scaled(
    attn: np.ndarray, norms: np.ndarray | None, layer: int, heads: list[int] | None
) -> np.ndarray:
    """One layer's chosen maps [H', n, n]: weights α_ij, or with ``norms`` [L, H, n] the
    attention norms α_ij · ‖f_h(x_j)‖ (Kobayashi et al., 2020): how far token j moves
    token i through head h, not only how much i looks at j."""
    chosen: np.ndarray = attn[layer] if heads is None else attn[layer, heads]
    if norms is None:
        return chosen
    row = norms[layer] if heads is None else norms[layer, heads]  # (H', n)
    product: np.ndarray = chosen * row[:, None, :]
    return product


def select_attention(
    attn: np.ndarray,
    layers: list[int],
    heads: list[int],
    reduce: str,
    norms: np.ndarray | None = None,
) -> np.ndarray:
    """[L, H, n, n] -> the selected layers/heads, reduced as asked; with ``norms`` the
    attention norms instead of the weights (``scaled``).

    Reductions go layer by layer, so nothing bigger than the answer plus one layer's
    selected heads ([H', n, n]) is ever allocated (see ``limits.work_bytes``).
    """
    if reduce == "none":
        if norms is None:
            if layers == list(range(attn.shape[0])) and heads == list(range(attn.shape[1])):
                return attn  # every map, in order: the run's own buffer, no copy
            return np.asarray(attn[np.ix_(layers, heads)])  # (L', H', n, n): the answer itself
        return np.stack([scaled(attn, norms, layer, heads) for layer in layers])
    if reduce == "rollout":
        return rollout(attn, layers, heads, norms)
    n = attn.shape[-1]
    out = np.empty((len(layers), 1, n, n), dtype=np.float32)
    for row, layer in enumerate(layers):
        chosen = scaled(attn, norms, layer, heads)  # (H', n, n)
        out[row, 0] = chosen.mean(axis=0) if reduce == "mean" else chosen.max(axis=0)
    return out


def pool(
    hidden: np.ndarray,
    pooling: str,
    normalize: bool,
    dimensions: int | None = None,
    skip: int = 0,
    dense: tuple[DenseWeights, ...] = (),
) -> np.ndarray:
    """[n, d] real-token embeddings -> [d] (the last ``dense`` layer's width after the
    model's Dense layers), or its first ``dimensions`` (Matryoshka).

    ``last`` is the last token (sentence-transformers' ``lasttoken``: its last
    non-padding token; a sequence here has no padding). ``skip`` leaves the first
    tokens out, as sentence-transformers' ``include_prompt: false`` leaves a prompt's
    ([CLS] with it): ``cls`` is then the first token after them. Truncation comes
    before normalisation, so a truncated vector is a unit vector too.
    """
    pooled = hidden[skip:]
    vector: np.ndarray
    if pooling == "mean":
        vector = np.mean(pooled, axis=0)
    elif pooling == "max":
        vector = np.max(pooled, axis=0)
    elif pooling == "last":
        vector = pooled[-1]
    else:  # cls
        vector = pooled[0]
    if dense:
        vector = apply_dense(vector, dense)
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector.astype(np.float32)
