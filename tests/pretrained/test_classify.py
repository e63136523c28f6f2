"""A classifier beside an embedder, reached by name: ``/v1/classify``, the SDK, ``/v2``.

The server serves the tiny embedder as its default model and ``tests.support.heads``'
three-label BERT classifier beside it (TEI's ``/predict`` answers only the default
model, as TEI's does). The reference is transformers' eager model on the classifier's
checkpoint folder: the softmax of its logits (≤ 1e-5) and the logits themselves for
``raw_scores``. ``/v2`` over HTTP and gRPC answers the scores ``/v1/classify`` gives
(≤ 1e-6: one is float64 in JSON, the other FP32).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import free_port, running_server
from tests.support.heads import LABELS
from tests.support.tiny import MODEL as EMBEDDER

CLASSIFIER = "bert-classifier"
SCORE_ATOL = 1e-5
TEXTS = [
    "attention weighs every token by its relevance to the query",
    "the quick brown fox jumps over the lazy dog",
]
PAIR = ("what is attention in a transformer", "rerankers read the query and the document")
GRPC: dict[str, str] = {}


@pytest.fixture(scope="module")
def url(
    head_models: tuple[Path, dict[str, Path]],
    model_repository: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The tiny embedder (the default) and the classifier, served together."""
    repository = tmp_path_factory.mktemp("embedder-and-classifier")
    shutil.copytree(model_repository / EMBEDDER, repository / EMBEDDER)
    shutil.copytree(head_models[0] / CLASSIFIER, repository / CLASSIFIER)
    port = free_port()
    with running_server(repository, default_model=EMBEDDER, grpc_port=str(port)) as base:
        GRPC["address"] = f"127.0.0.1:{port}"
        yield base


@pytest.fixture(scope="module")
def eager(head_models: tuple[Path, dict[str, Path]]) -> Any:
    """The classifier's logits by transformers, eager, on its checkpoint folder."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = str(head_models[1][CLASSIFIER])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert tuple(model.config.id2label.values()) == LABELS

    def logits(*texts: str) -> np.ndarray:
        with torch.no_grad():
            out: np.ndarray = model(**tokenizer(*texts, return_tensors="pt")).logits[0].numpy()
        return out.astype(np.float64)

    return logits


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    out: np.ndarray = e / e.sum()
    return out


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/classify", json=body, timeout=60)


def test_the_sdk_classifies_by_model_name_beside_an_embedder(url: str, eager: Any) -> None:
    """Sync and async: labels best first with the eager softmax's scores (≤ 1e-5), texts
    and a pair in one call; ``raw_scores`` the logits; ``top_k`` the best labels."""
    from attnserve_client import AsyncClient, Client

    inputs: list[str | tuple[str, str]] = [*TEXTS, PAIR]
    with Client(url) as client:
        assert {c.name: c.default for c in client.models()} == {EMBEDDER: True, CLASSIFIER: False}
        result = client.classify(inputs, model=CLASSIFIER)
        raw = client.classify(TEXTS[0], model=CLASSIFIER, raw_scores=True)
        best = client.classify(inputs, model=CLASSIFIER, top_k=1)
    assert result.model == CLASSIFIER and len(result) == 3
    assert result.usage.sequences == 3 and result.usage.tokens > 0
    for got, texts in zip(result, [(TEXTS[0],), (TEXTS[1],), PAIR], strict=True):
        want = dict(zip(LABELS, softmax(eager(*texts)), strict=True))
        assert got.labels == sorted(LABELS, key=lambda label: -want[label])
        np.testing.assert_allclose(got.scores, [want[x] for x in got.labels], atol=SCORE_ATOL)
        assert got.prediction == got.labels[0] and got.score == got.scores[0]
    logits = dict(zip(LABELS, eager(TEXTS[0]), strict=True))
    np.testing.assert_allclose(raw[0].scores, [logits[x] for x in raw[0].labels], atol=SCORE_ATOL)
    assert [(c.labels, c.scores) for c in best] == [(c.labels[:1], c.scores[:1]) for c in result]

    async def awaited() -> Any:
        async with AsyncClient(url) as client:
            return await client.classify(inputs, model=CLASSIFIER)

    assert [c.labels for c in asyncio.run(awaited())] == [c.labels for c in result]


def test_the_answer_shape_and_two_texts_are_two_inputs(url: str) -> None:
    """Jina's classification items in the native envelope; a list of two strings is two
    texts (TEI's /predict reads it as one pair), pairs are nested."""
    answer = post(url, {"model": CLASSIFIER, "inputs": TEXTS, "top_k": 2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == CLASSIFIER and body["usage"]["sequences"] == 2
    for index, item in enumerate(body["data"]):
        assert item["index"] == index and len(item["predictions"]) == 2
        assert item["predictions"][0] == {"label": item["prediction"], "score": item["score"]}
    paired = post(url, {"model": CLASSIFIER, "inputs": [list(PAIR)]}).json()
    assert paired["usage"]["sequences"] == 1


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        ({"model": "no-such-model"}, 404, "no-such-model"),
        ({"model": EMBEDDER}, 422, f"model {EMBEDDER!r} is an embed model: it cannot classify"),
        ({}, 422, f"model {EMBEDDER!r} is an embed model"),  # the default is the embedder
        ({"inputs": []}, 422, "inputs"),
        ({"inputs": ["fine", ""]}, 422, "inputs[1]"),
        ({"inputs": [["a", "b", "c"]]}, 422, "inputs"),
        ({"inputs": "one text"}, 422, "inputs"),
        ({"inputs": ["d"] * 10_000}, 413, "10000 sequences"),
        ({"inputs": ["attention " * 200]}, 413, "inputs[0]: 202 tokens"),
        ({"top_k": 0}, 422, "top_k"),
        ({"surprise": 1}, 422, "surprise"),
    ],
)
def test_bad_classify_requests_are_refused_naming_what(
    url: str, change: dict[str, Any], status: int, says: str
) -> None:
    body = {"model": CLASSIFIER, "inputs": TEXTS, **change}
    if not change:
        del body["model"]
    answer = post(url, body)
    assert answer.status_code == status, answer.text
    assert says in answer.json()["error"], answer.text


def test_a_long_text_is_cut_when_asked(url: str) -> None:
    answer = post(url, {"model": CLASSIFIER, "inputs": ["attention " * 200], "truncate": True})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["tokens"] == 128  # the classifier's window


def test_the_sdk_raises_the_servers_errors(url: str) -> None:
    from attnserve_client import Client, NotFoundError, UnprocessableEntityError

    with Client(url, max_retries=0) as client:
        with pytest.raises(NotFoundError):
            client.classify(TEXTS, model="no-such-model")
        with pytest.raises(UnprocessableEntityError, match="it cannot classify"):
            client.classify(TEXTS, model=EMBEDDER)


def test_open_inference_protocol_classifies_over_http_and_grpc(url: str) -> None:
    """The classifier's /v2 model: text BYTES [n] in, scores FP32 [n, labels] and labels
    BYTES [labels] out, over tritonclient's HTTP (binary and JSON) and gRPC."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    items = post(url, {"model": CLASSIFIER, "inputs": TEXTS}).json()["data"]
    want = np.array(
        [
            [dict((p["label"], p["score"]) for p in x["predictions"])[k] for k in LABELS]
            for x in items
        ]
    )
    metadata = httpx.get(f"{url}/v2/models/{CLASSIFIER}", timeout=10).json()
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert metadata["outputs"] == [
        {"name": "scores", "datatype": "FP32", "shape": [-1, len(LABELS)]},
        {"name": "labels", "datatype": "BYTES", "shape": [len(LABELS)]},
    ]
    texts = np.array([t.encode() for t in TEXTS], dtype=np.object_)
    clients = ((httpclient, url.removeprefix("http://")), (grpcclient, GRPC["address"]))
    for client_module, address in clients:
        client = client_module.InferenceServerClient(address)
        tensor = client_module.InferInput("text", [len(TEXTS)], "BYTES")
        tensor.set_data_from_numpy(texts)
        answer = client.infer(CLASSIFIER, [tensor])
        np.testing.assert_allclose(answer.as_numpy("scores"), want, atol=1e-6, rtol=0)
        assert [x.decode() for x in answer.as_numpy("labels")] == list(LABELS)
    # JSON data both ways, and one output asked for.
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS}],
        "outputs": [{"name": "labels"}],
    }
    answer = httpx.post(f"{url}/v2/models/{CLASSIFIER}/infer", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == [
        {"name": "labels", "datatype": "BYTES", "shape": [3], "data": list(LABELS)}
    ]
    body["inputs"][0]["name"] = "query"
    refused = httpx.post(f"{url}/v2/models/{CLASSIFIER}/infer", json=body, timeout=10)
    assert refused.status_code == 422 and "text" in refused.json()["error"], refused.text
