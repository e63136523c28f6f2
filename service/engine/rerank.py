"""Rerank and classify with a sequence-classification head (a cross-encoder).

A rerank reads the query beside each document as the model's tokenizer pairs them
([CLS] q [SEP] d [SEP], token types as it gives them); a classify reads each input,
a text or a pair. With ``truncate`` a pair over the model's length loses the end (or
with ``truncation_direction: left`` the start) of its document alone, as
``truncation="only_second"``; a query that leaves no room for any document token is
a 422 naming ``query``. Without ``truncate`` a pair over the window is a 413 naming
the document. Pairs run the scores graph in parts like a large pooled request, then
each row of logits becomes the checkpoint's scores (its activation: sigmoid for a
CrossEncoder's one label, softmax over a classifier's labels) unless ``raw_scores``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from model_export.manifest import graph_io
from service.engine import limits, text
from service.engine.admit import Admit
from service.engine.execute import Executor
from service.engine.registry import Registry
from service.engine.scope import RequestScope
from service.engine.types import PairsRequest, PairsResult
from service.errors import InvalidInput, UnsupportedByModel
from service.model_info import ModelInfo
from service.runtime import ModelRuntime
from service.settings import Settings
from service.tokenizer import TokenizedPair

W = TypeVar("W")  # what a protocol keeps from parsing to writing its answer
# What a pair holds while it is scored: its tokens (Python strings), ids, types, logits.
BYTES_PER_TOKEN = 256
# Which tasks a route serves: a reranker's one label is also a classification.
SERVES = {"rerank": ("rerank",), "classify": ("classify", "rerank")}


def check_task(info: ModelInfo, task: str) -> None:
    """422 naming the model's task when it has no head for ``task``."""
    have = info.manifest.task
    if have not in SERVES[task]:
        verb = "rerank" if task == "rerank" else "classify text"
        article = "an" if have[0] in "aeiou" else "a"
        raise UnsupportedByModel(
            f"model {info.name!r} is {article} {have} model: it cannot {verb} (export a "
            "cross-encoder or sequence-classification checkpoint for this route)",
            field=("model",),
        )


def activation(logits: np.ndarray, name: str) -> np.ndarray:
    """The checkpoint's score function over each row of logits ([n, labels])."""
    if name == "sigmoid":
        out: np.ndarray = 1.0 / (1.0 + np.exp(-logits))
        return out
    if name == "softmax":
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        normalised: np.ndarray = shifted / shifted.sum(axis=1, keepdims=True)
        return normalised
    return logits


async def score(
    parse: Callable[[], tuple[PairsRequest, W]],
    scope: RequestScope,
    registry: Registry,
    admit: Admit,
    execute: Executor,
) -> tuple[PairsResult, W]:
    """Scores of a rerank or classify request: checked and tokenized off the loop, run
    in parts, admitted and cancelled as an encode request."""
    settings = execute.settings

    def checked(request: PairsRequest) -> tuple[PairsRequest, ModelRuntime, list[TokenizedPair]]:
        runtime = registry.runtime(request.model)
        return request, runtime, prepare(request, runtime, settings)

    (request, runtime, pairs), wire = await admit.prepared(scope, parse, checked, lambda _: False)
    scope.served(runtime.info.name, runtime.info.version)
    tokens = sum(len(p.ids) for p in pairs)
    ticket = scope.admitted()
    ticket.hold(ticket.bytes + BYTES_PER_TOKEN * tokens, "this request")
    sequences = [text.id_pairs(p.ids, p.type_ids) for p in pairs]
    results = await execute.results_in_parts(runtime, sequences, graph_io.GRAPH_SCORES, scope)
    execute.count_tokens(runtime, tokens)
    head = runtime.info.manifest.head
    assert head is not None  # check_task
    logits = np.stack([r[graph_io.OUTPUT_LOGITS] for r in results]).astype(np.float32)
    scores = logits if request.raw_scores else activation(logits, head.activation)
    result = PairsResult(runtime.info.name, head.labels, scores.astype(np.float32), pairs, tokens)
    return result, wire


def prepare(
    request: PairsRequest, runtime: ModelRuntime, settings: Settings
) -> list[TokenizedPair]:
    """Check the request against the model and tokenize its pairs (every limit before
    any run)."""
    info = runtime.info
    check_task(info, request.task)
    if request.task == "rerank":
        if not request.query:
            raise InvalidInput("is empty: send some text", field=("query",))
        field = "documents"
        items: list[tuple[str, str | None]] = [(request.query, d) for d in request.documents]
    else:
        field, items = "inputs", request.inputs
    if not items:
        raise InvalidInput(f"is empty: send at least one {field[:-1]}", field=(field,))
    for i, (a, b) in enumerate(items):
        if not a or (b is not None and not b):
            raise InvalidInput("is empty: send some text", field=(field, i))
    limits.check_sequence_count(len(items), settings, pooled_only=True)
    pairs = tokenize(runtime, items, request, field)
    lengths: list[int | None] = [len(p.ids) for p in pairs]
    limits.check_lengths(lengths, info, settings, field, pooled_only=True)
    return pairs


def tokenize(
    runtime: ModelRuntime,
    items: list[tuple[str, str | None]],
    request: PairsRequest,
    field: str,
) -> list[TokenizedPair]:
    """Each item as the model reads it: a pair by the tokenizer's pair template (cut by
    its second text), a single text as any text."""
    front_end = text.front_end(runtime)
    left = request.truncation_direction == "left"
    room = runtime.info.max_seq_len
    found: list[TokenizedPair | None] = [None] * len(items)
    by_first: dict[str, list[int]] = {}
    for i, (a, b) in enumerate(items):
        if b is not None:
            by_first.setdefault(a, []).append(i)
    for first, where in by_first.items():
        if request.truncate and front_end.pair_overhead(first) >= room:
            name = ("query",) if request.task == "rerank" else (field, where[0], 0)
            raise InvalidInput(
                f"leaves no room for a document: with the special tokens it takes "
                f"{front_end.pair_overhead(first)} of model {runtime.info.name!r}'s "
                f"{room} tokens; shorten it",
                field=name,
            )
        seconds = [items[i][1] or "" for i in where]
        for i, pair in zip(
            where,
            front_end.tokenize_pairs(first, seconds, truncate=request.truncate, left=left),
            strict=True,
        ):
            found[i] = pair
    singles = [i for i, (_, b) in enumerate(items) if b is None]
    if singles:
        encoded = front_end.tokenize(
            [items[i][0] for i in singles], truncate=request.truncate, left=left
        )
        for i, (tokens, ids, types) in zip(singles, encoded, strict=True):
            found[i] = TokenizedPair(tokens, ids, types, (1, len(ids) - 1), (len(ids), len(ids)))
    return [p for p in found if p is not None]
