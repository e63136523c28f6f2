"""BM42 sparse vectors from the last layer's [CLS] attention row (Qdrant's BM42, as
fastembed computes it for ``Qdrant/bm42-all-minilm-l6-v2-attentions``).

A document's WordPiece tokens are merged back into words (``##`` continuations
appended, special tokens skipped), a word weighing the sum of its tokens' [CLS]
attention; stopwords and single punctuation characters are dropped, the rest
stemmed (English Snowball); each stem keeps its largest weight, and becomes
index ``abs(mmh3.hash(stem))`` (MurmurHash3 32-bit, seed 0) with value
``log(1 + weight) ** alpha``. A query weighs 1.0 per stem and needs no model run.
The same indices as fastembed's, so a Qdrant collection (sparse vectors with the
``idf`` modifier) can mix both.
"""

from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import mmh3
import numpy as np
from py_rust_stemmers import SnowballStemmer

from model_export.manifest import graph_io
from service.engine import splade, text
from service.engine.admit import Admit
from service.engine.execute import Executor
from service.engine.registry import Registry
from service.engine.rerank import require_task
from service.engine.scope import RequestScope
from service.engine.types import SparseRequest, SparseResult, SparseVector
from service.errors import InvalidInput, UnsupportedByModel
from service.inference_lanes import SequenceResult
from service.runtime import ModelRuntime
from service.settings import Settings

PUNCTUATION = frozenset(string.punctuation)
CONTINUATION = "##"  # WordPiece's prefix of a word's later pieces


def words(tokens: Sequence[str], special: frozenset[str]) -> list[tuple[str, list[int]]]:
    """WordPiece tokens -> (word, the token positions it came from), special tokens skipped."""
    merged: list[tuple[str, list[int]]] = []
    for position, token in enumerate(tokens):
        if token in special:
            continue
        if not token.startswith(CONTINUATION):
            merged.append((token, [position]))
        elif merged:
            word, positions = merged[-1]
            merged[-1] = (word + token[len(CONTINUATION) :], [*positions, position])
        else:  # a text that starts mid-word: the piece is a word of its own
            merged.append((token[len(CONTINUATION) :], [position]))
    return merged


def stems(
    merged: Iterable[tuple[str, list[int]]], stopwords: frozenset[str]
) -> list[tuple[str, list[int]]]:
    """Stopwords and punctuation dropped, the rest stemmed (English Snowball)."""
    stemmer = SnowballStemmer("english")
    return [
        (stemmer.stem_word(word), positions)
        for word, positions in merged
        if word not in stopwords and word not in PUNCTUATION
    ]


def index_of(stem: str) -> int:
    return abs(mmh3.hash(stem))


def document_vector(
    tokens: Sequence[str],
    weights: np.ndarray,
    special: frozenset[str],
    stopwords: frozenset[str],
    alpha: float,
) -> SparseVector:
    """A document's BM42 vector from its tokens and their [CLS] attention weights."""
    best: dict[str, float] = {}
    for stem, positions in stems(words(tokens, special), stopwords):
        weight = sum(float(weights[p]) for p in positions)
        best[stem] = max(best.get(stem, 0.0), weight)
    return _vector({stem: math.log(1.0 + w) ** alpha for stem, w in best.items()})


def query_vector(
    tokens: Sequence[str], special: frozenset[str], stopwords: frozenset[str]
) -> SparseVector:
    """A query's vector: 1.0 per stem (BM25's query side; no model run)."""
    return _vector({stem: 1.0 for stem, _ in stems(words(tokens, special), stopwords)})


def _vector(by_stem: dict[str, float]) -> SparseVector:
    # Two stems with one hash: the later wins, as a dict keyed by index keeps it.
    by_index: dict[int, tuple[float, str]] = {}
    for stem, value in by_stem.items():
        by_index[index_of(stem)] = (value, stem)
    return SparseVector(
        list(by_index), [v for v, _ in by_index.values()], [s for _, s in by_index.values()]
    )


# -- the request ---------------------------------------------------------------------------

# What a BM42 request holds per token: its ids and types, its weight, its tokens and the
# words, stems and vector built from them (Python objects: generous).
BYTES_PER_TOKEN = 512
W = TypeVar("W")  # what a protocol keeps from parsing to writing its answer


async def embed(
    parse: Callable[[], tuple[SparseRequest, W]],
    scope: RequestScope,
    registry: Registry,
    admit: Admit,
    execute: Executor,
) -> tuple[SparseResult, W]:
    """BM42 vectors: texts tokenized off the loop; documents run the sparse graph (the
    last layer's [CLS] attention row) in parts like a large pooled request, queries run
    nothing. Admission, deadline and disconnects as an encode request."""
    settings = execute.settings

    def checked(request: SparseRequest) -> Prepared:
        runtime = registry.runtime(request.model)
        if request.kind is None:  # the model's own kind of sparse vector
            kind = "splade" if runtime.info.manifest.task == "splade" else "document"
            request = dataclasses.replace(request, kind=kind)
        return request, runtime, prepare(request, runtime, settings)

    (request, runtime, encoded), wire = await admit.prepared(scope, parse, checked, lambda _: False)
    info = runtime.info
    scope.served(info.name, info.version)
    tokens = sum(len(t) for t, _, _ in encoded)
    ticket = scope.admitted()
    held = BYTES_PER_TOKEN * tokens
    if request.kind == "splade":  # a [vocab] row per text until its vector is built
        assert info.manifest.text is not None
        held += splade.FLOAT_BYTES * info.manifest.text.vocab_size * len(encoded)
    ticket.hold(ticket.bytes + held, "this request")
    results = None
    if request.kind in ("document", "splade"):
        pairs = [text.id_pairs(ids, types) for _, ids, types in encoded]
        # prepare checked that the model has the graph
        graph = graph_io.GRAPH_SPLADE if request.kind == "splade" else graph_io.GRAPH_SPARSE
        results = await execute.results_in_parts(runtime, pairs, graph, scope)
        execute.count_tokens(runtime, tokens)
    found = vectors(request, runtime, encoded, results)
    return SparseResult(info.name, [splade.selected(v, request) for v in found], tokens), wire


# A checked request, the version it runs on and its texts' tokens.
Prepared = tuple[SparseRequest, ModelRuntime, list[text.Tokenized]]


def prepare(
    request: SparseRequest, runtime: ModelRuntime, settings: Settings
) -> list[text.Tokenized]:
    """Check the request against the model and tokenize its texts."""
    info = runtime.info
    if not request.texts:
        raise InvalidInput("is empty: send at least one string", field=("inputs",))
    splade.check_options(request)
    if request.kind == "splade":
        require_task(info, ("splade",), "give SPLADE vectors")
    if not (math.isfinite(request.alpha) and request.alpha > 0):
        raise InvalidInput(f"must be a positive number, got {request.alpha!r}", field=("alpha",))
    manifest_text = info.manifest.text
    if request.kind == "document" and (manifest_text is None or manifest_text.sparse_graph is None):
        raise UnsupportedByModel(
            f"model {info.name!r} has no BM42 graph: BM42 merges WordPiece's ## word "
            "pieces, so only models with a WordPiece tokenizer have one (older exports "
            "of such a model: re-export it with this version of model_export)",
            field=("model",),
        )
    _, encoded = text.tokenize_all(
        runtime,
        request.texts,
        request.truncate,
        "inputs",
        settings,
        pooled_only=True,
        left=request.truncation_direction == "left",
    )
    return encoded


def vectors(
    request: SparseRequest,
    runtime: ModelRuntime,
    encoded: list[text.Tokenized],
    results: list[SequenceResult] | None,
) -> list[SparseVector]:
    """Each text's vector: a query's from its tokens alone, a document's weighed by its
    run of the sparse graph (``results``)."""
    front_end = text.front_end(runtime)
    if request.kind == "splade":
        assert results is not None
        return [splade.vector_of(r[graph_io.OUTPUT_SPLADE], front_end) for r in results]
    special, stopwords = front_end.special_tokens, front_end.stopwords
    if results is None:
        return [query_vector(tokens, special, stopwords) for tokens, _, _ in encoded]
    return [
        document_vector(
            tokens, result[graph_io.OUTPUT_CLS_ATTENTION], special, stopwords, request.alpha
        )
        for (tokens, _, _), result in zip(encoded, results, strict=True)
    ]
