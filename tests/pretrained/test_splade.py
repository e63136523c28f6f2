"""SPLADE vectors served, against sentence-transformers' SparseEncoder on the same folder.

``tests.support.heads``' SPLADE model is a random-initialised BERT masked-LM saved by
sentence-transformers as a SparseEncoder (MLMTransformer + SpladePooling max/relu),
exported by the CLI and served. Served indices equal the nonzeros of
``SparseEncoder.encode`` and values agree within 1e-4, texts padded together in a
batch and a long one cut to the model's window.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.run_planner import memory_bounds
from tests.conftest import running_server
from tests.support.metrics import scrape

WEIGHT_ATOL = 1e-4
TEXTS = [
    "sparse retrieval with learned term weights",
    "a",
    "the quick brown fox jumps over the lazy dog",
    "rerankers read the query and the document together " * 20,  # cut to 128 tokens
]


@pytest.fixture(scope="module")
def url(head_models: tuple[Path, dict[str, Path]]) -> Iterator[str]:
    with running_server(head_models[0], default_model="bert-splade") as base:
        yield base


@pytest.fixture(scope="module")
def reference(head_models: tuple[Path, dict[str, Path]]) -> np.ndarray:
    """SparseEncoder's vectors of TEXTS, dense [texts, vocab]."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(head_models[1]["bert-splade"]))
    dense: np.ndarray = model.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    return dense


def sparse(url: str, path: str = "/v1/embed_sparse", **body: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"inputs": TEXTS, "truncate": True, **body}, timeout=60)


def test_splade_equals_sparse_encoder(
    url: str, reference: np.ndarray, head_models: tuple[Path, dict[str, Path]]
) -> None:
    """The model's own kind by default (splade), named or not; tokens behind the ids."""
    from tokenizers import Tokenizer

    for body in ({"model": "bert-splade"}, {"model": "bert-splade", "kind": "splade"}):
        answer = sparse(url, return_text=True, **body)
        assert answer.status_code == 200, answer.text
        for item, want in zip(answer.json()["data"], reference, strict=True):
            assert item["indices"] == np.flatnonzero(want).tolist()
            np.testing.assert_allclose(item["values"], want[want > 0], atol=WEIGHT_ATOL, rtol=0)
    item = answer.json()["data"][0]
    tokenizer = Tokenizer.from_file(str(head_models[0] / "bert-splade" / "tokenizer.json"))
    assert item["text"] == [tokenizer.id_to_token(i) for i in item["indices"]]


def test_top_k_and_threshold_equal_a_numpy_selection(url: str, reference: np.ndarray) -> None:
    answer = sparse(url, model="bert-splade", top_k=5, threshold=0.2)
    assert answer.status_code == 200, answer.text
    for item, want in zip(answer.json()["data"], reference, strict=True):
        above = [i for i in np.flatnonzero(want) if want[i] >= 0.2]
        best = sorted(sorted(above, key=lambda i: (-want[i], i))[:5])
        assert item["indices"] == best
        np.testing.assert_allclose(item["values"], want[best], atol=WEIGHT_ATOL, rtol=0)


def test_tei_embed_sparse_serves_splade_for_a_splade_model(url: str, reference: np.ndarray) -> None:
    answer = sparse(url, "/embed_sparse")
    assert answer.status_code == 200, answer.text
    for vector, want in zip(answer.json(), reference, strict=True):
        assert [v["index"] for v in vector] == np.flatnonzero(want).tolist()
        got = [v["value"] for v in vector]
        np.testing.assert_allclose(got, want[want > 0], atol=WEIGHT_ATOL, rtol=0)


def test_the_sdk_gets_splade_vectors(url: str, reference: np.ndarray) -> None:
    from attnserve_client import Client

    with Client(url) as client:
        answer = client.embed_sparse(TEXTS[:1], model="bert-splade", kind="splade", top_k=3)
    (vector,) = answer.vectors
    assert len(vector.indices) == 3
    assert set(vector.indices) <= set(np.flatnonzero(reference[0]).tolist())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"top_k": 0}, "top_k"),
        ({"top_k": -3}, "top_k"),
        ({"threshold": -0.1}, "threshold"),
        ({"threshold": "NaN"}, "threshold"),
        ({"model": "bert-reranker", "kind": "splade"}, "is a rerank model"),
        ({"kind": "sparse"}, "kind"),
    ],
)
def test_bad_splade_requests_are_refused_naming_the_field(
    url: str, change: dict[str, Any], field: str
) -> None:
    answer = sparse(url, **{"model": "bert-splade", **change})
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["error"], answer.text


@pytest.fixture(scope="module")
def tight_url(head_models: tuple[Path, dict[str, Path]]) -> Iterator[str]:
    """A server whose runs may hold the logits of 2 x 128 tokens (30,522 floats each)."""
    floats = str(2 * 128 * 30522)
    with running_server(head_models[0], max_batch_attention_floats=floats) as base:
        yield base


def test_a_large_splade_request_runs_within_the_logits_bound(tight_url: str) -> None:
    """12 texts of 128 tokens: at most two a run, so at least 6 runs, every one of them
    (the only runs on this server meanwhile) of at most 2 sequences."""

    def runs() -> tuple[float, float, float]:
        now = scrape(tight_url)
        count = now.value("attnserve_inference_seconds_count", model="bert-splade", graph="splade")
        small = now.value("attnserve_batch_sequences_bucket", le="2.0")
        return count, small, now.value("attnserve_batch_sequences_count")

    before = runs()
    body = {"inputs": [TEXTS[3]] * 12, "model": "bert-splade", "truncate": True}
    answer = httpx.post(f"{tight_url}/v1/embed_sparse", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["tokens"] == 12 * 128
    after = runs()
    assert after[0] - before[0] >= 6
    assert after[1] - before[1] == after[2] - before[2]  # every run: <= 2 sequences


def test_a_splade_run_is_bounded_by_its_logits() -> None:
    """A SPLADE run makes [batch, tokens, vocab] logits: the batcher's bound counts them,
    so 64 texts of 128 tokens (250 M floats of logits) never run at once."""
    fits = memory_bounds(4096, 0, 32 * 1024 * 1024, per_token=30522)
    assert fits(8, 128)  # 31 M floats
    assert not fits(9, 128)
    assert memory_bounds(4096, 0, 32 * 1024 * 1024)(32, 128)  # without them: tokens only
