"""Fewer vectors per document for late interaction (MaxSim), numpy only.

A late-interaction model stores one vector per document token, L2-normalised, and
scores a query of n token vectors q_i against a document of m vectors d_j by MaxSim:

    s(q, d) = Σ_i max_j q_i·d_j

(``maxsim``; ``maxsim_explained`` also names, per query token, the document token
that won: the score's explanation). Storing m vectors per document is the cost; this
module keeps fewer, measured against the full MaxSim by ``bench.pruning``:

- ``keep_by_attention``: the k tokens that receive the most attention in the run that
  encoded the document (no second pass), aggregated by ``received_attention``;
- ``keep_by_norm``: the k tokens whose vectors had the largest norm before
  normalisation;
- ``keep_at_random``: k tokens drawn uniformly (the baseline any rule must beat);
- ``muvera_fde``: MUVERA's fixed-dimensional encoding (Dhulipala et al., 2024): one
  vector per query or document whose dot product approximates MaxSim.

Each ``keep_*`` takes per-token scores and returns the kept positions in ascending
order: min(k, candidates) of them, ``candidates`` (a boolean mask) saying which
tokens may be kept at all (e.g. not [CLS] and [SEP]). Ties go to the earlier token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
IndexArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

EPS = 1e-12


def normalize(vectors: npt.NDArray[np.floating[Any]]) -> FloatArray:
    """Each row L2-normalised (a zero row stays zero): [T, d] -> [T, d] float32."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    out: FloatArray = (v / np.maximum(norms, EPS)).astype(np.float32)
    return out


def maxsim(query: FloatArray, document: FloatArray) -> float:
    """Σ_i max_j q_i·d_j of query [n, d] against document [m, d] (m >= 1)."""
    return maxsim_explained(query, document)[0]


def maxsim_explained(query: FloatArray, document: FloatArray) -> tuple[float, IndexArray]:
    """MaxSim and, per query token, the document token of its maximum: [n] positions
    into ``document`` (the first one on a tie)."""
    sims = query @ document.T  # (n, m)
    best = sims.argmax(axis=1)
    return float(sims[np.arange(len(query)), best].sum(dtype=np.float64)), best.astype(np.int64)


def maxsim_many(query: FloatArray, documents: FloatArray, offsets: IndexArray) -> FloatArray:
    """MaxSim of one query [n, d] against many documents stacked as ``documents``
    [Σm, d], document t being rows offsets[t]:offsets[t + 1] (offsets [D + 1], from 0,
    every document non-empty) -> [D] float32: ``maxsim`` per document, in one product."""
    one = np.array([0, len(query)], dtype=np.int64)
    scores: FloatArray = maxsim_matrix(query, one, documents, offsets)[0]
    return scores


def maxsim_matrix(
    queries: FloatArray, query_offsets: IndexArray, documents: FloatArray, offsets: IndexArray
) -> FloatArray:
    """MaxSim of many queries against many documents, each side stacked as ``stack``
    gives it -> [Q, D] float32."""
    sims = documents @ queries.T  # (Σm, Σn)
    best = np.maximum.reduceat(sims, offsets[:-1], axis=0)  # (D, Σn): max_j per document
    summed = np.add.reduceat(best.astype(np.float64), query_offsets[:-1], axis=1)  # (D, Q)
    scores: FloatArray = summed.T.astype(np.float32)
    return scores


def stack(documents: list[FloatArray]) -> tuple[FloatArray, IndexArray]:
    """Documents' vectors -> (their rows stacked, the offsets ``maxsim_many`` takes)."""
    lengths = np.array([len(d) for d in documents], dtype=np.int64)
    if (lengths == 0).any():
        raise ValueError("every document needs at least one vector")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.concatenate(documents).astype(np.float32), offsets


def _top(scores: npt.NDArray[np.floating], k: int, candidates: BoolArray | None) -> IndexArray:
    """The positions of the k largest scores among the candidates, ascending."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    allowed = np.ones(len(scores), dtype=bool) if candidates is None else candidates
    pool = np.flatnonzero(allowed)
    order = np.argsort(-np.asarray(scores, dtype=np.float64)[pool], kind="stable")
    return np.sort(pool[order[:k]]).astype(np.int64)


def received_attention(
    attentions: FloatArray,
    *,
    layers: Literal["last", "mean"] = "last",
    rows: Literal["all", "first"] = "all",
    value_norms: FloatArray | None = None,
) -> FloatArray:
    """How much attention each token receives in one sequence's run: its maps
    attentions [L, H, T, T] (rows are queries, real tokens only) -> [T].

    The layer's (``last``) or the layers' mean (``mean``) weights a_ij, averaged over
    heads, summed over every query row i (``all``) or taken from the first row, the
    [CLS] token's (``first``: the sparse graph's ``cls_attention`` for the last layer):
    r_j = Σ_i mean_h a_hij. With ``value_norms`` [L, H, T] (‖f_h(x_j)‖, Kobayashi et
    al. 2020) each weight is scaled by its key's value norm first: the norm of what
    token j sends, not only its weight."""
    maps = attentions[-1:] if layers == "last" else attentions  # (L', H, T, T)
    if rows == "first":
        maps = maps[:, :, :1]  # (L', H, 1, T)
    if value_norms is not None:
        norms = value_norms[-1:] if layers == "last" else value_norms  # (L', H, T)
        maps = maps * norms[:, :, None, :]
    received: FloatArray = maps.sum(axis=2).mean(axis=(0, 1)).astype(np.float32)  # (T,)
    return received


def keep_by_attention(
    received: FloatArray, k: int, candidates: BoolArray | None = None
) -> IndexArray:
    """The k tokens receiving the most attention (``received_attention``)."""
    return _top(received, k, candidates)


def keep_by_norm(norms: FloatArray, k: int, candidates: BoolArray | None = None) -> IndexArray:
    """The k tokens whose vectors had the largest norms before normalisation."""
    return _top(norms, k, candidates)


def keep_at_random(
    n: int, k: int, rng: np.random.Generator, candidates: BoolArray | None = None
) -> IndexArray:
    """k of the n tokens drawn uniformly without replacement."""
    return _top(rng.random(n), k, candidates)


@dataclass(frozen=True)
class FdeConfig:
    """MUVERA's parameters: ``k_sim`` SimHash bits (2^k_sim partitions per
    repetition), an inner projection to ``d_proj`` dimensions (random ±1/sqrt(d_proj);
    none where ``d_proj`` is the vectors' own width), ``repetitions`` independent
    partitions, all drawn from ``seed``. An encoding has 2^k_sim · d_proj ·
    repetitions floats. Queries and documents must share one config."""

    k_sim: int
    d_proj: int
    repetitions: int
    seed: int = 0

    def dim(self) -> int:
        return (1 << self.k_sim) * self.d_proj * self.repetitions

    def draws(self, width: int) -> list[tuple[FloatArray, FloatArray | None]]:
        """Per repetition: the SimHash planes [width, k_sim] and the projection
        [width, d_proj] (None: no projection)."""
        rng = np.random.default_rng(self.seed)
        out: list[tuple[FloatArray, FloatArray | None]] = []
        for _ in range(self.repetitions):
            planes = rng.standard_normal((width, self.k_sim)).astype(np.float32)
            projection = None
            if self.d_proj != width:
                signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), (width, self.d_proj))
                projection = (signs / np.sqrt(self.d_proj)).astype(np.float32)
            out.append((planes, projection))
        return out


def muvera_fde(
    vectors: FloatArray,
    config: FdeConfig,
    *,
    query: bool,
    draws: list[tuple[FloatArray, FloatArray | None]] | None = None,
) -> FloatArray:
    """MUVERA's fixed-dimensional encoding of one query's or document's vectors
    [T, d] -> [config.dim()]; <fde(q, query=True), fde(d, query=False)> approximates
    MaxSim(q, d).

    Per repetition each vector falls in the partition of its SimHash bits (sign of
    its product with each plane); a partition's block is the sum of its (projected)
    query vectors, or the mean of its document vectors. A document partition left
    empty takes the vector whose bits are nearest to it (Hamming; the first on a
    tie), as the paper's fill_empty_partitions; a query's stays zero. ``draws``:
    ``config.draws(d)``, passed in to draw once for many encodings."""
    width = vectors.shape[1]
    parts = 1 << config.k_sim
    bit_values = (1 << np.arange(config.k_sim)).astype(np.int64)
    part_bits = (np.arange(parts)[:, None] >> np.arange(config.k_sim)) & 1  # (P, k_sim)
    blocks = []
    for planes, projection in draws if draws is not None else config.draws(width):
        bits = (vectors @ planes > 0).astype(np.int64)  # (T, k_sim)
        part = bits @ bit_values  # (T,)
        projected = vectors if projection is None else vectors @ projection  # (T, d_proj)
        members = (part[None, :] == np.arange(parts)[:, None]).astype(np.float64)  # (P, T)
        block = members @ projected  # (P, d_proj): each partition's sum
        counts = members.sum(axis=1).astype(np.int64)
        if not query:
            filled = counts > 0
            block[filled] /= counts[filled, None]
            if not filled.all():
                empty = np.flatnonzero(~filled)
                hamming = (part_bits[empty, None, :] != bits[None, :, :]).sum(axis=2)  # (E, T)
                block[empty] = projected[hamming.argmin(axis=1)]
        blocks.append(block.reshape(-1))
    return np.concatenate(blocks).astype(np.float32)
