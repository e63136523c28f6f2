"""The TEI-compatible API through huggingface_hub's InferenceClient (sync and async) and
raw HTTP: the same numbers as /v1/encode with the model's pooling (tolerance 1e-6:
one engine, the same batch), TEI's shapes, statuses and error bodies."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from huggingface_hub import AsyncInferenceClient, InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from tests.conftest import running_server, server_process

TEXTS = ["A man is playing a guitar.", "Stock markets fell sharply.", "Hi!"]


@pytest.fixture(autouse=True)
def hub_may_call_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pretrained tests keep the Hugging Face hub offline (HF_HUB_OFFLINE=1, so no
    weights are fetched); huggingface_hub applies that to every URL, 127.0.0.1 too.
    These clients only talk to the local server."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


ATOL = 1e-6


def native(url: str, texts: list[str], normalize: bool = True, **extra: object) -> np.ndarray:
    body = {"inputs": texts, "pooling": "mean", "normalize": normalize, **extra}  # MiniLM's
    r = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([item["pooled"] for item in r.json()["data"]], dtype=np.float32)


@pytest.fixture(scope="module")
def hub(minilm_server_url: str) -> Iterator[InferenceClient]:
    yield InferenceClient(model=minilm_server_url, token=None)


def test_feature_extraction_string_and_list_equal_native(
    hub: InferenceClient, minilm_server_url: str
) -> None:
    one = hub.feature_extraction(TEXTS[0])
    assert one.shape == (1, 384) and one.dtype == np.float32  # 2-D even for one string
    np.testing.assert_allclose(one, native(minilm_server_url, TEXTS[:1]), rtol=0, atol=ATOL)
    many = hub.feature_extraction(TEXTS)  # type: ignore[arg-type]
    np.testing.assert_allclose(many, native(minilm_server_url, TEXTS), rtol=0, atol=ATOL)
    raw = hub.feature_extraction(TEXTS, normalize=False)  # type: ignore[arg-type]
    np.testing.assert_allclose(
        raw, native(minilm_server_url, TEXTS, normalize=False), rtol=0, atol=ATOL
    )
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_async_client_and_truncation(minilm_server_url: str) -> None:
    long_text = "word " * 400

    async def run() -> np.ndarray:
        async with AsyncInferenceClient(model=minilm_server_url, token=None) as client:
            return await client.feature_extraction(long_text, truncate=True)

    cut = asyncio.run(run())
    want = native(minilm_server_url, [long_text], truncate=True)
    np.testing.assert_allclose(cut, want, rtol=0, atol=ATOL)


def test_errors_surface_our_messages(hub: InferenceClient) -> None:
    with pytest.raises(HfHubHTTPError) as caught:
        hub.feature_extraction("word " * 400)  # too long, no truncation
    assert caught.value.response.status_code == 422
    assert caught.value.response.json()["error_type"] == "Validation"
    assert "256" in str(caught.value.response.json()["error"])
    with pytest.raises(HfHubHTTPError) as caught:
        hub.feature_extraction("")
    assert caught.value.response.status_code == 400
    assert caught.value.response.json() == {"error": "inputs[0]: is empty: send some text",
                                             "error_type": "Empty"}  # fmt: skip


def test_a_key_is_required_and_never_echoed(minilm_repository: Path) -> None:
    with running_server(minilm_repository, api_key="tei-key") as url:
        with pytest.raises(HfHubHTTPError) as caught:
            InferenceClient(model=url, token="hf_someone_elses_token").feature_extraction("hi")
        assert caught.value.response.status_code == 401
        assert "hf_someone_elses_token" not in caught.value.response.text
        vector = InferenceClient(model=url, token="tei-key").feature_extraction("hi")
        assert vector.shape == (1, 384)
        assert httpx.get(f"{url}/health").status_code == 200  # probes stay open


def test_authorization_values_never_reach_logs_metrics_or_errors(minilm_repository: Path) -> None:
    """Clients send tokens meant for other services (huggingface_hub sends the user's own
    Hugging Face token to any URL): a wrong one and the right one, on every kind of
    answer (401, 200, 422, 404), must appear in no log line (debug, JSON, access
    lines), metric label or body."""
    foreign, ours = "hf_SECRETforeigntoken123", "SECRETourkey456"
    with server_process(
        minilm_repository, api_key=ours, log_level="debug", log_format="json"
    ) as server:
        url = server.url
        for token in (foreign, ours):
            headers = {"Authorization": f"Bearer {token}", "x-request-id": "audit"}
            answers = [
                httpx.post(f"{url}/embed", json={"inputs": "hi"}, headers=headers, timeout=60),
                httpx.post(f"{url}/embed", json={"inputs": "word " * 400}, headers=headers),
                httpx.post(f"{url}/nowhere", json={}, headers=headers),
                httpx.post(f"{url}/v1/encode", json={"inputs": 1}, headers=headers),
            ]
            for answer in answers:
                assert token not in answer.text and token not in str(answer.headers)
        assert [a.status_code for a in answers] == [200, 422, 404, 422]  # the right key's
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        log = server.log()
    assert '"audit"' in log  # the requests were logged, with their request id
    for token in (foreign, ours):
        assert token not in log and token not in metrics


def test_routes_in_teis_shapes(minilm_server_url: str) -> None:
    url = minilm_server_url
    want = native(url, TEXTS)
    for path in ("/embed", "//embed", "/embed/"):
        r = httpx.post(f"{url}{path}", json={"inputs": TEXTS, "unknown": 1}, timeout=60)
        assert r.status_code == 200, (path, r.text)
        np.testing.assert_allclose(np.array(r.json(), np.float32), want, rtol=0, atol=ATOL)
    info = httpx.get(f"{url}/info").json()
    assert info["model_id"] == "minilm-l6" and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_client_batch_size"] == 2048
    assert httpx.get(f"{url}/health").status_code == 200
    r = httpx.post(f"{url}/embed_all", json={"inputs": "Hi!"}, timeout=60)
    tokens = np.array(r.json()[0], np.float32)
    assert tokens.shape == (4, 384)  # [CLS] hi ! [SEP]
    r = httpx.post(f"{url}/embed_sparse", json={"inputs": ["The lighthouse runners"]}, timeout=60)
    (sparse,) = r.json()
    assert sparse and all(set(entry) == {"index", "value"} for entry in sparse)
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}}
    scores = httpx.post(f"{url}/similarity", json=body, timeout=60).json()
    np.testing.assert_allclose(scores, want @ want[0], rtol=0, atol=1e-5)
    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    r = httpx.post(f"{url}/embed", json={"inputs": []}, timeout=60)
    assert (r.status_code, r.json()["error_type"]) == (400, "Empty")
    for empty, where in (
        ({"source_sentence": "", "sentences": ["a"]}, "inputs.source_sentence"),
        ({"source_sentence": "a", "sentences": ["b", ""]}, "inputs.sentences[1]"),
    ):  # as every other TEI route: 400 Empty, not the special tokens' vector
        r = httpx.post(f"{url}/similarity", json={"inputs": empty}, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error_type"] == "Empty" and r.json()["error"].startswith(where), r.text
    r = httpx.post(f"{url}/embed", json={"inputs": "x", "prompt_name": "query"}, timeout=60)
    assert (r.status_code, r.json()["error_type"]) == (422, "Validation")


def test_tokenize_and_decode(minilm_server_url: str) -> None:
    url = minilm_server_url
    text = "Héllo, wörld!"
    r = httpx.post(f"{url}/tokenize", json={"inputs": text}, timeout=60)
    assert r.status_code == 200, r.text
    (tokens,) = r.json()  # always nested, even for one string
    ours = httpx.post(f"{url}/v1/tokenize", json={"text": [text]}, timeout=60).json()
    assert [t["id"] for t in tokens] == ours["data"][0]["ids"]
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1]["special"] and tokens[-1]["text"] == "[SEP]"
    for token in tokens[1:-1]:  # character offsets: each token's text is its slice
        assert not token["special"]
        assert token["text"] == text[token["start"] : token["stop"]]
    assert "".join(t["text"] for t in tokens[1:-1]) == text.replace(" ", "")
    bare = httpx.post(
        f"{url}/tokenize", json={"inputs": [text, "Hi!"], "add_special_tokens": False}, timeout=60
    ).json()
    assert len(bare) == 2 and bare[0] == tokens[1:-1]
    ids = [t["id"] for t in tokens]
    decoded = httpx.post(f"{url}/decode", json={"ids": ids}, timeout=60).json()
    assert decoded == ["hello, world!"]  # MiniLM's tokenizer is uncased and strips accents
    both = httpx.post(
        f"{url}/decode", json={"ids": [ids, ids[:2]], "skip_special_tokens": False}, timeout=60
    ).json()
    assert both == ["[CLS] hello, world! [SEP]", "[CLS] hello"]
    r = httpx.post(f"{url}/decode", json={"ids": [[1, 10**6]]}, timeout=60)
    assert (r.status_code, r.json()["error_type"]) == (422, "Validation")
    assert "outside the vocabulary" in r.json()["error"]
    r = httpx.post(f"{url}/tokenize", json={"inputs": []}, timeout=60)
    assert (r.status_code, r.json()["error_type"]) == (400, "Empty")


def test_sagemaker_routes_and_timing_headers(minilm_server_url: str) -> None:
    url = minilm_server_url
    assert httpx.get(f"{url}/ping").status_code == 200
    r = httpx.post(f"{url}/invocations", json={"inputs": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json(), np.float32), native(url, TEXTS), atol=ATOL)
    # TEI's headers, in its units: whole milliseconds, token and character counts.
    for name in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert r.headers[name].isdigit(), (name, r.headers[name])
    assert r.headers["x-compute-time"] == r.headers["x-total-time"]
    assert int(r.headers["x-total-time"]) >= int(r.headers["x-inference-time"])
    tokenized = httpx.post(f"{url}/v1/tokenize", json={"text": TEXTS}, timeout=60).json()
    tokens = sum(len(item["ids"]) for item in tokenized["data"])
    assert int(r.headers["x-compute-tokens"]) == tokens
    assert int(r.headers["x-compute-characters"]) == sum(len(t) for t in TEXTS)
    assert r.headers.get_list("x-queue-time") == [r.headers["x-queue-time"]]  # one, TEI's
    sparse = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS}, timeout=60)
    assert int(sparse.headers["x-compute-tokens"]) == tokens
    # The other protocols keep their seconds.
    native_answer = httpx.post(f"{url}/v1/encode", json={"inputs": TEXTS}, timeout=60)
    assert "." in native_answer.headers["x-queue-time"]
