"""Reranking and classification with a model's classification head (cross-encoders).

A reranker reads a query and a document as one sequence, paired by the model's own
tokenizer (``TextFrontEnd.tokenize_pairs``: the document is cut first, never the
query); its head gives one logit per pair. An LLM reranker (``manifest.LlmReranker``)
reads them through its prompt template instead, with an instruction
(``tokenize_prompts``), its head giving logit(yes) - logit(no) at the last token. A
classifier gives a logit per label of a text or a pair. Both run the head's graph
(``graph_io.GRAPH_SCORES``: token ids in, logits out) through the batcher in parts,
admitted by work like a large pooled request, and answer scores as the checkpoint
defines them (``Head.activation``: sigmoid, softmax or identity) unless the caller
asks for the raw logits. On request, each returned result is explained
(``rank_explain``): the attention from the query's tokens to the document's (an LLM
reranker's: from its last token, where the answer is read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from model_export.manifest import graph_io
from service.attention_scratch import attention_scratch_bytes
from service.engine import limits, rank_explain, text
from service.engine.execute import Executor
from service.engine.kind import RequestKind, Serving
from service.engine.rank_explain import (
    MAX_TOP_TOKENS,
    MaxSimExplanation,
    PairTokens,
    RankExplanation,
    explain,
)
from service.engine.scope import RequestScope
from service.engine.types import AttentionSpec, WireCost
from service.errors import FieldPath, InvalidInput, UnsupportedByModel
from service.model_info import ModelInfo
from service.runtime import ModelRuntime
from service.settings import Settings
from service.tokenizer import PairEncoding

T = TypeVar("T")

# What a request holds per token while it runs: ids, types, tokens (generous).
BYTES_PER_TOKEN = 256


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: list[str]
    model: str | None = None
    top_n: int | None = None  # None: every document
    raw_scores: bool = False
    truncate: bool = True
    truncation_direction: str = "right"
    # Why it ranked: the query-to-document attention of each returned result.
    return_attention: bool = False
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    top_tokens: int = 5
    wire_cost: WireCost | None = None  # what the attention answer costs on the wire
    documents_field: str = "documents"  # what the protocol's body calls them (TEI: texts)
    # An LLM reranker's instruction (None: the model's default; "": none, the template's own).
    instruction: str | None = None


@dataclass(frozen=True)
class Ranked:
    index: int  # the document's position in the request
    score: float
    # Why it ranked: a cross-encoder's attention, or a MaxSim score's split.
    explanation: RankExplanation | MaxSimExplanation | None = None


@dataclass(frozen=True)
class RerankResult:
    model: str
    results: list[Ranked]  # best first, at most top_n
    tokens: int


@dataclass(frozen=True)
class ClassifyRequest:
    inputs: list[str | tuple[str, str]]  # texts, or pairs read together
    model: str | None = None
    raw_scores: bool = False
    truncate: bool = True
    truncation_direction: str = "right"


@dataclass(frozen=True)
class ClassifyResult:
    model: str
    labels: tuple[str, ...]
    scores: np.ndarray  # [inputs, labels], in the labels' order
    tokens: int


def require_task(info: ModelInfo, tasks: tuple[str, ...], what: str) -> None:
    """A model asked for what its head does not answer: 422 naming its task."""
    task = info.manifest.task
    if task not in tasks:
        article = "an" if task[0] in "aeiou" else "a"
        raise UnsupportedByModel(
            f"model {info.name!r} is {article} {task} model: it cannot {what} (models that can: "
            f"{' or '.join(tasks)}, exported from a checkpoint with that head)",
            field=("model",),
        )


def scores_of(logits: np.ndarray, activation: str, raw: bool) -> np.ndarray:
    """[n, labels] logits -> scores as the checkpoint defines them (``raw``: the logits)."""
    x = logits.astype(np.float64)
    if raw or activation == "identity":
        return x
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    out: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
    return out


def _check_text(value: str, where: tuple[str | int, ...]) -> None:
    if not value.strip():
        raise InvalidInput("is empty: send some text", field=where)


# Where a pair's texts sit in the request, for errors: (first, second) of pair i.
PairFields = Callable[[int], tuple[FieldPath, FieldPath]]


def tokenize_pairs(
    runtime: ModelRuntime,
    pairs: list[tuple[str, str]],
    request: RerankRequest | ClassifyRequest,
    settings: Settings,
    fields: PairFields,
    field: str,
) -> list[PairEncoding]:
    """Pairs bounded, paired by the tokenizer and their lengths checked (413 past the
    model's window without ``truncate``); a first text too long to leave room for any
    of the second is a 422 naming it."""
    info = runtime.info
    front_end = text.front_end(runtime)
    left = request.truncation_direction == "left"
    room = info.max_seq_len - front_end.pair_overhead()
    firsts: dict[str, str] = {}
    between = text.priced(info, [len(first) + len(second) for first, second in pairs])
    for i, (first, _) in enumerate(pairs):
        if first in firsts:
            continue
        if between is not None:
            between()
        where = fields(i)[0]
        bounded = limits.bound_text(first, info, False, where, front_end).text
        ((_, ids, _),) = front_end.tokenize([bounded], truncate=False, special_tokens=False)
        if len(ids) >= room:
            raise InvalidInput(
                f"is {len(ids)} tokens: with the pair's {front_end.pair_overhead()} special "
                f"tokens it leaves no room for the text it is paired with within the "
                f"model's {info.max_seq_len}",
                field=where,
            )
        firsts[first] = bounded
    truncate = request.truncate
    seconds = [
        limits.bound_text(second, info, truncate, fields(i)[1], front_end, left=left).text
        for i, (_, second) in enumerate(pairs)
    ]
    encoded = front_end.tokenize_pairs(
        [(firsts[first], second) for (first, _), second in zip(pairs, seconds, strict=True)],
        truncate=truncate,
        left=left,
        between=between,
    )
    lengths: list[int | None] = [len(e.ids) for e in encoded]
    limits.check_lengths(lengths, info, settings, field, pooled_only=True)
    return encoded


def tokenize_prompts(
    runtime: ModelRuntime, request: RerankRequest, settings: Settings
) -> list[PairEncoding]:
    """An LLM reranker's pairs: each document with the query (and the request's
    instruction, else the model's) filled into the model's template
    (``manifest.LlmReranker``), tokenized whole; ``truncate`` cuts the document's
    tokens (from its end, or with ``left`` its start) until the prompt fits, never the
    query's; a prompt too long without its document is a 422 naming the query."""
    info = runtime.info
    assert info.manifest.head is not None and info.manifest.head.llm is not None
    front_end = text.front_end(runtime)
    field = request.documents_field
    instruction = request.instruction
    if instruction is not None:
        instruction = limits.bound_text(instruction, info, False, ("instruction",), front_end).text
    template, fixed = info.manifest.head.llm.prompt(instruction)
    query = limits.bound_text(request.query, info, False, ("query",), front_end).text
    left = request.truncation_direction == "left"
    between = text.priced(
        info, [sum(map(len, template.pieces)) + len(query) + len(d) for d in request.documents]
    )
    filled = []
    for i, document in enumerate(request.documents):
        if between is not None:
            between()
        bounded = limits.bound_text(
            document, info, request.truncate, (field, i), front_end, left=left
        ).text
        prompt, spans = template.render({**fixed, "query": query, "document": bounded})
        filled.append((prompt, spans["query"], spans["document"]))
    encoded = front_end.tokenize_templated(filled, between=between)
    if request.truncate:
        encoded = [_fitted(e, info.max_seq_len, left) for e in encoded]
    limits.check_lengths([len(e.ids) for e in encoded], info, settings, field, pooled_only=True)
    return encoded


def _fitted(encoded: PairEncoding, most: int, left: bool) -> PairEncoding:
    """A prompt cut to ``most`` tokens by dropping its document's last (``left``: first)."""
    excess = len(encoded.ids) - most
    if excess <= 0:
        return encoded
    d0, d1 = encoded.document
    if d1 - d0 < excess:
        raise InvalidInput(
            f"with the model's template it makes {len(encoded.ids) - (d1 - d0)} tokens before "
            f"any of the document: no room for it within the model's {most}",
            field=("query",),
        )
    begin, end = (d0, d0 + excess) if left else (d1 - excess, d1)

    def kept(xs: list[T]) -> list[T]:
        return xs[:begin] + xs[end:]

    return PairEncoding(
        kept(encoded.tokens),
        kept(encoded.ids),
        kept(encoded.type_ids),
        encoded.query,
        (d0, d1 - excess),
    )


def _reader(encoded: PairEncoding, llm: bool) -> tuple[int, int]:
    """The rows of a pair's explanation: its query's tokens; an LLM reranker's last token
    (causal: its query, read before the document, never attends to it; the last token,
    where yes or no is read, attends to both)."""
    n = len(encoded.ids)
    return (n - 1, n) if llm else encoded.query


# A sequence for the head: a pair, or a single text's (tokens, ids, types).
Encoded = PairEncoding | text.Tokenized


async def _logits(
    runtime: ModelRuntime,
    encoded: list[Encoded],
    execute: Executor,
    scope: RequestScope,
) -> np.ndarray:
    """The head's logits [n, labels] of each sequence (pairs or single texts)."""
    sequences = [
        text.id_pairs(e.ids, e.type_ids)
        if isinstance(e, PairEncoding)
        else text.id_pairs(e[1], e[2])
        for e in encoded
    ]
    results = await execute.results_in_parts(runtime, sequences, graph_io.GRAPH_SCORES, scope)
    return np.stack([r[graph_io.OUTPUT_LOGITS] for r in results])


def _rerank_checked(request: RerankRequest, serving: Serving) -> Pairs:
    """Every check before any run: the model's head, the texts, counts and lengths."""
    settings = serving.settings
    runtime = serving.registry.runtime(request.model)
    require_task(runtime.info, ("rerank",), "rerank")
    _check_text(request.query, ("query",))
    documents = request.documents_field
    if not request.documents:
        raise InvalidInput("is empty: send at least one document", field=(documents,))
    limits.check_sequence_count(len(request.documents), settings, pooled_only=True)
    for i, document in enumerate(request.documents):
        _check_text(document, (documents, i))
    if request.top_n is not None and request.top_n < 1:
        raise InvalidInput(f"must be at least 1, got {request.top_n}", field=("top_n",))
    if not 1 <= request.top_tokens <= MAX_TOP_TOKENS:
        raise InvalidInput(f"must be in 1..{MAX_TOP_TOKENS}", field=("top_tokens",))
    rank_explain.check_spec(request.attention)
    if request.return_attention:  # the explained pairs run as one attention request
        explained = min(request.top_n or len(request.documents), len(request.documents))
        limits.check_sequence_count(explained, settings, pooled_only=False)
    head = runtime.info.manifest.head
    if head is not None and head.llm is not None:
        return request, runtime, tokenize_prompts(runtime, request, settings)
    if request.instruction is not None:
        raise InvalidInput(
            f"model {runtime.info.name!r} is a cross-encoder: it takes no instruction "
            "(LLM rerankers do)",
            field=("instruction",),
        )
    pairs = [(request.query, d) for d in request.documents]
    encoded = tokenize_pairs(
        runtime, pairs, request, settings, lambda i: (("query",), (documents, i)), documents
    )
    return request, runtime, encoded


async def _rerank(prepared: Pairs, scope: RequestScope, serving: Serving) -> RerankResult:
    """Documents scored against a query, best first; ``top_n`` of them explained when
    attention is asked."""
    request, runtime, encoded = prepared
    info, execute = runtime.info, serving.execute
    tokens = sum(_lengths(encoded))
    head = info.manifest.head
    assert head is not None
    scores = scores_of(
        await _logits(runtime, list(encoded), execute, scope), head.activation, request.raw_scores
    )[:, 0]
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: request.top_n]
    explanations: list[RankExplanation | None] = [None] * len(order)
    if request.return_attention:
        assert request.wire_cost is not None
        chosen = [encoded[i] for i in order]
        llm = head.llm is not None
        pairs = [
            PairTokens(e.ids, e.type_ids, e.tokens, _reader(e, llm), e.document) for e in chosen
        ]
        explanations = list(
            await explain(
                pairs,
                request.attention,
                request.top_tokens,
                runtime,
                scope,
                execute,
                request.wire_cost,
            )
        )
    execute.count_tokens(runtime, tokens)
    results = [Ranked(i, float(scores[i]), x) for i, x in zip(order, explanations, strict=True)]
    return RerankResult(info.name, results, tokens)


def _classify_checked(request: ClassifyRequest, serving: Serving) -> Inputs:
    """Every check before any run: the model's head, the texts and pairs, their lengths."""
    settings = serving.settings
    runtime = serving.registry.runtime(request.model)
    require_task(runtime.info, ("classify", "rerank"), "classify")
    head = runtime.info.manifest.head
    if head is not None and head.llm is not None:
        raise UnsupportedByModel(
            f"model {runtime.info.name!r} is an LLM reranker: it scores a query and "
            "documents through its prompt template; use /v1/rerank (or /rerank)",
            field=("model",),
        )
    if not request.inputs:
        raise InvalidInput("is empty: send at least one text", field=("inputs",))
    limits.check_sequence_count(len(request.inputs), settings, pooled_only=True)
    left = request.truncation_direction == "left"
    singles = {i: x for i, x in enumerate(request.inputs) if isinstance(x, str)}
    pairs = {i: x for i, x in enumerate(request.inputs) if not isinstance(x, str)}
    for i, item in singles.items():
        _check_text(item, ("inputs", i))
    for i, (a, b) in pairs.items():
        _check_text(a, ("inputs", i, 0))
        _check_text(b, ("inputs", i, 1))
    encoded: dict[int, Encoded] = {}
    if singles:
        _, found = text.tokenize_all(
            runtime,
            list(singles.values()),
            request.truncate,
            "inputs",
            settings,
            pooled_only=True,
            left=left,
        )
        encoded.update(zip(singles, found, strict=True))
    if pairs:
        at = list(pairs)
        found_pairs = tokenize_pairs(
            runtime,
            list(pairs.values()),
            request,
            settings,
            lambda k: (("inputs", at[k], 0), ("inputs", at[k], 1)),
            "inputs",
        )
        encoded.update(zip(pairs, found_pairs, strict=True))
    return request, runtime, [encoded[i] for i in range(len(request.inputs))]


async def _classify(prepared: Inputs, scope: RequestScope, serving: Serving) -> ClassifyResult:
    """A score per label of each text or pair."""
    request, runtime, encoded = prepared
    info, execute = runtime.info, serving.execute
    head = info.manifest.head
    assert head is not None
    logits = await _logits(runtime, encoded, execute, scope)
    tokens = sum(_lengths(encoded))
    execute.count_tokens(runtime, tokens)
    scores = scores_of(logits, head.activation, request.raw_scores)
    return ClassifyResult(info.name, head.labels, scores, tokens)


# The checked request, the version it runs on, and its sequences for the head.
Pairs = tuple[RerankRequest, ModelRuntime, list[PairEncoding]]
Inputs = tuple[ClassifyRequest, ModelRuntime, list[Encoded]]


def _lengths(encoded: list[PairEncoding] | list[Encoded]) -> list[int]:
    return [len(e.ids) if isinstance(e, PairEncoding) else len(e[1]) for e in encoded]


def _model(prepared: Pairs | Inputs) -> ModelInfo:
    return prepared[1].info


def _held(prepared: Pairs | Inputs, serving: Serving) -> int:
    """Its tokens, and the attention scratch of its runs."""
    lengths = _lengths(prepared[2])
    config = prepared[1].info.config
    scratch = attention_scratch_bytes(lengths, config, serving.settings.max_batch_tokens)
    return BYTES_PER_TOKEN * sum(lengths) + scratch


# Documents scored against a query by a cross-encoder (or an LLM reranker), best first.
CROSS_ENCODER: RequestKind[RerankRequest, Pairs, RerankResult] = RequestKind(
    "rerank", _rerank_checked, _model, _rerank, held=_held
)
# A score per label of texts or pairs.
CLASSIFY: RequestKind[ClassifyRequest, Inputs, ClassifyResult] = RequestKind(
    "classify", _classify_checked, _model, _classify, held=_held
)
