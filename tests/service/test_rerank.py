"""Rerank and classify end to end: a real server on the head_models repository, its
answers against sentence-transformers' CrossEncoder and transformers' PyTorch models
on the same checkpoints, and the pair tokenization against the HF tokenizer's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import running_server

QUERY = "what is attention in a transformer"
DOCUMENTS = [
    "attention weighs every token by its relevance to the query",
    "the quick brown fox jumps over the lazy dog",
    "rerankers read the query and the document together",
    "sparse vectors keep a weight per vocabulary word " * 40,  # over the window: cut
]


@pytest.fixture(scope="module")
def heads(head_models: tuple[Path, dict[str, Path]]) -> Iterator[tuple[str, dict[str, Path]]]:
    repository, sources = head_models
    with running_server(repository) as url:
        yield url, sources


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def test_tei_rerank_equals_cross_encoder(heads: tuple[str, dict[str, Path]]) -> None:
    from sentence_transformers import CrossEncoder

    url, sources = heads
    model = CrossEncoder(str(sources["bert-reranker"]), max_length=128, device="cpu")
    want = model.predict([(QUERY, d) for d in DOCUMENTS])
    body = {"model": "bert-reranker", "query": QUERY, "texts": DOCUMENTS, "truncate": True}
    response = post(url, "/rerank", body | {"return_text": True})
    assert response.status_code == 200, response.text
    got = response.json()
    assert [r["index"] for r in got] == list(np.argsort(-want, kind="stable"))
    for r in got:
        assert abs(r["score"] - float(want[r["index"]])) <= 1e-5
        assert r["text"] == DOCUMENTS[r["index"]]


def test_xlmr_rerank_raw_scores_equal_transformers(heads: tuple[str, dict[str, Path]]) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    url, sources = heads
    folder = str(sources["xlmr-reranker"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    batch = tokenizer(
        [QUERY] * len(DOCUMENTS),
        DOCUMENTS,
        truncation="only_second",
        max_length=128,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        logits = model(**batch).logits[:, 0].numpy()
    for raw, want in ((True, logits), (False, 1 / (1 + np.exp(-logits)))):
        body = {"query": QUERY, "texts": DOCUMENTS, "truncate": True, "raw_scores": raw}
        response = post(url, "/rerank", body | {"model": "xlmr-reranker"})
        assert response.status_code == 200, response.text
        got = {r["index"]: r["score"] for r in response.json()}
        assert np.allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-5)


def test_pair_tokens_equal_hf_tokenizer(head_models: tuple[Path, dict[str, Path]]) -> None:
    """Ids and token types of truncated and whole pairs, both tokenizer kinds."""
    from transformers import AutoTokenizer

    from service.model_info import read_model_info
    from service.tokenizer import TextFrontEnd
    from tests.service.layers.conftest import layer_settings

    repository, sources = head_models
    for name in ("bert-reranker", "xlmr-reranker"):
        info = read_model_info(repository / name, layer_settings(repository))
        front_end = TextFrontEnd.load(info)
        assert front_end is not None
        hf = AutoTokenizer.from_pretrained(str(sources[name]))
        pairs = front_end.tokenize_pairs(QUERY, DOCUMENTS, truncate=True)
        for document, pair in zip(DOCUMENTS, pairs, strict=True):
            want = hf(QUERY, document, truncation="only_second", max_length=info.max_seq_len)
            assert pair.ids == want["input_ids"]
            if "token_type_ids" in want:
                assert pair.type_ids == want["token_type_ids"]
            start, stop = pair.query
            assert hf.decode(pair.ids[start:stop]).strip() == QUERY
        assert len(pairs[-1].ids) == info.max_seq_len


def test_predict_equals_pytorch(heads: tuple[str, dict[str, Path]]) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    url, sources = heads
    folder = str(sources["bert-classifier"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    texts = ["the quick brown fox", ["a query", "and its document"]]
    for item in texts:
        args = (item,) if isinstance(item, str) else tuple(item)
        with torch.no_grad():
            logits = model(**tokenizer(*args, return_tensors="pt")).logits[0]
        want = torch.softmax(logits, -1).numpy()
        response = post(url, "/predict", {"model": "bert-classifier", "inputs": item})
        assert response.status_code == 200, response.text
        got = response.json()
        assert [g["label"] for g in got] == [labels[i] for i in np.argsort(-want)]
        for g in got:
            assert abs(g["score"] - float(want[labels.index(g["label"])])) <= 1e-5
    both = post(url, "/predict", {"model": "bert-classifier", "inputs": texts})
    assert both.status_code == 200 and len(both.json()) == 2
    raw = post(url, "/predict", {"model": "bert-classifier", "inputs": "x", "raw_scores": True})
    with torch.no_grad():
        logits = model(**tokenizer("x", return_tensors="pt")).logits[0].numpy()
    assert np.allclose(sorted(g["score"] for g in raw.json()), sorted(logits), atol=1e-5)


def test_info_says_the_model_type(heads: tuple[str, dict[str, Path]]) -> None:
    url, _ = heads
    info = httpx.get(url + "/info", timeout=10).json()
    assert set(info["model_type"]) <= {"reranker", "classifier", "embedding"}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"query": "", "documents": ["a"]}, 422, "query"),
        ({"query": "q", "documents": []}, 422, "documents"),
        ({"query": "q", "documents": ["a", ""]}, 422, "documents[1]"),
        ({"query": "q", "documents": ["a"] * 10_000}, 413, "10000 sequences"),
        ({"query": "q", "documents": ["word " * 400], "truncate": False}, 413, "documents[0]"),
        ({"query": "word " * 400, "documents": ["a"]}, 422, "query"),
        ({"model": "bert-classifier", "query": "q", "documents": ["a"]}, 422, "model"),
    ],
)
def test_bad_rerank_requests(
    heads: tuple[str, dict[str, Path]], body: dict, status: int, field: str
) -> None:
    """Native /v1/rerank answers 422/413 naming the field; TEI's /rerank refuses the same
    bodies with its own 4xx statuses (400 Empty, 413, 422 Validation)."""
    url, _ = heads
    response = post(url, "/v1/rerank", {"model": "bert-reranker"} | body)
    assert response.status_code == status, response.text
    assert field in response.text, response.text
    tei = {k if k != "documents" else "texts": v for k, v in body.items()}
    response = post(url, "/rerank", {"model": "bert-reranker", "truncate": True} | tei)
    assert 400 <= response.status_code < 500, response.text


def test_embedding_model_asked_to_rerank_names_its_task(heads: tuple[str, dict[str, Path]]) -> None:
    url, _ = heads
    response = post(url, "/rerank", {"model": "bert-splade", "query": "q", "texts": ["a"]})
    assert response.status_code == 422
    assert "is a splade model: it cannot rerank" in response.text


def test_v1_rerank_cohere_shape(heads: tuple[str, dict[str, Path]]) -> None:
    from sentence_transformers import CrossEncoder

    url, sources = heads
    model = CrossEncoder(str(sources["bert-reranker"]), max_length=128, device="cpu")
    want = model.predict([(QUERY, d) for d in DOCUMENTS])
    documents: list = [*DOCUMENTS[:2], {"text": DOCUMENTS[2]}, DOCUMENTS[3]]
    body = {"model": "bert-reranker", "query": QUERY, "documents": documents}
    response = post(url, "/v1/rerank", body | {"top_n": 2, "return_documents": True})
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["model"] == "bert-reranker" and got["usage"]["total_tokens"] > 0
    best = list(np.argsort(-want, kind="stable"))[:2]
    assert [r["index"] for r in got["results"]] == best
    for r in got["results"]:
        assert abs(r["relevance_score"] - float(want[r["index"]])) <= 1e-5
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}


@pytest.mark.parametrize("top_n", [0, -1])
def test_v1_rerank_top_n_at_least_one(heads: tuple[str, dict[str, Path]], top_n: int) -> None:
    url, _ = heads
    body = {"model": "bert-reranker", "query": "q", "documents": ["a"], "top_n": top_n}
    response = post(url, "/v1/rerank", body)
    assert response.status_code == 422 and "top_n" in response.text, response.text


def test_models_list_the_task(heads: tuple[str, dict[str, Path]]) -> None:
    url, _ = heads
    cards = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
    assert cards["bert-reranker"]["task"] == "rerank"
    assert cards["bert-classifier"]["task"] == "classify"
    assert cards["bert-classifier"]["labels"] == ["negative", "neutral", "positive"]
