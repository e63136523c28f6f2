"""Late interaction: a vector per token (ColBERT, bge-m3's ``colbert_vecs``), and with it
a dense and a sparse vector, from one run of the multi-vector graph
(``graph_io.GRAPH_MULTI_VECTOR``, the manifest's ``late_interaction``).

A text is read as a query or a document, as sentence-transformers' ``MultiVectorEncoder``
reads it (``encode_query`` / ``encode_document``): the side's prompt (ColBERT's [Q] or
[D] marker) prepended, cut to the side's length (its last token, [SEP], kept), and a
query shorter than its expansion length filled with the expansion token ([MASK]) to
it, those tokens masked out of attention unless the model attends to them
(``graph_io.TYPE_SCORED_ONLY``). Each kept token's vector is the graph's (projected and
normalised there); a document leaves out its skiplist tokens (punctuation), bge-m3 its
first token. bge-m3's dense vector is its pooled [CLS] and its sparse vector each token
id's largest weight ``relu(w·h + b)``, special tokens left out (FlagEmbedding's
``BGEM3FlagModel``).

MaxSim scores a query against a document: the sum over the query's vectors of the best
dot product with any of the document's (``pruning.maxsim_explained``; divided by the
query's vector count for ``meanmaxsim``). ``rerank`` answers with it on a multi-vector
model, each query token's best document token and its share of the score as the
explanation: the terms sum to the score exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from model_export.manifest import LateInteraction, graph_io
from service.attention_scratch import attention_scratch_bytes
from service.engine import limits, postprocess, pruning, text
from service.engine.execute import OFFLOAD_BYTES
from service.engine.kind import RequestKind, Serving
from service.engine.rank_explain import MaxSimExplanation
from service.engine.rerank import Ranked, RerankRequest, RerankResult
from service.engine.scope import RequestScope
from service.engine.types import AnswerShape, SparseVector, WireCost
from service.errors import InvalidInput, PayloadTooLarge, UnsupportedByModel
from service.inference_lanes import SequenceResult
from service.model_info import ModelInfo
from service.runtime import ModelRuntime
from service.settings import Settings

SIDES = ("query", "document")
PRUNE_METHODS = ("attention",)
OUTPUTS = ("multi_vector", "dense", "sparse")
# What a request holds per token beyond its outputs: ids, types, tokens, masks (generous).
BYTES_PER_TOKEN = 512
FLOAT32 = 4


@dataclass(frozen=True)
class Prune:
    """Keep fewer of a document's vectors: those of the ``k`` tokens (or the ``fraction``
    of its candidate tokens, rounded up) receiving the most attention in the run that
    encoded it (graph_io.OUTPUT_ATTENTION_RECEIVED), candidates being its kept tokens less
    the tokenizer's special ones. Exactly one of ``k`` and ``fraction``."""

    method: str = "attention"
    k: int | None = None
    fraction: float | None = None


@dataclass(frozen=True)
class MultiVectorRequest:
    texts: list[str]
    wire_cost: WireCost
    model: str | None = None
    input_type: str = "document"  # "query" | "document": the side texts are read as
    outputs: tuple[str, ...] = ("multi_vector",)  # any of OUTPUTS, from one run
    truncate: bool = True  # cut to the side's length (ColBERT's); else 413 past it
    return_text: bool = False  # each sparse nonzero's token
    half: bool = False  # the token vectors as float16
    field: str = "input"  # what the protocol's body calls the texts
    prune: Prune | None = None  # documents only: fewer vectors, by attention received
    # The token vectors answered as one [n, most kept, dim] tensor, each text's padded to
    # the most any keeps (the Open Inference Protocol's): priced padded.
    padded: bool = False


@dataclass(frozen=True)
class MultiVectorItem:
    """One text's answer: ``vectors`` [n, dim] float32 (one per kept token), ``dense``
    [d], ``sparse`` token id -> weight; each only where asked."""

    vectors: np.ndarray | None
    dense: np.ndarray | None
    sparse: SparseVector | None
    tokens: int


@dataclass(frozen=True)
class MultiVectorResult:
    model: str
    items: list[MultiVectorItem]
    tokens: int
    response_bytes: float  # the engine's estimate of the answer's size


@dataclass(frozen=True)
class Sequence:
    """A text read as one side: its tokens, ids and types as the graph takes them (the
    query's expansion tokens included), the rows whose vectors it keeps, and how many of
    its tokens are the text's own (the rest: expansion)."""

    tokens: list[str]
    ids: list[int]
    types: list[int]
    kept: np.ndarray  # bool [n]
    real: int


def late_interaction_of(info: ModelInfo) -> LateInteraction:
    """The model's late interaction, or 422 naming it."""
    late = info.manifest.late_interaction
    if late is None:
        raise UnsupportedByModel(
            f"model {info.name!r} gives no vector per token for late interaction (models "
            "that do: ColBERT, bge-m3 and sentence-transformers MultiVectorEncoder "
            "checkpoints, exported by model_export)",
            field=("model",),
        )
    return late


def side_length(info: ModelInfo, late: LateInteraction, side: str) -> int:
    """The most tokens a text of ``side`` is read as (the expansion's fixed width for a
    query of a ``fixed`` expansion)."""
    expansion = late.expansion if side == "query" else None
    if expansion is not None and expansion.strategy == "fixed":
        most = expansion.length
    else:
        most = (late.query_length if side == "query" else late.document_length) or info.max_seq_len
    return min(most, info.max_seq_len)


def read_as(
    runtime: ModelRuntime,
    texts: list[str],
    side: str,
    settings: Settings,
    *,
    truncate: bool,
    field: str,
) -> list[Sequence]:
    """Texts read as ``side``: prompted, tokenized, cut to the side's length (else 413),
    a query expanded; each with the rows it keeps."""
    info = runtime.info
    late = late_interaction_of(info)
    prompt = info.manifest.prompts.get(side, "")
    most = side_length(info, late, side)
    _, encoded = text.tokenize_all(
        runtime, [prompt + t for t in texts], truncate, field, settings, pooled_only=True
    )
    skip = frozenset(late.skiplist_ids) if side in late.skiplist_sides else frozenset()
    expansion = late.expansion if side == "query" else None
    front_end = text.front_end(runtime)
    sequences = []
    for i, (tokens, ids, types) in enumerate(encoded):
        if len(ids) > most:
            if not truncate:
                raise PayloadTooLarge(
                    f"is {len(ids)} tokens with its prompt; a {side} is read as at most "
                    f"{most}: send a shorter text, or truncate",
                    field=(field, i),
                )
            tokens = tokens[: most - 1] + tokens[-1:]
            ids, types = ids[: most - 1] + ids[-1:], types[: most - 1] + types[-1:]
        real = len(ids)
        floor = 0 if expansion is None else min(expansion.length, info.max_seq_len)
        if expansion is not None and real < floor:
            fill = floor - real
            (token,) = front_end.tokens_of_ids([expansion.token_id])
            kind = 0 if expansion.attend else graph_io.TYPE_SCORED_ONLY
            tokens = tokens + [token] * fill
            ids, types = ids + [expansion.token_id] * fill, types + [kind] * fill
        kept = np.array([t not in skip for t in ids], dtype=bool)
        kept[real:] = True  # expansion tokens are scored, whatever they are
        if late.skip_first:
            kept[0] = False
        sequences.append(Sequence(tokens, ids, types, kept, real))
    return sequences


def answer_shape(
    request: MultiVectorRequest,
    info: ModelInfo,
    seqs: list[Sequence],
    special_tokens: frozenset[str] = frozenset(),
) -> AnswerShape:
    """The answer's arrays: per text its kept vectors (pruned: as many as ``pruned_count``
    keeps, ``special_tokens`` not candidates) and its dense vector; its sparse vector, at
    most a nonzero per real token, counted as listed tokens (an index and a value each,
    and its token's characters where asked)."""
    late = late_interaction_of(info)
    arrays: list[tuple[int, ...]] = []
    strings = chars = half = 0

    def vectors(s: Sequence) -> int:
        rows = int(s.kept.sum())
        if request.prune is not None:
            rows = pruned_count(request.prune, int(candidates(s, special_tokens).sum()))
        return rows

    # Padded (request.padded): each text's as many as the most any keeps.
    most = max(map(vectors, seqs)) if request.padded and seqs else 0
    for s in seqs:
        if "multi_vector" in request.outputs:
            rows = most if request.padded else vectors(s)
            arrays.append((rows, late.dim))
            half += rows * late.dim if request.half else 0
        if "dense" in request.outputs:
            arrays.append((info.pooled_width,))
        if "sparse" in request.outputs:
            strings += s.real
            if request.return_text:
                chars += sum(map(len, s.tokens[: s.real]))
    return AnswerShape(
        arrays, len(seqs), token_strings=strings, token_chars=chars, half_floats=half
    )


@dataclass(frozen=True)
class Prepared:
    request: MultiVectorRequest
    runtime: ModelRuntime
    sequences: list[Sequence]
    response_bytes: float


def check_outputs(request: MultiVectorRequest, info: ModelInfo) -> None:
    """The side and outputs asked are ones the model gives (422 naming what it lacks)."""
    late = late_interaction_of(info)
    if request.input_type not in SIDES:
        raise InvalidInput(f"must be one of {SIDES}", field=("input_type",))
    if not request.outputs or not set(request.outputs) <= set(OUTPUTS):
        raise InvalidInput(f"must list some of {OUTPUTS}", field=("output",))
    if "dense" in request.outputs and info.manifest.pooling is None:
        raise UnsupportedByModel(
            f"model {info.name!r} has no dense vector (no pooling of its own): ask for "
            "multi_vector",
            field=("output",),
        )
    if "sparse" in request.outputs and not late.sparse:
        raise UnsupportedByModel(
            f"model {info.name!r} has no sparse (lexical weight) head: bge-m3 has one",
            field=("output",),
        )


def _checked(request: MultiVectorRequest, serving: Serving) -> Prepared:
    """Every check before any run: the model, side and outputs, the texts, their lengths,
    and the answer's size."""
    settings = serving.settings
    runtime = serving.registry.runtime(request.model)
    info = runtime.info
    check_outputs(request, info)
    check_prune(request, info)
    if not request.texts:
        raise InvalidInput("is empty: send at least one text", field=(request.field,))
    limits.check_sequence_count(len(request.texts), settings, pooled_only=True)
    for i, item in enumerate(request.texts):
        if not item.strip():
            raise InvalidInput("is empty: send some text", field=(request.field, i))
    sequences = read_as(
        runtime,
        request.texts,
        request.input_type,
        settings,
        truncate=request.truncate,
        field=request.field,
    )
    special = text.front_end(runtime).special_tokens if request.prune else frozenset()
    shape = answer_shape(request, info, sequences, special)
    size = limits.check_response_size(shape, request.wire_cost, info.name, settings)
    return Prepared(request, runtime, sequences, size)


def _model(prepared: Prepared) -> ModelInfo:
    return prepared.runtime.info


def held_bytes(runtime: ModelRuntime, sequences: list[Sequence], settings: Settings) -> int:
    """Tokens, the attention scratch of their runs, and the outputs kept per sequence
    until its vectors are built: its hidden states, vectors and weights."""
    info = runtime.info
    late = late_interaction_of(info)
    lengths = [len(s.ids) for s in sequences]
    # its hidden state, its vector, and its lexical weight and attention received
    per_token = BYTES_PER_TOKEN + FLOAT32 * (info.config.d_model + late.dim + 2)
    scratch = attention_scratch_bytes(lengths, info.config, settings.max_batch_tokens)
    return per_token * sum(lengths) + scratch


def _held(prepared: Prepared, serving: Serving) -> int:
    answer = int(prepared.response_bytes * prepared.request.wire_cost.copies)
    return held_bytes(prepared.runtime, prepared.sequences, serving.settings) + answer


async def run_sequences(
    runtime: ModelRuntime, sequences: list[Sequence], scope: RequestScope, serving: Serving
) -> list[SequenceResult]:
    """The multi-vector graph's outputs per sequence, in parts like a pooled request."""
    pairs = [text.id_pairs(s.ids, s.types) for s in sequences]
    graph = graph_io.GRAPH_MULTI_VECTOR
    results = await serving.execute.results_in_parts(runtime, pairs, graph, scope)
    serving.execute.count_tokens(runtime, sum(len(s.ids) for s in sequences))
    return results


def vectors_of(sequence: Sequence, result: SequenceResult) -> np.ndarray:
    """[kept, dim] float32: the kept rows of the graph's vectors."""
    out: np.ndarray = np.ascontiguousarray(result[graph_io.OUTPUT_MULTI_VECTORS][sequence.kept])
    return out


def item_of(
    request: MultiVectorRequest, runtime: ModelRuntime, sequence: Sequence, result: SequenceResult
) -> MultiVectorItem:
    info = runtime.info
    late = late_interaction_of(info)
    vectors = dense = sparse = None
    if "multi_vector" in request.outputs:
        if request.prune is None:
            vectors = vectors_of(sequence, result)
        else:
            special = text.front_end(runtime).special_tokens
            vectors = pruned_vectors(request.prune, sequence, result, special)
        if request.half:
            vectors = vectors.astype(np.float16)
    if "dense" in request.outputs:
        hidden = result[graph_io.OUTPUT_HIDDEN][: sequence.real]
        dense = postprocess.pool(
            hidden, info.default_pooling, info.manifest.normalize, dense=info.dense
        )
    if "sparse" in request.outputs:
        sparse = lexical(sequence, result[graph_io.OUTPUT_TOKEN_WEIGHTS], late, request)
    return MultiVectorItem(vectors, dense, sparse, len(sequence.ids))


def lexical(
    sequence: Sequence, weights: np.ndarray, late: LateInteraction, request: MultiVectorRequest
) -> SparseVector:
    """bge-m3's sparse vector: each token id's largest positive weight, its special
    tokens left out, in the order the ids first appear."""
    unused = frozenset(late.unused_ids)
    best: dict[int, tuple[float, str]] = {}
    for position in range(sequence.real):
        token_id, weight = sequence.ids[position], float(weights[position])
        if token_id in unused or weight <= 0:
            continue
        if token_id not in best or weight > best[token_id][0]:
            best[token_id] = (weight, sequence.tokens[position])
    names = [t for _, t in best.values()] if request.return_text else []
    return SparseVector(list(best), [w for w, _ in best.values()], names)


async def _run(prepared: Prepared, scope: RequestScope, serving: Serving) -> MultiVectorResult:
    request, runtime, sequences = prepared.request, prepared.runtime, prepared.sequences
    results = await run_sequences(runtime, sequences, scope, serving)

    def build() -> list[MultiVectorItem]:
        return [item_of(request, runtime, s, r) for s, r in zip(sequences, results, strict=True)]

    items = (
        await serving.admit.off_loop(build) if prepared.response_bytes > OFFLOAD_BYTES else build()
    )
    tokens = sum(len(s.ids) for s in sequences)
    return MultiVectorResult(runtime.info.name, items, tokens, prepared.response_bytes)


# -- pruning a document's vectors ---------------------------------------------------------
# The rule bench/pruning.py measured (docs/benchmarks.md, "Pruning multi-vectors"): the k
# tokens receiving the most attention, averaged over every layer and head and summed over
# every real query row, [CLS] and [SEP] not candidates.


def check_prune(request: MultiVectorRequest, info: ModelInfo) -> None:
    """``prune`` asks for what can be done: documents only, one of k (at least 1, at
    most the model's length) and fraction (in (0, 1]), a model whose graph gives each
    token's attention received (422 naming what is wrong)."""
    prune = request.prune
    if prune is None:
        return
    if request.input_type != "document":
        raise InvalidInput(
            "prunes a document's vectors: a query's are all scored by MaxSim; send "
            "input_type document, or no prune",
            field=("prune",),
        )
    if prune.method not in PRUNE_METHODS:
        raise InvalidInput(f"must be one of {PRUNE_METHODS}", field=("prune", "method"))
    if (prune.k is None) == (prune.fraction is None):
        raise InvalidInput("give one of k and fraction", field=("prune",))
    if prune.k is not None and not 1 <= prune.k <= info.max_seq_len:
        raise InvalidInput(
            f"must be in 1..{info.max_seq_len} (the model's length), got {prune.k}",
            field=("prune", "k"),
        )
    if prune.fraction is not None and not (
        math.isfinite(prune.fraction) and 0 < prune.fraction <= 1
    ):
        raise InvalidInput(f"must be in (0, 1], got {prune.fraction}", field=("prune", "fraction"))
    if not late_interaction_of(info).attention_received:
        raise UnsupportedByModel(
            f"model {info.name!r} was exported without each token's attention received "
            f"({graph_io.OUTPUT_ATTENTION_RECEIVED}), which pruning keeps by: export it "
            "again with this model_export",
            field=("prune",),
        )


def candidates(sequence: Sequence, special_tokens: frozenset[str]) -> np.ndarray:
    """bool [n]: the rows a pruned document may keep: its kept rows, less the
    tokenizer's special tokens ([CLS], [SEP], a marker registered as one)."""
    special = np.array([t in special_tokens for t in sequence.tokens], dtype=bool)
    out: np.ndarray = sequence.kept & ~special
    return out


def pruned_count(prune: Prune, n_candidates: int) -> int:
    """How many vectors a document of ``n_candidates`` candidate tokens keeps."""
    if prune.k is not None:
        return min(prune.k, n_candidates)
    assert prune.fraction is not None
    return min(math.ceil(prune.fraction * n_candidates), n_candidates)


def pruned_rows(
    prune: Prune, sequence: Sequence, received: np.ndarray, special_tokens: frozenset[str]
) -> np.ndarray:
    """int64, ascending: the candidate rows receiving the most attention, as many as
    ``pruned_count`` keeps (ties to the earlier token); none without candidates."""
    allowed = candidates(sequence, special_tokens)
    n = pruned_count(prune, int(allowed.sum()))
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    return pruning.keep_by_attention(received.astype(np.float32), n, allowed)


def pruned_vectors(
    prune: Prune, sequence: Sequence, result: SequenceResult, special_tokens: frozenset[str]
) -> np.ndarray:
    """[kept, dim] float32: the graph's vectors at ``pruned_rows``."""
    received = result[graph_io.OUTPUT_ATTENTION_RECEIVED]
    rows = pruned_rows(prune, sequence, received, special_tokens)
    out: np.ndarray = np.ascontiguousarray(result[graph_io.OUTPUT_MULTI_VECTORS][rows])
    return out


# A vector per token (and a dense and a sparse vector) of texts read as queries or documents.
MULTI_VECTOR: RequestKind[MultiVectorRequest, Prepared, MultiVectorResult] = RequestKind(
    "multi_vector", _checked, _model, _run, held=_held
)


# -- MaxSim ----------------------------------------------------------------------------------


def maxsim_scored(
    query: np.ndarray,
    document: np.ndarray,
    similarity: str,
    tokens: tuple[list[str], list[str]],
) -> tuple[float, MaxSimExplanation]:
    """The score of ``query`` [n, dim] against ``document`` [m, dim] and its split."""
    sims = query.astype(np.float64) @ document.astype(np.float64).T
    best = sims.argmax(axis=1)
    terms = sims[np.arange(len(query)), best]
    if similarity == "meanmaxsim":
        terms = terms / len(query)
    return float(terms.sum()), MaxSimExplanation(
        tokens[0], tokens[1], best.astype(int).tolist(), terms.tolist()
    )


def kept_tokens(sequence: Sequence) -> list[str]:
    return [t for t, keep in zip(sequence.tokens, sequence.kept, strict=True) if keep]


@dataclass(frozen=True)
class MaxSimRerank:
    """A rerank request on a multi-vector model: the query and documents read as their
    sides, and the explanation's answer size."""

    request: RerankRequest
    runtime: ModelRuntime
    query: Sequence
    documents: list[Sequence]
    response_bytes: float


def explanation_shape(query: Sequence, documents: list[Sequence]) -> AnswerShape:
    """Per explained document: its best match and term per query vector, both sides'
    tokens listed."""
    n_q = int(query.kept.sum())
    q_chars = sum(map(len, kept_tokens(query)))
    arrays: list[tuple[int, ...]] = [(n_q, 2) for _ in documents]
    strings = sum(n_q + int(d.kept.sum()) for d in documents)
    chars = sum(q_chars + sum(map(len, kept_tokens(d))) for d in documents)
    return AnswerShape(arrays, len(documents), token_strings=strings, token_chars=chars)


def _rerank_checked(request: RerankRequest, serving: Serving) -> MaxSimRerank:
    """Every check before any run, as a cross-encoder's rerank has them; the query and
    the documents read as their sides; the explanations' answer size."""
    settings = serving.settings
    runtime = serving.registry.runtime(request.model)
    info = runtime.info
    late_interaction_of(info)
    documents = request.documents_field
    if not request.query.strip():
        raise InvalidInput("is empty: send some text", field=("query",))
    if not request.documents:
        raise InvalidInput("is empty: send at least one document", field=(documents,))
    limits.check_sequence_count(len(request.documents) + 1, settings, pooled_only=True)
    for i, document in enumerate(request.documents):
        if not document.strip():
            raise InvalidInput("is empty: send some text", field=(documents, i))
    if request.top_n is not None and request.top_n < 1:
        raise InvalidInput(f"must be at least 1, got {request.top_n}", field=("top_n",))
    if request.instruction is not None:
        raise InvalidInput(
            f"model {info.name!r} scores by MaxSim: it takes no instruction (LLM rerankers do)",
            field=("instruction",),
        )
    (query,) = read_as(runtime, [request.query], "query", settings, truncate=False, field="query")
    read = read_as(
        runtime,
        request.documents,
        "document",
        settings,
        truncate=request.truncate,
        field=documents,
    )
    size = 0.0
    if request.return_attention and request.wire_cost is not None:
        explained = read[: request.top_n or len(read)]  # at most that many, whichever
        shape = explanation_shape(query, explained)
        size = limits.check_response_size(shape, request.wire_cost, info.name, settings)
    return MaxSimRerank(request, runtime, query, read, size)


def _rerank_model(prepared: MaxSimRerank) -> ModelInfo:
    return prepared.runtime.info


def _rerank_held(prepared: MaxSimRerank, serving: Serving) -> int:
    sequences = [prepared.query, *prepared.documents]
    held = held_bytes(prepared.runtime, sequences, serving.settings)
    copies = prepared.request.wire_cost.copies if prepared.request.wire_cost else 1.0
    return held + int(prepared.response_bytes * copies)


async def _rerank(prepared: MaxSimRerank, scope: RequestScope, serving: Serving) -> RerankResult:
    """Each document's MaxSim with the query, best first; ``top_n`` of them explained
    when asked (``return_attention``)."""
    request, runtime = prepared.request, prepared.runtime
    late = late_interaction_of(runtime.info)
    sequences = [prepared.query, *prepared.documents]
    results = await run_sequences(runtime, sequences, scope, serving)
    query = vectors_of(prepared.query, results[0])
    query_tokens = kept_tokens(prepared.query)
    scored = [
        maxsim_scored(query, vectors_of(d, r), late.similarity, (query_tokens, kept_tokens(d)))
        for d, r in zip(prepared.documents, results[1:], strict=True)
    ]
    order = sorted(range(len(scored)), key=lambda i: (-scored[i][0], i))[: request.top_n]
    ranked = [
        Ranked(i, scored[i][0], scored[i][1] if request.return_attention else None) for i in order
    ]
    return RerankResult(runtime.info.name, ranked, sum(len(s.ids) for s in sequences))


# Documents scored against a query by MaxSim (a multi-vector model's rerank).
MAXSIM_RERANK: RequestKind[RerankRequest, MaxSimRerank, RerankResult] = RequestKind(
    "rerank", _rerank_checked, _rerank_model, _rerank, held=_rerank_held
)
