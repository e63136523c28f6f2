"""Why two texts match: a mean-pooled cosine split exactly into token-pair terms.

For a model that mean-pools its token vectors, the served sentence vector of a text
is ā = (1/n_a) Σ_i a_i, normalised; so the cosine of a query and a document is

    cos(ā, b̄) = Σ_ij a_i·b_j / (n_q · n_d · ‖ā‖ · ‖b̄‖)

and each term is how much the pair (query token i, document token j) adds to the
score. The query and the documents run as text in one encode request asking for the
per-token embeddings and the model's pooled vectors (mean, normalised): the same
tokens, prompt, runs and pooling as ``/v1/encode`` and ``/v1/embeddings`` serve, so
``score`` is the served cosine and the matrix sums to it (float64 arithmetic on the
float32 token vectors, answered as float32). The request is checked, priced and held
as that encode request is (``prepare.prepare``); the answer's own size is checked
against ATTNSERVE_MAX_RESPONSE_BYTES by the protocol's ``WireCost``, before any run.

Other poolings (cls, max, last) have no such split: 422 ``unsupported_by_model``, as
for a model with Dense layers after its pooling, for a model whose pooling leaves
its default prompt's tokens out (``include_prompt`` false) and for a model without
a tokenizer. No approximation is offered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.engine import limits, prepare, text
from service.engine.kind import RequestKind, Serving
from service.engine.prepare import PreparedEncode
from service.engine.registry import Registry
from service.engine.scope import RequestScope
from service.engine.types import AnswerShape, EncodeRequest, SequenceOutput, WireCost
from service.errors import (
    FieldPath,
    InvalidInput,
    PayloadTooLarge,
    ServiceError,
    UnsupportedByModel,
)
from service.model_info import ModelInfo
from service.runtime import ModelRuntime
from service.settings import Settings

# Top pairs listed per document, at most (a request asks 0..this many).
MAX_TOP_PAIRS = 100
# The encode run's answer is never sent: it costs nothing on a wire (its arrays are
# still counted as held memory by ``limits.work_bytes``).
UNSENT = WireCost(per_float=0.0, per_char=0.0, copies=0.0)
FLOAT32, FLOAT64 = 4, 8
# Up to this many contribution floats in all, the split is computed on the event loop
# (well under a millisecond); beyond, on a codec thread.
SPLIT_INLINE_FLOATS = 65536


@dataclass(frozen=True)
class SimilarityRequest:
    query: str
    documents: list[str]
    wire_cost: WireCost  # what the protocol's answer costs (see ``answer_shape``)
    model: str | None = None
    top_pairs: int = 10
    truncate: bool = False


@dataclass(frozen=True)
class TokenPair:
    query_index: int
    document_index: int
    contribution: float


@dataclass(frozen=True)
class SimilarityExplanation:
    """One document against the query.

    ``contributions`` [n_q, n_d] float32 sums to ``score`` (up to float rounding);
    ``query_totals`` its row sums [n_q], ``document_totals`` its column sums [n_d]
    (float64 sums, so each also sums to ``score``); ``top_pairs`` the largest terms,
    largest first (ties: the lower query index, then the lower document index)."""

    index: int
    score: float
    query_tokens: list[str]
    document_tokens: list[str]
    contributions: np.ndarray
    top_pairs: list[TokenPair]
    query_totals: list[float]
    document_totals: list[float]


@dataclass(frozen=True)
class SimilarityResult:
    model: str
    explanations: list[SimilarityExplanation]
    sequences: int  # the query and the documents
    tokens: int
    response_bytes: float  # the engine's estimate of the answer's size


def require_mean_pooling(runtime: ModelRuntime) -> None:
    """422 naming ``model`` for a model without a tokenizer, or whose served vectors are
    not a mean over every token of the text: the split is exact only then."""
    info = runtime.info
    if not info.has_tokenizer:
        raise UnsupportedByModel(
            f"model {info.name!r} has no tokenizer: this route takes texts (use a model "
            "exported from a checkpoint with a tokenizer, e.g. minilm-l6)",
            field=("model",),
        )
    if info.dense:
        raise UnsupportedByModel(
            f"model {info.name!r} passes its pooled vectors through Dense layers: its "
            "cosine is not of a mean over tokens, so it does not split into their pairs",
            field=("model",),
        )
    pooling = info.default_pooling
    if pooling != "mean":
        raise UnsupportedByModel(
            f"model {info.name!r} pools its sentence vectors by {pooling}, not mean: a "
            "cosine splits exactly into token pairs only for mean pooling (use a "
            "mean-pooled model, e.g. minilm-l6)",
            field=("model",),
        )
    if not info.manifest.include_prompt and text.prompt_of(info, None, None):
        raise UnsupportedByModel(
            f"model {info.name!r} leaves its default prompt's tokens out of its pooled "
            "vectors (include_prompt false): its cosine is not a mean over every token "
            "of the texts, so it does not split into their pairs",
            field=("model",),
        )


def _renamed(exc: ServiceError) -> ServiceError:
    """An encode error's ``inputs[k]`` spelt as this request's ``query`` / ``documents[k-1]``."""
    where = exc.field
    if where and where[0] == "inputs" and len(where) > 1 and isinstance(where[1], int):
        k = where[1]
        exc.field = ("query", *where[2:]) if k == 0 else ("documents", k - 1, *where[2:])
    return exc


def _check_text(value: str, where: FieldPath) -> None:
    if not value.strip():
        raise InvalidInput("is empty: send some text", field=where)


def answer_shape(lengths: list[int], tokens: list[list[str]], top_pairs: int) -> AnswerShape:
    """What the answer holds for a query and documents of ``lengths`` (query first): per
    document its [n_q, n_d] contributions and the top pairs' numbers as arrays, its
    tokens and totals as listed tokens (each top pair's two tokens too: at most the
    longest of each side's)."""
    n_q, query = lengths[0], tokens[0]
    arrays: list[tuple[int, ...]] = []
    strings = chars = 0
    for n_d, document in zip(lengths[1:], tokens[1:], strict=True):
        pairs = min(top_pairs, n_q * n_d)
        arrays.append((n_q, n_d))
        if pairs:
            arrays.append((pairs, 3))  # query_index, document_index, contribution
        strings += n_q + n_d + 2 * pairs
        chars += sum(map(len, query)) + sum(map(len, document))
        chars += pairs * (max(map(len, query)) + max(map(len, document)))
    return AnswerShape(arrays, len(lengths) - 1, token_strings=strings, token_chars=chars)


def explain_pair(
    index: int,
    query: np.ndarray,
    document: np.ndarray,
    tokens: tuple[list[str], list[str]],
    pooled: tuple[np.ndarray, np.ndarray],
    top_pairs: int,
) -> SimilarityExplanation:
    """One document's split: ``query`` [n_q, d] and ``document`` [n_d, d] token vectors,
    ``pooled`` the two served (normalised) vectors, whose dot product is the score."""
    a = query.astype(np.float64)
    b = document.astype(np.float64)
    n_q, n_d = len(a), len(b)
    scale = n_q * n_d * np.linalg.norm(a.mean(axis=0)) * np.linalg.norm(b.mean(axis=0))
    terms = (a @ b.T) / max(float(scale), 1e-300)  # (n_q, n_d)
    flat = terms.ravel()
    order = np.argsort(-flat, kind="stable")[:top_pairs]  # ties: row-major order
    pairs = [TokenPair(int(k // n_d), int(k % n_d), float(flat[k])) for k in order]
    score = float(np.dot(pooled[0].astype(np.float64), pooled[1].astype(np.float64)))
    return SimilarityExplanation(
        index=index,
        score=score,
        query_tokens=tokens[0],
        document_tokens=tokens[1],
        contributions=terms.astype(np.float32),
        top_pairs=pairs,
        query_totals=terms.sum(axis=1).tolist(),
        document_totals=terms.sum(axis=0).tolist(),
    )


def _explained(
    index: int, query: SequenceOutput, document: SequenceOutput, top_pairs: int
) -> SimilarityExplanation:
    """``explain_pair`` on the encode run's outputs of the query and one document."""
    assert query.embeddings is not None and query.pooled is not None
    assert document.embeddings is not None and document.pooled is not None
    return explain_pair(
        index,
        query.embeddings,
        document.embeddings,
        (query.tokens or [], document.tokens or []),
        (query.pooled, document.pooled),
        top_pairs,
    )


def _prepared(
    request: SimilarityRequest, registry: Registry, settings: Settings
) -> tuple[SimilarityRequest, ModelRuntime, PreparedEncode, float]:
    """Every check before any run: the model, the texts, counts and lengths (as the
    encode request they become), and the answer's size."""
    runtime = registry.runtime(request.model)
    require_mean_pooling(runtime)
    _check_text(request.query, ("query",))
    if not request.documents:
        raise InvalidInput("is empty: send at least one document", field=("documents",))
    most = settings.max_sequences - 1  # the query is one more sequence of the run
    if len(request.documents) > most:
        raise PayloadTooLarge(
            f"{len(request.documents)} documents in one request; the limit is {most} "
            f"(ATTNSERVE_MAX_SEQUENCES {settings.max_sequences}, less the query: the answer "
            "is per token)",
            field=("documents",),
        )
    for i, document in enumerate(request.documents):
        _check_text(document, ("documents", i))
    if not 0 <= request.top_pairs <= MAX_TOP_PAIRS:
        raise InvalidInput(
            f"must be in 0..{MAX_TOP_PAIRS}, got {request.top_pairs}", field=("top_pairs",)
        )
    encode = EncodeRequest(
        inputs=[request.query, *request.documents],
        wire_cost=UNSENT,
        model=runtime.info.name,
        resolved=runtime.info,
        pooling="mean",
        normalize=True,
        return_embeddings=True,
        truncate=request.truncate,
    )
    try:
        prepared = prepare.prepare(encode, runtime, settings)
    except ServiceError as exc:
        raise _renamed(exc) from None
    tokens = [t or [] for t in prepared.tokens]
    shape = answer_shape([len(t) for t in tokens], tokens, request.top_pairs)
    size = limits.check_response_size(shape, request.wire_cost, runtime.info.name, settings)
    return request, runtime, prepared, size


# The checked request, the version it runs on, its encode run, its answer's size.
Prepared = tuple[SimilarityRequest, ModelRuntime, PreparedEncode, float]


def _checked(request: SimilarityRequest, serving: Serving) -> Prepared:
    return _prepared(request, serving.registry, serving.settings)


def _model(prepared: Prepared) -> ModelInfo:
    return prepared[1].info


def _held(prepared: Prepared, _serving: Serving) -> int:
    """The run's own memory, every document's float32 matrix, the float64 work of one
    document's split (its token vectors, terms and their order), the encoded answer."""
    request, runtime, encode, size = prepared
    lengths = [len(s) for s in encode.sequences]
    matrices = sum(lengths[0] * n for n in lengths[1:])
    n_q, n_d, width = lengths[0], max(lengths[1:]), runtime.info.config.d_model
    scratch = FLOAT64 * (3 * n_q * n_d + (n_q + n_d) * width)  # one document's split at a time
    answer = FLOAT32 * matrices + int(size * request.wire_cost.copies)
    return encode.work_bytes + scratch + answer


async def _explain(prepared: Prepared, scope: RequestScope, serving: Serving) -> SimilarityResult:
    """Each document's similarity to the query, split into token pairs, in the
    documents' order."""
    request, runtime, encode, size = prepared
    result = await serving.execute.run(
        encode, runtime, deadline=scope.deadline, until=scope.cancelled, timing=scope.timing
    )
    query, *documents = result.outputs
    lengths = [len(s) for s in encode.sequences]

    def split() -> list[SimilarityExplanation]:
        return [_explained(k, query, doc, request.top_pairs) for k, doc in enumerate(documents)]

    matrices = sum(lengths[0] * n for n in lengths[1:])
    explanations = (
        await serving.admit.off_loop(split) if matrices > SPLIT_INLINE_FLOATS else split()
    )
    return SimilarityResult(runtime.info.name, explanations, len(lengths), sum(lengths), size)


# A query's cosine with each document split into token pairs (mean-pooled models).
SIMILARITY: RequestKind[SimilarityRequest, Prepared, SimilarityResult] = RequestKind(
    "similarity", _checked, _model, _explain, held=_held
)
