"""Numpy work on one sequence's outputs: attention selection, reduction, rollout, pooling."""

from __future__ import annotations

import numpy as np

from service.errors import FieldPath, InvalidInput


def resolve_indices(indices: list[int] | None, size: int, what: str, where: FieldPath) -> list[int]:
    """Normalise (possibly negative) indices into [0, size); reject out-of-range ones.

    ``what`` names the things indexed (layers, heads), ``where`` the request's field.
    """
    if indices is None:
        return list(range(size))
    if not indices:
        raise InvalidInput("must not be empty (omit it for all)", field=where)
    bad = [i for i in indices if not -size <= i < size]
    if bad:
        raise InvalidInput(
            f"{bad} out of range: the model has {size} {what} (valid: {-size}..{size - 1})",
            field=where,
        )
    return [i % size for i in indices]


def rollout(attn: np.ndarray) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020) of [L, H, n, n] -> [1, 1, n, n].

    Heads are averaged, each layer mixed with the identity for the residual path
    (0.5 A + 0.5 I, rows renormalised) and the layers multiplied in order:
    R = Â_L ... Â_1.
    """
    n = attn.shape[-1]
    eye = np.eye(n, dtype=np.float64)
    result = eye
    for layer in attn.astype(np.float64).mean(axis=1):  # (n, n) per layer
        mixed = 0.5 * layer + 0.5 * eye
        mixed /= mixed.sum(axis=-1, keepdims=True)
        result = mixed @ result
    return result.astype(np.float32)[None, None]


def select_attention(
    attn: np.ndarray, layers: list[int], heads: list[int], reduce: str
) -> np.ndarray:
    """[L, H, n, n] -> the selected layers/heads, reduced as asked."""
    chosen: np.ndarray = attn[np.ix_(layers, heads)]  # (L', H', n, n), one copy
    if reduce == "mean":
        return np.asarray(chosen.mean(axis=1, keepdims=True))
    if reduce == "max":
        return np.asarray(chosen.max(axis=1, keepdims=True))
    if reduce == "rollout":
        return rollout(chosen)
    return chosen


def pool(
    hidden: np.ndarray, pooling: str, normalize: bool, dimensions: int | None = None
) -> np.ndarray:
    """[n, d] real-token embeddings -> [d], or its first ``dimensions`` (Matryoshka).

    Truncation comes before normalisation, so a truncated vector is a unit vector too.
    """
    vector: np.ndarray
    if pooling == "mean":
        vector = np.mean(hidden, axis=0)
    elif pooling == "max":
        vector = np.max(hidden, axis=0)
    else:  # cls
        vector = hidden[0]
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector.astype(np.float32)
