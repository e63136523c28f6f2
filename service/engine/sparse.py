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
from collections.abc import Iterable, Sequence

import mmh3
import numpy as np
from py_rust_stemmers import SnowballStemmer

from model_export.manifest import graph_io
from service.attention_scratch import attention_scratch_bytes
from service.engine import limits, splade, text
from service.engine.execute import OFFLOAD_BYTES
from service.engine.kind import RequestKind, Serving
from service.engine.rerank import require_task
from service.engine.scope import RequestScope
from service.engine.types import AnswerShape, SparseRequest, SparseResult, SparseVector
from service.errors import InvalidInput, PayloadTooLarge, UnsupportedByModel
from service.inference_lanes import SequenceResult
from service.model_info import ModelInfo
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
# What a kept nonzero holds from its vector's building until the answer is written: an
# int, a float and a str (BM42's stem, SPLADE's token), each in a list slot (~150 bytes
# measured for SPLADE's tokens; generous).
BYTES_PER_NONZERO = 200


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A checked request, the version it runs on, its texts' tokens, and its answer's
    worst case: its size (within ATTNSERVE_MAX_RESPONSE_BYTES) and its nonzeros."""

    request: SparseRequest
    runtime: ModelRuntime
    encoded: list[text.Tokenized]
    response_bytes: float
    nonzeros: int


def _checked(request: SparseRequest, serving: Serving) -> Prepared:
    """The request on its model, of the model's own kind of sparse vector unless it
    names one."""
    runtime = serving.registry.runtime(request.model)
    if request.kind is None:
        kind = "splade" if runtime.info.manifest.task == "splade" else "document"
        request = dataclasses.replace(request, kind=kind)
    return prepare(request, runtime, serving.settings)


def _model(prepared: Prepared) -> ModelInfo:
    return prepared.runtime.info


def _held(prepared: Prepared, serving: Serving) -> int:
    """Its tokens, the nonzeros of its vectors, the attention scratch of its runs, its
    answer's wire copies, and a SPLADE [vocab] row per text until its vector is built."""
    request, info = prepared.request, prepared.runtime.info
    lengths = [len(t) for t, _, _ in prepared.encoded]
    held = BYTES_PER_TOKEN * sum(lengths) + BYTES_PER_NONZERO * prepared.nonzeros
    held += attention_scratch_bytes(lengths, info.config, serving.settings.max_batch_tokens)
    held += int(prepared.response_bytes * request.wire_cost.copies)
    if request.kind == "splade":
        assert info.manifest.text is not None
        held += splade.FLOAT_BYTES * info.manifest.text.vocab_size * len(lengths)
    return held


async def _run(prepared: Prepared, scope: RequestScope, serving: Serving) -> SparseResult:
    """Documents run the sparse graph (the last layer's [CLS] attention row), SPLADE
    texts the head, in parts like a large pooled request; queries run nothing. What was
    built is checked against the price admission granted."""
    request, runtime, encoded = prepared.request, prepared.runtime, prepared.encoded
    execute = serving.execute
    tokens = sum(len(t) for t, _, _ in encoded)
    results = None
    if request.kind in ("document", "splade"):
        pairs = [text.id_pairs(ids, types) for _, ids, types in encoded]
        # prepare checked that the model has the graph
        graph = graph_io.GRAPH_SPLADE if request.kind == "splade" else graph_io.GRAPH_SPARSE
        results = await execute.results_in_parts(runtime, pairs, graph, scope)
        execute.count_tokens(runtime, tokens)
    if prepared.response_bytes > OFFLOAD_BYTES:
        found = await serving.admit.off_loop(vectors, request, runtime, encoded, results)
    else:
        found = vectors(request, runtime, encoded, results)
    check_within(found, prepared, runtime.info.name)
    return SparseResult(runtime.info.name, found, tokens, prepared.response_bytes)


# Sparse vectors: texts tokenized off the loop, the answer priced at its worst case
# before any run (413 beyond ATTNSERVE_MAX_RESPONSE_BYTES).
SPARSE: RequestKind[SparseRequest, Prepared, SparseResult] = RequestKind(
    "sparse", _checked, _model, _run, held=_held
)


def prepare(request: SparseRequest, runtime: ModelRuntime, settings: Settings) -> Prepared:
    """Check the request against the model, price its answer, tokenize its texts (a
    SPLADE answer, whose worst case does not depend on them, priced before)."""
    info = runtime.info
    if not request.texts:
        raise InvalidInput("is empty: send at least one string", field=("inputs",))
    limits.check_sequence_count(len(request.texts), settings, pooled_only=True)
    for i, item in enumerate(request.texts):
        if not item:  # as every other route: not its special tokens alone
            raise InvalidInput("is empty: send some text", field=("inputs", i))
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
    if request.kind == "splade":
        worst = splade_worst(request, runtime)
        size = price(request, info.name, [worst] * len(request.texts), settings)
    _, encoded = text.tokenize_all(
        runtime,
        request.texts,
        request.truncate,
        "inputs",
        settings,
        pooled_only=True,
        left=request.truncation_direction == "left",
    )
    if request.kind != "splade":
        worst_of = [bm42_worst(request, tokens) for tokens, _, _ in encoded]
        size = price(request, info.name, worst_of, settings)
        return Prepared(request, runtime, encoded, size, sum(k for k, _ in worst_of))
    return Prepared(request, runtime, encoded, size, worst[0] * len(encoded))


# A vector's most nonzeros and the characters of what is behind them.
Worst = tuple[int, int]


def splade_worst(request: SparseRequest, runtime: ModelRuntime) -> Worst:
    """Every word of the vocabulary (a random head's rows are that dense), or top_k of
    them; the longest tokens behind them."""
    assert runtime.info.manifest.text is not None
    vocab = runtime.info.manifest.text.vocab_size
    most = vocab if request.top_k is None else min(vocab, request.top_k)
    chars = text.front_end(runtime).longest_tokens_chars[most] if request.return_text else 0
    return most, chars


def bm42_worst(request: SparseRequest, tokens: list[str]) -> Worst:
    """A word per token at most (top_k of them), its stem no longer than its tokens."""
    most = len(tokens) if request.top_k is None else min(len(tokens), request.top_k)
    return most, sum(map(len, tokens)) if request.return_text else 0


def shape(request: SparseRequest, per_vector: list[Worst]) -> AnswerShape:
    """The answer of vectors of so many nonzeros (a float each, with its index in the
    wire cost), with what is behind each as a token when the answer names them."""
    nonzeros = sum(k for k, _ in per_vector)
    return AnswerShape(
        arrays=[(k,) for k, _ in per_vector],
        sequences=len(per_vector),
        token_strings=nonzeros if request.return_text else 0,
        token_chars=sum(chars for _, chars in per_vector),
    )


def price(request: SparseRequest, model: str, per_vector: list[Worst], settings: Settings) -> float:
    """The answer's worst-case size; 413 beyond ATTNSERVE_MAX_RESPONSE_BYTES, saying how
    many of these texts fit."""
    cost = request.wire_cost
    nothing = cost.bytes(shape(request, []), model)
    largest = max(per_vector)
    each = cost.bytes(shape(request, [largest]), model) - nothing
    fit = max(int((settings.max_response_bytes - nothing) // each), 0)
    hint = (
        f"at most {fit:,} of these texts fit in one answer (a vector may hold "
        f"{largest[0]:,} nonzeros{' with their text' if request.return_text else ''}): send "
        "fewer, or ask for top_k (each vector's k largest values)"
    )
    return limits.check_response_size(shape(request, per_vector), cost, model, settings, hint=hint)


def check_within(found: list[SparseVector], prepared: Prepared, model: str) -> None:
    """What was built never exceeds its price (a bound of ours proved wrong: 413, never
    a larger answer than admission granted)."""
    request = prepared.request
    named = request.return_text
    real = [(len(v.indices), sum(map(len, v.stems)) if named else 0) for v in found]
    size = request.wire_cost.bytes(shape(request, real), model)
    if size > prepared.response_bytes:
        raise PayloadTooLarge(
            f"the answer came to {size:,.0f} bytes, over the {prepared.response_bytes:,.0f} "
            "its worst case was priced at: ask for top_k"
        )


def vectors(
    request: SparseRequest,
    runtime: ModelRuntime,
    encoded: list[text.Tokenized],
    results: list[SequenceResult] | None,
) -> list[SparseVector]:
    """Each text's vector: a query's from its tokens alone, a document's weighed by its
    run of the sparse graph, a SPLADE text's from its row (``results``); cut by
    ``threshold`` and ``top_k``."""
    front_end = text.front_end(runtime)
    if request.kind == "splade":
        assert results is not None
        return [splade.vector_of(r[graph_io.OUTPUT_SPLADE], front_end, request) for r in results]
    special, stopwords = front_end.special_tokens, front_end.stopwords
    if results is None:
        found = [query_vector(tokens, special, stopwords) for tokens, _, _ in encoded]
    else:
        found = [
            document_vector(
                tokens, result[graph_io.OUTPUT_CLS_ATTENTION], special, stopwords, request.alpha
            )
            for (tokens, _, _), result in zip(encoded, results, strict=True)
        ]
    return [splade.selected(v, request) for v in found]
