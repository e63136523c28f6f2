"""Why a document ranked: the attention between a query's and a document's tokens.

A cross-encoder reads the query and the document as one sequence, so its attention
maps already hold how each query token attends to each document token. A result
explained runs the pair's token ids (with their token types) through the attention
graph as an ``/v1/encode`` request asking for attention would: the same layer and
head selection, reductions, rollout and norms (``AttentionSpec``), checked, priced
and held by the same rules (``prepare.prepare`` counts the full maps the run makes;
its memory is held on the request's ticket). The answer keeps the query-rows ×
document-columns block of each map and ranks the document's tokens by the
attention they receive from the query's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.engine import prepare
from service.engine.execute import Executor
from service.engine.scope import RequestScope
from service.engine.types import AttentionSpec, EncodeRequest, TokenIds, WireCost
from service.errors import InvalidInput
from service.runtime import ModelRuntime

# Document tokens listed by the attention they receive, at most (a request asks fewer).
MAX_TOP_TOKENS = 64


@dataclass(frozen=True)
class PairTokens:
    """One query-document pair as the tokenizer paired it: ids, types and tokens of the
    whole sequence, and where the query's and the document's tokens lie ([start, end))."""

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    query: tuple[int, int]
    document: tuple[int, int]


@dataclass(frozen=True)
class RankExplanation:
    """One pair's attention from its query tokens to its document tokens.

    ``attention`` is [L', H' or 1, q, d] (the selected maps' query-rows × document-
    columns block); ``top_tokens`` the document tokens the query attends to most:
    (index among the document's tokens, token, mean over the maps of the attention
    summed over the query's tokens), largest first."""

    query_tokens: list[str]
    document_tokens: list[str]
    attention: np.ndarray
    top_tokens: list[tuple[int, str, float]]


@dataclass(frozen=True)
class MaxSimExplanation:
    """Why a document scored so: per query token (``query_tokens``, those with a vector)
    the document token its vector matched best (``best``: its index among
    ``document_tokens``, those with a vector) and that match's term of the score
    (``terms``: the dot product, divided by the query's vector count for meanmaxsim).
    The terms sum to the score."""

    query_tokens: list[str]
    document_tokens: list[str]
    best: list[int]
    terms: list[float]


def check_spec(spec: AttentionSpec) -> None:
    """The explanation is blocks of whole maps, as stored: no cut rows, summaries or
    float16 (422 naming the option)."""
    compact = {
        "top_k": spec.top_k is not None,
        "threshold": spec.threshold is not None,
        "summaries": bool(spec.summaries),
        "maps": not spec.maps,
        "dtype": spec.dtype != "float32",
    }
    for name, asked in compact.items():
        if asked:
            raise InvalidInput(
                "is for /v1/encode: why a document ranked answers whole maps' blocks",
                field=("attention", name),
            )


async def explain(
    pairs: list[PairTokens],
    spec: AttentionSpec,
    top_tokens: int,
    runtime: ModelRuntime,
    scope: RequestScope,
    execute: Executor,
    wire_cost: WireCost,
) -> list[RankExplanation]:
    """The explanations of ``pairs``, run on ``runtime`` (the version that scored them)."""
    if not pairs:
        return []
    request = EncodeRequest(
        inputs=[TokenIds(p.ids, p.type_ids) for p in pairs],
        wire_cost=wire_cost,
        model=runtime.info.name,
        resolved=runtime.info,
        return_attention=True,
        attention=spec,
        return_embeddings=False,
    )
    prepared = prepare.prepare(request, runtime, execute.settings)
    ticket = scope.admitted()
    ticket.add(prepared.work_bytes, "this request")
    result = await execute.run(
        prepared, runtime, deadline=scope.deadline, until=scope.cancelled, timing=scope.timing
    )
    explained = []
    for pair, output in zip(pairs, result.outputs, strict=True):
        assert output.attention is not None
        (q0, q1), (d0, d1) = pair.query, pair.document
        block = np.ascontiguousarray(output.attention[:, :, q0:q1, d0:d1])
        explained.append(
            RankExplanation(
                pair.tokens[q0:q1],
                pair.tokens[d0:d1],
                block,
                most_attended(block, pair.tokens[d0:d1], top_tokens),
            )
        )
    return explained


def most_attended(
    block: np.ndarray, document_tokens: list[str], count: int
) -> list[tuple[int, str, float]]:
    """The ``count`` document tokens receiving the most attention from the query's:
    summed over query rows, averaged over the maps; ties to the earlier token."""
    received = block.sum(axis=2, dtype=np.float64).mean(axis=(0, 1))  # (d,)
    order = np.argsort(-received, kind="stable")[:count]
    return [(int(j), document_tokens[j], float(received[j])) for j in order]
