"""Every request kind goes through the one prologue (``Engine.handle``), checked by one
table: a started engine (real runtimes, batcher and graphs) on real MiniLM and models
with heads. For each kind: a request already past its deadline is 504 before it is
parsed; its working memory (the kind's ``held``) is charged on its ticket, so it is 429
with one byte too few left, and held until its answer is sent; it is served by the model it
names; only encode answers come from the response cache (ENCODE's, and /v1/encode's kind's
when it chose ENCODE); nothing is held afterwards.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.engine import (
    CLASSIFY,
    DECODE,
    ENCODE,
    ENCODE_OR_MULTI_VECTOR,
    RERANK,
    SIMILARITY,
    SPARSE,
    TOKENIZE,
    ClassifyRequest,
    DecodeRequest,
    EncodeRequest,
    Engine,
    RequestKind,
    RerankRequest,
    SimilarityRequest,
    SparseRequest,
    TokenizeRequest,
    WireCost,
)
from service.errors import DeadlineExceeded, Overloaded
from tests.service.layers.conftest import layer_settings, with_started_engine, work_scope
from tests.service.layers.test_admission import in_flight
from tests.support.metrics import metric

MiB = 1 << 20
BUDGET = 64 * MiB
JSON = WireCost(per_float=12.0)
TEXT = "late interaction keeps a vector per token"


CACHED = (ENCODE, ENCODE_OR_MULTI_VECTOR)  # the kinds whose encode answers are kept


@dataclass(frozen=True)
class Row:
    kind: RequestKind[Any, Any, Any]
    request: object
    model: str | None  # the model it is served by (None: no model's work)


ROWS = [
    Row(ENCODE, EncodeRequest([TEXT], JSON, model="minilm-l6", pooling="mean"), "minilm-l6"),
    # /v1/encode's kind, an encode request chosen: every step ENCODE's, its cache included
    Row(
        ENCODE_OR_MULTI_VECTOR,
        EncodeRequest([TEXT], JSON, model="minilm-l6", pooling="mean"),
        "minilm-l6",
    ),
    Row(SPARSE, SparseRequest([TEXT], JSON, model="minilm-l6"), "minilm-l6"),
    Row(SPARSE, SparseRequest([TEXT], JSON, model="bert-splade"), "bert-splade"),
    Row(RERANK, RerankRequest("a query", [TEXT, "other"], model="bert-reranker"), "bert-reranker"),
    Row(CLASSIFY, ClassifyRequest([TEXT], model="bert-classifier"), "bert-classifier"),
    Row(SIMILARITY, SimilarityRequest("a query", [TEXT], JSON, model="minilm-l6"), "minilm-l6"),
    Row(
        TOKENIZE,
        TokenizeRequest([TEXT], JSON, model="minilm-l6", return_embeddings=True),
        "minilm-l6",
    ),
    Row(DECODE, DecodeRequest([[101, 2000, 102]], model="minilm-l6"), None),
]


@pytest.fixture(scope="module")
def repository(
    tmp_path_factory: pytest.TempPathFactory,
    minilm_repository: Path,
    head_models: tuple[Path, dict[str, Path]],
) -> Path:
    """MiniLM and the models with heads in one repository (their files linked, not copied)."""
    root = tmp_path_factory.mktemp("kinds")
    for source in (*minilm_repository.iterdir(), *head_models[0].iterdir()):
        (root / source.name).mkdir()
        for file in source.iterdir():
            os.link(file, root / source.name / file.name)
    return root


class Parse:
    """A protocol's parse: hands back the request, and counts its calls."""

    def __init__(self, request: object) -> None:
        self.request, self.calls = request, 0

    def __call__(self) -> tuple[object, None]:
        self.calls += 1
        return self.request, None


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.kind.name}-{r.model}")
def test_every_kind_goes_through_the_one_prologue(repository: Path, row: Row) -> None:
    settings = layer_settings(
        repository,
        default_model="minilm-l6",
        max_inflight_bytes=BUDGET,
        response_cache_bytes=16 * MiB,
        response_cache_shared=True,
    )

    async def body(engine: Engine) -> None:
        serving = engine._serving
        held = row.kind.held(row.kind.prepare(row.request, serving), serving)
        assert 0 <= held < BUDGET

        late = Parse(row.request)
        with work_scope(engine) as scope, pytest.raises(DeadlineExceeded) as passed:
            scope.deadline = time.monotonic() - 1.0
            await engine.handle(row.kind, late, scope)
        assert late.calls == 0  # a request past its deadline costs no parsing
        assert "Retry-After" in passed.value.headers

        if held:  # one byte too few left: refused, holding nothing
            with engine.ticket() as other:
                other.hold(BUDGET - held + 1, "another request")
                with work_scope(engine) as scope, pytest.raises(Overloaded) as full:
                    await engine.handle(row.kind, Parse(row.request), scope)
                assert full.value.headers["Retry-After"]
            assert in_flight(engine.metrics) == (0, 0)

        for attempt in ("first", "again"):
            with engine.ticket() as other:
                other.hold(MiB, "another request")
                with work_scope(engine) as scope:
                    await engine.handle(row.kind, Parse(row.request), scope)
                    # held on top of what tokenizing held, until the answer is sent
                    ticket = scope.admitted().bytes
                    assert ticket >= held
                    assert in_flight(engine.metrics) == (1, MiB + ticket)
                    assert scope.model == row.model
                    cached = {"first": "miss", "again": "hit"}[attempt]
                    assert scope.cache == (cached if row.kind in CACHED else None)
            assert in_flight(engine.metrics) == (0, 0)
        assert cache_requests(engine) == (2 if row.kind in CACHED else 0)

    with_started_engine(settings, body)


def cache_requests(engine: Engine) -> float:
    return sum(
        metric(engine.metrics.registry, "attnserve_response_cache_requests_total", result=result)
        for result in ("hit", "miss")
    )
