"""Rerankers and classifiers served, against sentence-transformers and transformers.

The models are ``tests.support.heads``' small random-initialised checkpoints as their
users save them (a CrossEncoder folder, an XLM-R reranker and a three-label BERT
classifier from ``save_pretrained``), exported by the CLI and served. References run
in-process on the same folders: ``CrossEncoder.predict`` (scores ≤ 1e-5, the same
order), the classifier's softmax of its logits (≤ 1e-5), the tokenizer's own pairs
(tokens equal) and the model's eager attentions sliced to the pair's query rows and
document columns (≤ 1e-4).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import free_port, running_server
from tests.support.metrics import metric

SCORE_ATOL = 1e-5
ATTENTION_ATOL = 1e-4
QUERY = "what is attention in a transformer"
DOCUMENTS = [
    "attention weighs every token by its relevance to the query",
    "the quick brown fox jumps over the lazy dog",
    "rerankers read the query and the document together",
    "sparse vectors keep a weight per vocabulary word " * 30,  # cut to fit the window
    "a",
]


GRPC: dict[str, str] = {}  # the module server's gRPC address, once it runs


@pytest.fixture(scope="module")
def url(head_models: tuple[Path, dict[str, Path]]) -> Iterator[str]:
    repository, _ = head_models
    port = free_port()
    with running_server(repository, default_model="bert-reranker", grpc_port=str(port)) as base:
        GRPC["address"] = f"127.0.0.1:{port}"
        yield base


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def cross_encoder_scores(folder: Path, documents: list[str], *, raw: bool = False) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), max_length=128)
    if raw:
        model.activation_fn = torch.nn.Identity()
    scores: np.ndarray = model.predict([(QUERY, d) for d in documents])
    return scores


@pytest.mark.parametrize("name", ["bert-reranker", "xlmr-reranker"])
def test_rerank_equals_cross_encoder(
    url: str, head_models: tuple[Path, dict[str, Path]], name: str
) -> None:
    answer = post(url, "/v1/rerank", {"model": name, "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    want = cross_encoder_scores(head_models[1][name], DOCUMENTS)
    got = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, atol=SCORE_ATOL, rtol=0)
    assert [r["index"] for r in results] == sorted(range(len(want)), key=lambda i: -want[i])
    assert answer.json()["model"] == name and answer.json()["usage"]["total_tokens"] > 0


def test_top_n_documents_as_objects_and_return_documents(url: str) -> None:
    body = {
        "model": "bert-reranker",
        "query": QUERY,
        "documents": [{"text": d} for d in DOCUMENTS],
        "top_n": 2,
        "return_documents": True,
    }
    every = post(url, "/v1/rerank", {**body, "top_n": None}).json()["results"]
    results = post(url, "/v1/rerank", body).json()["results"]
    assert results == every[:2]
    assert [r["document"]["text"] for r in results] == [DOCUMENTS[r["index"]] for r in results]


def test_tei_rerank_raw_scores_and_text(
    url: str, head_models: tuple[Path, dict[str, Path]]
) -> None:
    """TEI's /rerank on the default model: raw_scores are the logits; truncate as TEI's."""
    body = {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True, "return_text": True}
    answer = post(url, "/rerank", {**body, "truncate": True})
    assert answer.status_code == 200, answer.text
    want = cross_encoder_scores(head_models[1]["bert-reranker"], DOCUMENTS, raw=True)
    for item in answer.json():
        assert item["text"] == DOCUMENTS[item["index"]]
        assert abs(item["score"] - want[item["index"]]) <= SCORE_ATOL
    assert answer.headers["x-compute-tokens"] == str(
        post(url, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()["usage"][
            "total_tokens"
        ]
    )
    # TEI's default is not to cut: the long document is refused, named as TEI's body does.
    refused = post(url, "/rerank", body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith("texts[3]: 250 tokens"), refused.text


def _hf_pair(folder: Path, document: str) -> tuple[list[str], dict[str, torch.Tensor]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    encoded = tokenizer(
        QUERY, document, truncation="only_second", max_length=128, return_tensors="pt"
    )
    return tokenizer.convert_ids_to_tokens(encoded["input_ids"][0]), dict(encoded)


@pytest.mark.parametrize(("name", "document"), [("bert-reranker", 3), ("xlmr-reranker", 0)])
def test_why_it_ranked_equals_eager_attention_sliced_to_the_pair(
    url: str, head_models: tuple[Path, dict[str, Path]], name: str, document: int
) -> None:
    """Every layer's and head's attention from the query's tokens to the document's, and
    the pair's tokens, as the checkpoint's own tokenizer and eager attention give them
    (the long document cut to fit, the query kept whole)."""
    from transformers import AutoModelForSequenceClassification

    body = {
        "model": name,
        "query": QUERY,
        "documents": [DOCUMENTS[document]],
        "return_attention": True,
        "top_tokens": 3,
    }
    answer = post(url, "/v1/rerank", body)
    assert answer.status_code == 200, answer.text
    explanation = answer.json()["results"][0]["explanation"]
    folder = head_models[1][name]
    tokens, inputs = _hf_pair(folder, DOCUMENTS[document])
    kinds = inputs.get("token_type_ids")
    # Where the query and the document lie: between the special tokens of the pair.
    q = len(explanation["query_tokens"])
    query_start = tokens.index(explanation["query_tokens"][0])
    doc_start = len(tokens) - 1 - len(explanation["document_tokens"])
    assert tokens[query_start : query_start + q] == explanation["query_tokens"]
    assert tokens[doc_start:-1] == explanation["document_tokens"]
    if kinds is not None:  # BERT: the document's tokens are type 1
        assert kinds[0, doc_start:-1].eq(1).all()
    model = AutoModelForSequenceClassification.from_pretrained(
        str(folder), attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        maps = torch.cat(model(**inputs, output_attentions=True).attentions).numpy()
    want = maps[:, :, query_start : query_start + q, doc_start:-1]  # [L, H, q, d]
    got = np.asarray(explanation["attention"], dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=ATTENTION_ATOL, rtol=0)
    received = got.sum(axis=2).mean(axis=(0, 1))
    top = explanation["top_tokens"]
    assert [t["index"] for t in top] == list(np.argsort(-received, kind="stable")[:3])
    assert [t["token"] for t in top] == [explanation["document_tokens"][t["index"]] for t in top]
    np.testing.assert_allclose([t["weight"] for t in top], np.sort(received)[::-1][:3], atol=1e-5)


def test_why_it_ranked_takes_the_encode_selection(url: str) -> None:
    """The selection and reductions of /v1/encode: one layer's head mean is [1, 1, q, d]
    and equals the mean of that layer's heads."""
    base = {"model": "bert-reranker", "query": QUERY, "documents": [DOCUMENTS[0]]}
    full = post(url, "/v1/rerank", {**base, "return_attention": True}).json()
    mean = post(
        url,
        "/v1/rerank",
        {**base, "return_attention": True, "attention": {"layers": [-1], "reduce": "mean"}},
    ).json()
    every = np.asarray(full["results"][0]["explanation"]["attention"])
    one = np.asarray(mean["results"][0]["explanation"]["attention"])
    assert one.shape == (1, 1, *every.shape[2:])
    np.testing.assert_allclose(one[0, 0], every[-1].mean(axis=0), atol=1e-6)
    bad = post(url, "/v1/rerank", {**base, "return_attention": True, "attention": {"layers": [9]}})
    assert bad.status_code == 422 and "attention.layers" in bad.json()["error"], bad.text
    # Compact attention is /v1/encode's: an explanation is blocks of whole maps.
    for option in ({"top_k": 2}, {"summaries": ["entropy"]}, {"dtype": "float16"}):
        body = {**base, "return_attention": True, "attention": option}
        bad = post(url, "/v1/rerank", body)
        field = f"attention.{next(iter(option))}"
        assert bad.status_code == 422 and field in bad.json()["error"], bad.text


@pytest.mark.parametrize(
    ("change", "status", "field"),
    [
        ({"query": ""}, 422, "query"),
        ({"query": "   "}, 422, "query"),
        ({"documents": []}, 422, "documents"),
        ({"documents": ["fine", ""]}, 422, "documents[1]"),
        ({"documents": ["d"] * 10_000}, 413, "10000 sequences"),
        ({"documents": [DOCUMENTS[3]], "truncate": False}, 413, "documents[0]: 250 tokens"),
        ({"query": "attention " * 200}, 422, "query"),
        ({"top_n": 0}, 422, "top_n"),
        ({"top_n": -1}, 422, "top_n"),
        ({"top_tokens": 0}, 422, "top_tokens"),
        ({"max_tokens_per_doc": -5}, 422, "max_tokens_per_doc"),
        ({"max_tokens_per_doc": 0}, 422, "max_tokens_per_doc"),
        ({"model": "bert-splade"}, 422, "is a splade model: it cannot rerank"),
        ({"model": "bert-classifier"}, 422, "is a classify model: it cannot rerank"),
        ({"documents": "one text"}, 422, "documents"),
    ],
)
def test_bad_rerank_requests_are_refused_naming_the_field(
    url: str, change: dict[str, Any], status: int, field: str
) -> None:
    body = {"model": "bert-reranker", "query": QUERY, "documents": DOCUMENTS[:2], **change}
    answer = post(url, "/v1/rerank", body)
    assert answer.status_code == status, answer.text
    assert field in answer.json()["error"], answer.text


def test_an_instruction_is_refused_by_a_cross_encoder(url: str) -> None:
    """Only LLM rerankers take an instruction (their prompt's): a cross-encoder's pair
    has no place for one, a 422 naming the field (tests/pretrained/test_llm_reranker.py)."""
    body = {"query": QUERY, "documents": DOCUMENTS[:1], "instruction": "Find foxes"}
    for path, documents in (("/v1/rerank", "documents"), ("/rerank", "texts")):
        answer = post(
            url,
            path,
            {**{k: v for k, v in body.items() if k != "documents"}, documents: body["documents"]},
        )
        assert answer.status_code == 422 and "instruction" in answer.text, answer.text


def test_too_many_documents_to_explain_are_refused_before_any_run(url: str) -> None:
    """Explaining runs the chosen pairs as one attention request (ATTNSERVE_MAX_SEQUENCES,
    64): more is a 413 decided from the counts, before any document is tokenized or
    scored (before, 2,048 documents were scored first and refused after 4.6 s)."""
    runs = "attnserve_inference_seconds_count"
    before = metric(url, runs)
    body = {"query": QUERY, "documents": ["a short document"] * 100, "return_attention": True}
    refused = post(url, "/v1/rerank", body)
    assert refused.status_code == 413, refused.text
    assert "100 sequences" in refused.json()["error"], refused.text
    assert metric(url, runs) == before
    # The control: asking to explain the top 2 of the same 100 runs (and is counted).
    served = post(url, "/v1/rerank", {**body, "top_n": 2})
    assert served.status_code == 200, served.text
    assert metric(url, runs) > before


def test_models_list_their_task(url: str) -> None:
    cards = {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert {name: card["task"] for name, card in cards.items()} == {
        "bert-reranker": "rerank",
        "xlmr-reranker": "rerank",
        "bert-classifier": "classify",
        "bert-splade": "splade",
    }
    assert cards["bert-classifier"]["labels"] == ["negative", "neutral", "positive"]
    info = httpx.get(f"{url}/info", timeout=10).json()
    assert info["model_type"]["reranker"]["id2label"] == {"0": "LABEL_0"}


@pytest.fixture(scope="module")
def classifier_url(
    head_models: tuple[Path, dict[str, Path]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The classifier alone: TEI's routes serve the default model."""
    repository = tmp_path_factory.mktemp("classifier")
    shutil.copytree(head_models[0] / "bert-classifier", repository / "bert-classifier")
    with running_server(repository) as base:
        yield base


def test_predict_equals_the_classifier(
    classifier_url: str, head_models: tuple[Path, dict[str, Path]]
) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = head_models[1]["bert-classifier"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()

    def want(*texts: str) -> dict[str, float]:
        with torch.no_grad():
            logits = model(**tokenizer(*texts, return_tensors="pt")).logits[0]
        return dict(zip(model.config.id2label.values(), logits.softmax(-1).tolist(), strict=True))

    one = post(classifier_url, "/predict", {"inputs": DOCUMENTS[0]}).json()
    assert [p["score"] for p in one] == sorted((p["score"] for p in one), reverse=True)
    expected = want(DOCUMENTS[0])
    for p in one:
        assert abs(p["score"] - expected[p["label"]]) <= SCORE_ATOL
    batch = post(
        classifier_url, "/predict", {"inputs": [DOCUMENTS[1], [QUERY, DOCUMENTS[2]]]}
    ).json()
    for answer, texts in zip(batch, [(DOCUMENTS[1],), (QUERY, DOCUMENTS[2])], strict=True):
        expected = want(*texts)
        assert {p["label"] for p in answer} == set(expected)
        for p in answer:
            assert abs(p["score"] - expected[p["label"]]) <= SCORE_ATOL
    pair = post(classifier_url, "/predict", {"inputs": [QUERY, DOCUMENTS[2]]}).json()
    # Two strings: one pair, as TEI reads them (alone, not padded in a batch: float noise).
    assert [p["label"] for p in pair] == [p["label"] for p in batch[1]]
    np.testing.assert_allclose(
        [p["score"] for p in pair], [p["score"] for p in batch[1]], atol=SCORE_ATOL
    )
    raw = post(classifier_url, "/predict", {"inputs": DOCUMENTS[0], "raw_scores": True}).json()
    with torch.no_grad():
        logits = model(**tokenizer(DOCUMENTS[0], return_tensors="pt")).logits[0].tolist()
    for p in raw:
        assert abs(p["score"] - logits[model.config.label2id[p["label"]]]) <= SCORE_ATOL
    assert httpx.get(f"{classifier_url}/info", timeout=10).json()["model_type"]["classifier"][
        "label2id"
    ] == {"negative": 0, "neutral": 1, "positive": 2}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": []}, "inputs"),
        ({"inputs": ""}, "inputs[0]"),
        ({"inputs": ["a", ["", "b"]]}, "inputs[1][0]"),
    ],
)
def test_empty_predict_inputs_are_refused_as_tei_does(
    classifier_url: str, body: dict[str, Any], field: str
) -> None:
    answer = post(classifier_url, "/predict", body)
    assert answer.status_code == 400 and answer.json()["error_type"] == "Empty", answer.text
    assert field in answer.json()["error"], answer.text


def test_the_sdk_reranks_and_explains(url: str) -> None:
    """Sync and async clients: the same order and scores as the HTTP answer, the
    explanation's attention a float32 array."""
    import asyncio

    from attnserve_client import AsyncClient, Client

    body = {"model": "xlmr-reranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    want = post(url, "/v1/rerank", body).json()["results"]
    with Client(url) as client:
        got = client.rerank(
            QUERY,
            DOCUMENTS,
            model="xlmr-reranker",
            top_n=3,
            return_documents=True,
            return_attention=True,
            attention={"layers": [0], "reduce": "mean"},
        )
    assert [(r.index, r.relevance_score) for r in got.results] == [
        (w["index"], w["relevance_score"]) for w in want
    ]
    assert list(got) == got.results and len(got) == 3 and got[0] is got.results[0]
    first = got.results[0]
    assert first.document == DOCUMENTS[first.index]
    assert first.explanation is not None and first.explanation.attention.dtype == np.float32
    q, d = len(first.explanation.query_tokens), len(first.explanation.document_tokens)
    assert first.explanation.attention.shape == (1, 1, q, d)

    async def asynchronously() -> list[int]:
        async with AsyncClient(url) as client:
            found = await client.rerank(QUERY, DOCUMENTS, model="xlmr-reranker", top_n=3)
        return [r.index for r in found.results]

    assert asyncio.run(asynchronously()) == [w["index"] for w in want]


def test_the_sdk_classifies(classifier_url: str) -> None:
    """Two texts go as two inputs, not read as one pair."""
    from attnserve_client import Client

    with Client(classifier_url) as client:
        two = client.classify([DOCUMENTS[0], DOCUMENTS[1]])
        pair = client.classify([(DOCUMENTS[0], DOCUMENTS[1])])
    alone = post(classifier_url, "/predict", {"inputs": DOCUMENTS[1]}).json()
    assert len(two) == 2 and two[1].labels == [p["label"] for p in alone]
    np.testing.assert_allclose(two[1].scores, [p["score"] for p in alone], atol=SCORE_ATOL)
    together = post(classifier_url, "/predict", {"inputs": [DOCUMENTS[0], DOCUMENTS[1]]}).json()
    np.testing.assert_allclose(pair[0].scores, [p["score"] for p in together], atol=SCORE_ATOL)


def test_open_inference_protocol_reranks_over_http_and_grpc(url: str) -> None:
    """A reranker's /v2 model: query BYTES [1] and documents BYTES [n] in, scores FP32
    [n] out in the documents' order, over tritonclient's HTTP (binary) and gRPC."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    body = {"model": "bert-reranker", "query": QUERY, "documents": DOCUMENTS}
    ranked = post(url, "/v1/rerank", body).json()["results"]
    want = np.zeros(len(DOCUMENTS), dtype=np.float32)
    for r in ranked:
        want[r["index"]] = r["relevance_score"]
    metadata = httpx.get(f"{url}/v2/models/bert-reranker", timeout=10).json()
    assert [(t["name"], t["datatype"]) for t in metadata["inputs"]] == [
        ("query", "BYTES"),
        ("documents", "BYTES"),
    ]
    assert metadata["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1]}]
    query = np.array([QUERY.encode()], dtype=np.object_)
    documents = np.array([d.encode() for d in DOCUMENTS], dtype=np.object_)
    clients = ((httpclient, url.removeprefix("http://")), (grpcclient, GRPC["address"]))
    for client_module, address in clients:
        client = client_module.InferenceServerClient(address)
        inputs = [
            client_module.InferInput("query", [1], "BYTES"),
            client_module.InferInput("documents", [len(DOCUMENTS)], "BYTES"),
        ]
        inputs[0].set_data_from_numpy(query)
        inputs[1].set_data_from_numpy(documents)
        got = client.infer("bert-reranker", inputs).as_numpy("scores")
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    refused = httpx.post(
        f"{url}/v2/models/bert-reranker/infer",
        json={"inputs": [{"name": "query", "datatype": "BYTES", "shape": [1], "data": ["q"]}]},
        timeout=10,
    )
    assert refused.status_code == 422 and "documents" in refused.json()["error"], refused.text
