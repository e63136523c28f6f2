"""SPLADE sparse vectors from a model's masked-LM head, and the options of any sparse
vector (``top_k``, ``threshold``).

The head's graph (``graph_io.GRAPH_SPLADE``) answers each text's [vocab] row, max over
tokens of log(1 + relu(logits)), zero wherever no token pushed that word up: the
vector is its nonzeros, indexed by vocabulary id (sentence-transformers'
``SparseEncoder``, TEI's ``--pooling splade``), each with the token it stands for.
A row is [vocab] float32 (122 KB for BERT's 30,522 words), so a request holds that
per text until its vectors are built; each run's [batch, tokens, vocab] logits are
bounded by the batcher (``max_batch_attention_floats``).
"""

from __future__ import annotations

import math

import numpy as np

from service.engine.types import SparseRequest, SparseVector
from service.errors import InvalidInput
from service.tokenizer import TextFrontEnd

FLOAT_BYTES = 4


def check_options(request: SparseRequest) -> None:
    """top_k a positive integer, threshold a finite number >= 0 (422 naming them)."""
    if request.top_k is not None and request.top_k < 1:
        raise InvalidInput(f"must be at least 1, got {request.top_k}", field=("top_k",))
    threshold = request.threshold
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise InvalidInput(f"must be a number >= 0, got {threshold!r}", field=("threshold",))


def selected(vector: SparseVector, request: SparseRequest) -> SparseVector:
    """``vector`` with values below ``threshold`` dropped, then its ``top_k`` largest kept
    (ties: the lower index); still in index order."""
    keep = list(range(len(vector.indices)))
    if request.threshold is not None:
        keep = [k for k in keep if vector.values[k] >= request.threshold]
    if request.top_k is not None and len(keep) > request.top_k:
        best = sorted(keep, key=lambda k: (-vector.values[k], vector.indices[k]))[: request.top_k]
        keep = sorted(best, key=lambda k: vector.indices[k])
    return SparseVector(
        [vector.indices[k] for k in keep],
        [vector.values[k] for k in keep],
        [vector.stems[k] for k in keep],
    )


def vector_of(row: np.ndarray, front_end: TextFrontEnd, request: SparseRequest) -> SparseVector:
    """One text's [vocab] SPLADE row -> its nonzeros by vocabulary id, ascending, cut by
    the request's ``threshold`` and ``top_k`` (as ``selected``) before any of them becomes
    a Python object; the tokens behind them only when the answer names them."""
    (indices,) = np.nonzero(row)
    values = row[indices].astype(np.float64)
    if request.threshold is not None:
        keep = values >= request.threshold
        indices, values = indices[keep], values[keep]
    if request.top_k is not None and len(indices) > request.top_k:
        best = np.sort(np.lexsort((indices, -values))[: request.top_k])  # still by index
        indices, values = indices[best], values[best]
    ids = indices.tolist()
    return SparseVector(
        ids, values.tolist(), front_end.tokens_of_ids(ids) if request.return_text else []
    )
