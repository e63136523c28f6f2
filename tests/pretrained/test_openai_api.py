"""The OpenAI embeddings API, driven by the official ``openai`` client and LangChain.

Real all-MiniLM-L6-v2 servers on 127.0.0.1. Tolerances: vectors equal the
native ``/v1/encode`` (pooling mean, normalize) within 1e-6 (the same graphs
and arithmetic; base64 is bit-exact float32) and the transformers reference
within 1e-4.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import httpx
import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings

from model_export.manifest import Manifest
from service.protocols.wire import DECODED_PER_BYTE, DECODED_PER_VALUE
from tests.conftest import running_server
from tests.pretrained.reference import SENTENCES, Reference

MODEL = "minilm-l6"
NATIVE_ATOL = 1e-6
REFERENCE_ATOL = 1e-4
MATRYOSHKA = (384, 256, 128)
# The matryoshka server's memory budget for requests in progress (the least allowed).
BUDGET = 16 * 1024 * 1024


def native_vectors(url: str, texts: list[str], *, normalize: bool = True) -> np.ndarray:
    body = {"inputs": texts, "pooling": "mean", "normalize": normalize}
    r = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([item["pooled"] for item in r.json()["data"]], dtype=np.float32)


def vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    """The vectors, decoding base64 ones (the client leaves them as sent when asked for them)."""
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array(
        [
            np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
            if isinstance(d.embedding, str)
            else d.embedding
            for d in response.data
        ],
        dtype=np.float32,
    )


@pytest.fixture(scope="module")
def openai_client(minilm_server_url: str) -> Iterator[openai.OpenAI]:
    # Any key works against a server without keys; the client refuses to start without one.
    with openai.OpenAI(base_url=f"{minilm_server_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def matryoshka_url(
    tmp_path_factory: pytest.TempPathFactory, minilm_repository: Path
) -> Iterator[str]:
    """MiniLM whose manifest declares Matryoshka dimensions, on a server that truncates texts.

    (MiniLM was not trained for it; the test checks the arithmetic, not the quality.)
    """
    repo = tmp_path_factory.mktemp("matryoshka-models")
    shutil.copytree(minilm_repository / MODEL, repo / MODEL)
    manifest = Manifest.read(repo / MODEL)
    dataclasses.replace(manifest, matryoshka_dimensions=MATRYOSHKA).write(repo / MODEL)
    with running_server(repo, openai_truncate="true", max_inflight_bytes=str(BUDGET)) as url:
        yield url


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_embeddings_equal_encode_and_transformers(
    openai_client: openai.OpenAI,
    minilm_server_url: str,
    reference: Reference,
    encoding_format: Literal["float", "base64"] | None,
) -> None:
    """None: the client's default, which asks for base64 and decodes it itself."""
    if encoding_format is None:
        response = openai_client.embeddings.create(model=MODEL, input=SENTENCES)
        assert isinstance(response.data[0].embedding, list)
    else:
        response = openai_client.embeddings.create(
            model=MODEL, input=SENTENCES, encoding_format=encoding_format
        )
        assert isinstance(response.data[0].embedding, str if encoding_format == "base64" else list)
    got = vectors(response)
    assert got.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(
        got, native_vectors(minilm_server_url, SENTENCES), rtol=0, atol=NATIVE_ATOL
    )
    np.testing.assert_allclose(got, reference.sentence, rtol=0, atol=REFERENCE_ATOL)
    assert response.model == MODEL and response.object == "list"
    tokens = sum(reference.lengths)
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (tokens, tokens)


def test_json_floats_parse_to_the_base64_float32_bits(minilm_server_url: str) -> None:
    """A client parsing the JSON numbers (any JSON parser: the text is float32's shortest
    form) gets, rounded to float32, exactly the bits base64 sends for the same request."""

    def answer(encoding_format: str) -> list[dict[str, object]]:
        body = {"model": MODEL, "input": SENTENCES, "encoding_format": encoding_format}
        r = httpx.post(f"{minilm_server_url}/v1/embeddings", json=body, timeout=60)
        assert r.status_code == 200, r.text
        data: list[dict[str, object]] = r.json()["data"]
        return data

    parsed = np.array([d["embedding"] for d in answer("float")], dtype=np.float32)
    sent = np.array(
        [np.frombuffer(base64.b64decode(str(d["embedding"])), "<f4") for d in answer("base64")]
    )
    assert parsed.shape == sent.shape == (len(SENTENCES), 384)
    np.testing.assert_array_equal(parsed.view(np.uint32), sent.view(np.uint32))


def test_one_string_input(openai_client: openai.OpenAI, reference: Reference) -> None:
    got = vectors(openai_client.embeddings.create(model=MODEL, input=SENTENCES[1]))
    np.testing.assert_allclose(got[0], reference.sentence[1], rtol=0, atol=REFERENCE_ATOL)


def test_async_client(minilm_server_url: str, reference: Reference) -> None:
    async def main() -> np.ndarray:
        async with openai.AsyncOpenAI(
            base_url=f"{minilm_server_url}/v1", api_key="unused", max_retries=0
        ) as c:
            responses = await asyncio.gather(
                *(c.embeddings.create(model=MODEL, input=[s]) for s in SENTENCES)
            )
        return np.concatenate([vectors(r) for r in responses])

    got = asyncio.run(main())
    np.testing.assert_allclose(got, reference.sentence, rtol=0, atol=REFERENCE_ATOL)


def test_token_id_input_equals_text_input(
    openai_client: openai.OpenAI, reference: Reference
) -> None:
    """Ids of the model's own tokenizer ([CLS] ... [SEP] included) give the text's vector."""
    ids = [reference.ids[i, :n].tolist() for i, n in enumerate(reference.lengths)]
    text_vectors = vectors(openai_client.embeddings.create(model=MODEL, input=SENTENCES))
    many = vectors(openai_client.embeddings.create(model=MODEL, input=ids))
    np.testing.assert_allclose(many, text_vectors, rtol=0, atol=NATIVE_ATOL)
    one = vectors(openai_client.embeddings.create(model=MODEL, input=ids[0]))
    np.testing.assert_allclose(one[0], text_vectors[0], rtol=0, atol=NATIVE_ATOL)


def test_models_list_and_retrieve(openai_client: openai.OpenAI) -> None:
    models = list(openai_client.models.list())
    assert [m.id for m in models] == [MODEL]
    card = openai_client.models.retrieve(MODEL)
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "attnserve")
    assert card.created > 1_600_000_000


def test_langchain_openai_embeddings(minilm_server_url: str, reference: Reference) -> None:
    embeddings = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{minilm_server_url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,  # else LangChain sends tiktoken ids (see docs/api.md)
        max_retries=0,
    )
    documents = np.array(embeddings.embed_documents(SENTENCES), dtype=np.float32)
    np.testing.assert_allclose(documents, reference.sentence, rtol=0, atol=REFERENCE_ATOL)
    np.testing.assert_allclose(
        documents, native_vectors(minilm_server_url, SENTENCES), rtol=0, atol=NATIVE_ATOL
    )
    query = np.array(embeddings.embed_query(SENTENCES[0]), dtype=np.float32)
    np.testing.assert_allclose(query, documents[0], rtol=0, atol=NATIVE_ATOL)


BAD_REQUESTS = [
    # (kwargs, param, code, words in the message)
    ({"input": ""}, "input[0]", "invalid_input", "empty"),
    ({"input": ["fine", ""]}, "input[1]", "invalid_input", "empty"),
    ({"input": [[101, 30522, 102]]}, "input[0]", "invalid_input", "30522"),
    ({"input": [[101, -1, 102]]}, "input[0]", "invalid_input", "-1"),
    ({"input": [[]]}, "input[0]", "invalid_input", "no token ids"),
    ({"input": [101, "x"]}, "input[0]", "invalid_input", "integers"),
    ({"input": [{"a": 1}]}, "input[0]", "invalid_input", "text"),
    ({"input": []}, "input", "invalid_input", "empty"),
    ({"input": "hi", "dimensions": 128}, "dimensions", "invalid_input", "matryoshka"),
    ({"input": "hi", "encoding_format": "npy"}, "encoding_format", "invalid_input", "base64"),
    ({"input": "word " * 300}, "input[0]", "context_length_exceeded", "302 tokens"),
]


@pytest.mark.parametrize(
    ("kwargs", "param", "code", "says"), BAD_REQUESTS, ids=[b[1] + "-" + b[3] for b in BAD_REQUESTS]
)
def test_bad_requests_raise_bad_request_error(
    openai_client: openai.OpenAI, kwargs: dict[str, object], param: str, code: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.embeddings.create(model=MODEL, **kwargs)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict), error
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert says.lower() in error["message"].lower(), error["message"]
    # ... and the next good request is answered.
    assert len(openai_client.embeddings.create(model=MODEL, input="ok").data) == 1


def test_unknown_model_raises_not_found(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("text-embedding-3-small")


def test_too_many_inputs_is_413(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:  # ATTNSERVE_MAX_POOLED_SEQUENCES
        openai_client.embeddings.create(model=MODEL, input=["hi"] * 2049)
    assert caught.value.status_code == 413
    assert "2049 sequences in one request; the limit is 2048" in caught.value.message


def test_api_key_raises_authentication_error(minilm_repository: Path) -> None:
    with running_server(minilm_repository, api_key="s3cret") as url:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError) as caught:
                c.embeddings.create(model=MODEL, input="hi")
            assert caught.value.body["code"] == "invalid_api_key"  # type: ignore[index]
        with openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0) as c:
            assert len(c.embeddings.create(model=MODEL, input="hi").data) == 1


def test_dimensions_shorten_and_renormalise(matryoshka_url: str) -> None:
    full = native_vectors(matryoshka_url, SENTENCES, normalize=False)
    with openai.OpenAI(base_url=f"{matryoshka_url}/v1", api_key="x", max_retries=0) as c:
        for dims in MATRYOSHKA:
            got = vectors(c.embeddings.create(model=MODEL, input=SENTENCES, dimensions=dims))
            want = full[:, :dims] / np.linalg.norm(full[:, :dims], axis=1, keepdims=True)
            assert got.shape == (len(SENTENCES), dims)
            np.testing.assert_allclose(got, want, rtol=0, atol=NATIVE_ATOL)
        with pytest.raises(openai.BadRequestError, match="384, 256, 128"):
            c.embeddings.create(model=MODEL, input="hi", dimensions=100)


def test_truncation_when_configured(matryoshka_url: str) -> None:
    with openai.OpenAI(base_url=f"{matryoshka_url}/v1", api_key="x", max_retries=0) as c:
        response = c.embeddings.create(model=MODEL, input="word " * 300)
    assert response.usage.prompt_tokens == 256  # the model's max_seq_len


def test_overload_raises_rate_limit_error_with_retry_after(matryoshka_url: str) -> None:
    """Part of a longer body whose parse cost (wire.JsonCost) is all of the memory budget
    is held while the rest is awaited, so the next request is a 429."""
    parts = urlsplit(matryoshka_url)
    spaces = (BUDGET - DECODED_PER_VALUE) // DECODED_PER_BYTE  # no commas: one value at most
    with socket.create_connection((parts.hostname, parts.port)) as held:
        held.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {spaces + 1}\r\n\r\n".encode()
            + b" " * spaces
        )
        with openai.OpenAI(base_url=f"{matryoshka_url}/v1", api_key="x", max_retries=0) as c:
            for _ in range(50):  # until the held request has been admitted
                try:
                    c.embeddings.create(model=MODEL, input="hi")
                except openai.RateLimitError as exc:
                    assert exc.response.headers["retry-after"].isdigit()
                    assert exc.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
                    break
            else:
                pytest.fail("no 429 while the whole memory budget was held")


def test_the_openai_client_sends_1500_inputs_in_one_call(minilm_repository: Path) -> None:
    """OpenAI accepts 2,048 inputs and LangChain sends 1,000: 1,500 texts in one call come
    back in order, under a memory budget (64 MiB) that holds the request's tokenizing at
    its worst case (a token per character: ~42 MB, held for the request's life, as a
    ticket only grows) but not its hidden states at once beside it (~1,500 × 12 tokens
    × 384 floats × 2 ≈ 55 MB): the request runs in parts of 64 and holds two at a time.
    Spot checks against single calls: cosine ≥ 1 - 1e-6."""
    words = ("rivers", "engines", "attention", "gardens", "markets", "music", "trains")
    texts = [
        f"this is sentence number {i} of a long list, about {words[i % 7]} and {words[i % 5]}"
        for i in range(1500)
    ]
    budget = str(64 * 2**20)
    with (
        running_server(minilm_repository, max_inflight_bytes=budget) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client,
    ):
        answer = client.embeddings.create(model="minilm-l6", input=texts)
        assert [d.index for d in answer.data] == list(range(1500))
        for i in (0, 777, 1499):
            single = client.embeddings.create(model="minilm-l6", input=[texts[i]])
            a = np.asarray(answer.data[i].embedding)
            b = np.asarray(single.data[0].embedding)
            assert float(a @ b) >= 1 - 1e-6, i
    assert answer.usage.prompt_tokens > 16384  # beyond ATTNSERVE_MAX_TOKENS: the pooled limit
