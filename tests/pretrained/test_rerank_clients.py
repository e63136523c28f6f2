"""Rerank through a real client that was not written for this server: Cohere's Python SDK
(``cohere.Client`` at ``/v1/rerank``, ``cohere.ClientV2`` at ``/v2/rerank``), pointed
here by ``base_url``. Its pydantic response models parse the answer; scores and order
equal ``CrossEncoder.predict`` on the same checkpoint. (LangChain's CohereRerank calls
ClientV2's rerank.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import running_server
from tests.pretrained.test_rerank import DOCUMENTS, QUERY

DOCUMENTS = DOCUMENTS[:4]  # test_rerank's, its long one cut to fit the window


@pytest.fixture(scope="module")
def served(head_models: tuple[Path, dict[str, Path]]) -> Iterator[tuple[str, Path]]:
    repository, sources = head_models
    with running_server(repository, default_model="bert-reranker") as base:
        yield base, sources["bert-reranker"]


def test_cohere_sdk_reranks(served: tuple[str, Path]) -> None:
    cohere = pytest.importorskip("cohere")
    from sentence_transformers import CrossEncoder

    url, folder = served
    want = CrossEncoder(str(folder), max_length=128).predict([(QUERY, d) for d in DOCUMENTS])
    with httpx.Client(timeout=60) as http:
        client = cohere.Client(api_key="unused", base_url=url, max_retries=0, httpx_client=http)
        answer = client.rerank(
            model="bert-reranker", query=QUERY, documents=DOCUMENTS, top_n=3, return_documents=True
        )
        # Cohere v1 also takes documents as objects with a text field.
        objects = client.rerank(
            model="bert-reranker", query=QUERY, documents=[{"text": d} for d in DOCUMENTS]
        )
    best = [int(i) for i in np.argsort(-want, kind="stable")[:3]]
    assert [r.index for r in answer.results] == best
    for r in answer.results:
        assert abs(r.relevance_score - float(want[r.index])) <= 1e-5
        assert r.document is not None and r.document.text == DOCUMENTS[r.index]
    assert [r.index for r in objects.results] == [int(i) for i in np.argsort(-want, kind="stable")]


def test_cohere_v2_sdk_reranks(served: tuple[str, Path]) -> None:
    """cohere.ClientV2 (which LangChain's CohereRerank uses) posts to /v2/rerank."""
    cohere = pytest.importorskip("cohere")
    from sentence_transformers import CrossEncoder

    url, folder = served
    want = CrossEncoder(str(folder), max_length=128).predict([(QUERY, d) for d in DOCUMENTS])
    with httpx.Client(timeout=60) as http:
        client = cohere.ClientV2(api_key="unused", base_url=url, max_retries=0, httpx_client=http)
        answer = client.rerank(model="bert-reranker", query=QUERY, documents=DOCUMENTS, top_n=2)
    best = [int(i) for i in np.argsort(-want, kind="stable")[:2]]
    assert [r.index for r in answer.results] == best
    for r in answer.results:
        assert abs(r.relevance_score - float(want[r.index])) <= 1e-5
