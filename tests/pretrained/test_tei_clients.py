"""The TEI API through the clients retrieval stacks use, unchanged: Haystack's
HuggingFaceAPI embedders, LlamaIndex's TextEmbeddingsInference and LangChain's
HuggingFaceEndpointEmbeddings, against a real server.

Each gets the numbers of /v1/encode (tolerance 1e-6: one engine, the same batch),
sends its own batches (counted in /metrics), and shows our message for an empty
input, a too-long one without truncation, a wrong key and an overload. LlamaIndex
never checks the status: our error body reaches its user inside the exception its
parsing raises (pydantic shortens long ones), with no status code.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from huggingface_hub import AsyncInferenceClient, InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from tests.conftest import running_server
from tests.pretrained.test_tei import ATOL, hub_may_call_localhost, native  # noqa: F401
from tests.support.metrics import metric

TEXTS = [f"text number {i} about rivers and their banks" for i in range(40)]
LONG = "word " * 400  # 402 tokens: MiniLM takes 256
KEY = "tei-clients-key"
TEI = "text_embeddings_inference"


def posts(url: str, route: str) -> float:
    """Answered requests to ``route`` so far, from the server's own metrics."""
    return metric(url, "attnserve_requests_total", protocol="tei", route=route, status="200")


# -- the three clients, built as their docs say (docs/api.md has the same snippets) -----------


def haystack_text(url: str, token: str | None = None, **options: Any) -> Callable[[str], Any]:
    from haystack.utils import Secret
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPITextEmbedder,
    )

    secret = Secret.from_token(token) if token else None
    embedder = HuggingFaceAPITextEmbedder(
        api_type=TEI, api_params={"url": url}, token=secret, **options
    )
    return lambda text: embedder.run(text=text)["embedding"]


def llama(url: str, token: str | None = None, **options: Any) -> Any:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    # A trailing slash, as users write base URLs: LlamaIndex then posts to //embed.
    return TextEmbeddingsInference(
        model_name="minilm-l6", base_url=url + "/", auth_token=token, **options
    )


def langchain(url: str, token: str | None = None) -> Any:
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    # Its newest releases take only repo ids for `model`: the clients are set by hand.
    embeddings = HuggingFaceEndpointEmbeddings(model="minilm-l6")
    embeddings.client = InferenceClient(model=url, token=token)
    embeddings.async_client = AsyncInferenceClient(model=url, token=token)
    return embeddings


# -- values and batches ------------------------------------------------------------------------


def test_haystack_embedders_sync_and_async(minilm_server_url: str) -> None:
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
    )

    url = minilm_server_url
    # Haystack sends "normalize": false unless told otherwise: honoured.
    one = np.array(haystack_text(url)(TEXTS[0]), np.float32)
    np.testing.assert_allclose(one, native(url, TEXTS[:1], normalize=False)[0], rtol=0, atol=ATOL)
    assert abs(float(np.linalg.norm(one)) - 1.0) > 1e-3

    def documents() -> list[Document]:
        return [Document(content=text) for text in TEXTS]

    params = {"url": url}
    embedder = HuggingFaceAPIDocumentEmbedder(
        api_type=TEI, api_params=params, normalize=True, progress_bar=False
    )
    before = posts(url, "/")
    got = [d.embedding for d in embedder.run(documents=documents())["documents"]]
    assert posts(url, "/") - before == 2  # batches of 32: 32 + 8
    np.testing.assert_allclose(np.array(got, np.float32), native(url, TEXTS), rtol=0, atol=ATOL)

    async def run_async() -> list[Any]:
        embedder = HuggingFaceAPIDocumentEmbedder(
            api_type=TEI, api_params=params, normalize=True, progress_bar=False
        )
        try:
            return (await embedder.run_async(documents=documents()))["documents"]
        finally:
            await embedder.close_async()

    got = [d.embedding for d in asyncio.run(run_async())]
    np.testing.assert_allclose(np.array(got, np.float32), native(url, TEXTS), rtol=0, atol=ATOL)


def test_llamaindex_batches_of_ten_to_a_trailing_slash_url(minilm_server_url: str) -> None:
    url = minilm_server_url
    embeddings = llama(url)
    before = posts(url, "//embed")
    got = np.array(embeddings.get_text_embedding_batch(TEXTS[:12]), np.float32)
    assert posts(url, "//embed") - before == 2  # 10 + 2, to //embed (TEI answers 404)
    np.testing.assert_allclose(got, native(url, TEXTS[:12]), rtol=0, atol=ATOL)
    got = np.array(asyncio.run(embeddings.aget_text_embedding_batch(TEXTS[:12])), np.float32)
    np.testing.assert_allclose(got, native(url, TEXTS[:12]), rtol=0, atol=ATOL)


def test_langchain_sends_everything_in_one_request(minilm_server_url: str) -> None:
    url = minilm_server_url
    embeddings = langchain(url)
    many = [f"passage {i}: the river bank" for i in range(100)]
    before = posts(url, "/")
    got = np.array(embeddings.embed_documents(many), np.float32)
    assert posts(url, "/") - before == 1  # 100 texts in one request (TEI refuses > 32)
    np.testing.assert_allclose(got, native(url, many), rtol=0, atol=ATOL)

    async def run_async() -> list[list[float]]:
        async with embeddings.async_client:
            result: list[list[float]] = await embeddings.aembed_documents(TEXTS)
            return result

    got = np.array(asyncio.run(run_async()), np.float32)
    np.testing.assert_allclose(got, native(url, TEXTS), rtol=0, atol=ATOL)
    query = np.array(embeddings.embed_query(TEXTS[0]), np.float32)
    np.testing.assert_allclose(query, native(url, TEXTS[:1])[0], rtol=0, atol=ATOL)


# -- our messages, through each client -------------------------------------------------------


@pytest.fixture(scope="module")
def guarded_url(minilm_repository: Path) -> Iterator[str]:
    """A key, and one request at a time: an overload is easy to make."""
    with running_server(minilm_repository, api_key=KEY, max_queued_requests="1") as url:
        yield url


@contextlib.contextmanager
def saturated(url: str) -> Iterator[None]:
    """While a heavy request runs, admission is full (readiness says so): the next is 429."""
    heavy = {"inputs": [LONG] * 48, "truncate": True, "pooling": "mean"}
    headers = {"Authorization": f"Bearer {KEY}"}
    answer: list[int] = []
    worker = threading.Thread(
        target=lambda: answer.append(
            httpx.post(f"{url}/v1/encode", json=heavy, headers=headers, timeout=120).status_code
        )
    )
    worker.start()
    try:
        give_up = time.monotonic() + 30
        while httpx.get(f"{url}/health/ready", timeout=10).status_code == 200:
            assert worker.is_alive() and time.monotonic() < give_up, "never saturated"
            time.sleep(0.005)
        yield
    finally:
        worker.join(timeout=120)
    assert answer == [200]  # the heavy request was answered: nothing accepted is lost


def failure(call: Callable[[], Any]) -> BaseException:
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


def hub_error(exc: BaseException, status: int, *says: str) -> None:
    """Haystack and LangChain raise huggingface_hub's error: our status and message."""
    assert isinstance(exc, HfHubHTTPError), repr(exc)
    assert exc.response is not None and exc.response.status_code == status
    for words in says:
        assert words in str(exc), str(exc)


CLIENTS = ("haystack", "llamaindex", "langchain")


def caller(client_name: str, url: str, token: str | None) -> Callable[[str], Any]:
    """One text through the client named, truncation off (each client's option for it)."""
    if client_name == "haystack":
        return haystack_text(url, token, truncate=False)
    if client_name == "llamaindex":
        embeddings = llama(url, token, truncate_text=False)
        return lambda text: embeddings.get_text_embedding_batch([text])
    embeddings = langchain(url, token)
    return lambda text: embeddings.embed_documents([text])


@pytest.mark.parametrize("client_name", CLIENTS)
def test_each_client_shows_our_message(client_name: str, guarded_url: str) -> None:
    url = guarded_url
    embed = caller(client_name, url, KEY)
    cases = {  # name: (call, status, our message's words, TEI's error kind)
        "empty": (lambda: embed(""), 400, "is empty: send some text", "Empty"),
        "too long": (lambda: embed(LONG), 422, "402 tokens", "Validation"),
        "wrong key": (
            lambda: caller(client_name, url, "hf_not_ours")("hi"),
            401,
            "API key",
            "Validation",
        ),
    }
    for name, (call, status, words, kind) in cases.items():
        exc = failure(call)
        if client_name == "llamaindex":
            # No raise_for_status: our body is what its parsing chokes on, shown whole or
            # shortened in the middle (pydantic): the message's start or the kind.
            assert words in str(exc) or (kind and kind in str(exc)), (name, str(exc))
        else:
            hub_error(exc, status, words)
        assert "hf_not_ours" not in str(exc)
    with saturated(url):
        exc = failure(lambda: embed("hello"))
    if client_name == "llamaindex":
        assert "Overloaded" in str(exc), str(exc)
    else:
        hub_error(exc, 429, "the server is at capacity")
        assert exc.response is not None and int(exc.response.headers["retry-after"]) >= 1
