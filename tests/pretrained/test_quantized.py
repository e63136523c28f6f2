"""Quantized sentence embeddings, against sentence-transformers' quantize_embeddings.

The real all-MiniLM-L6-v2, exported by the CLI (which records each dimension's range
over its own calibration sentences) and served. The reference is
``sentence_transformers.util.quantization.quantize_embeddings`` applied to the server's own
float answer for the same held-out texts, with the same ranges: every type equal
exactly (the same float32 arithmetic on the same float32 vectors: 0 of the 1,920
int8/uint8 values differ; a value could only move one step, where rounding crossed a
step boundary, and none does).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from tests.conftest import running_server

# Held out: not the exporter's calibration sentences (model_export.quantize_sentences).
TEXTS = [
    "How do I reset my password?",
    "Attention maps show which tokens a model reads together.",
    "Der Zug nach Berlin fährt um acht Uhr.",
    "A short one.",
    "Quantized vectors take four to thirty-two times less space in a vector database.",
]


@pytest.fixture(scope="module")
def url(minilm_repository: Path) -> Iterator[str]:
    with running_server(minilm_repository, response_cache_bytes="8000000") as base:
        yield base


@pytest.fixture(scope="module")
def ranges(minilm_repository: Path) -> np.ndarray:
    manifest = json.loads((minilm_repository / "minilm-l6" / "config.json").read_text())
    return np.asarray(manifest["quantization_ranges"], dtype=np.float32)


def embeddings(url: str, **extra: Any) -> httpx.Response:
    body = {"model": "minilm-l6", "input": TEXTS, **extra}
    return httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)


def vectors(answer: httpx.Response) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    return np.asarray([item["embedding"] for item in answer.json()["data"]])


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_quantized_embeddings_equal_sentence_transformers(
    url: str, ranges: np.ndarray, precision: str
) -> None:
    floats = vectors(embeddings(url)).astype(np.float32)
    want = quantize_embeddings(floats, precision=precision, ranges=ranges)
    got = vectors(embeddings(url, embedding_type=precision))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_caller_ranges_and_base64_bytes(url: str) -> None:
    """The caller's ranges; base64 carries the raw int8 bytes (OpenAI's string)."""
    floats = vectors(embeddings(url)).astype(np.float32)
    mine = np.stack([floats.min(axis=0), floats.max(axis=0)])
    want = quantize_embeddings(floats, precision="int8", ranges=mine)
    extra = {"embedding_type": "int8", "quantization_ranges": mine.tolist()}
    got = vectors(embeddings(url, **extra))
    np.testing.assert_array_equal(got, want)
    encoded = embeddings(url, encoding_format="base64", **extra).json()["data"]
    raw = [np.frombuffer(base64.b64decode(i["embedding"]), dtype=np.int8) for i in encoded]
    np.testing.assert_array_equal(np.stack(raw), got)


def test_native_and_tei_answer_the_same_quantized_vectors(url: str) -> None:
    openai = vectors(embeddings(url, embedding_type="ubinary"))
    native = httpx.post(
        f"{url}/v1/encode",
        json={
            "model": "minilm-l6",
            "inputs": TEXTS,
            "pooling": "mean",
            "normalize": True,
            "embedding_type": "ubinary",
            "encoding_format": "base64",
        },
        timeout=60,
    ).json()["data"]
    for item, row in zip(native, openai, strict=True):
        pooled = item["pooled"]
        assert pooled["dtype"] == "uint8" and pooled["shape"] == [48]
        got = np.frombuffer(base64.b64decode(pooled["data"]), np.uint8)
        np.testing.assert_array_equal(got, row)
    tei = httpx.post(
        f"{url}/embed", json={"inputs": TEXTS, "embedding_type": "ubinary"}, timeout=60
    )
    np.testing.assert_array_equal(np.asarray(tei.json()), openai)


def test_the_response_cache_keeps_float_and_quantized_apart(url: str) -> None:
    """The same texts asked as float, then int8, then float again: three answers of
    their own kind (the cache key holds the embedding type)."""
    first = embeddings(url).json()["data"][0]["embedding"]
    quantized = embeddings(url, embedding_type="int8").json()["data"][0]["embedding"]
    again = embeddings(url).json()["data"][0]["embedding"]
    assert all(isinstance(v, int) for v in quantized)
    assert any(isinstance(v, float) and not v.is_integer() for v in first) and again == first


def test_the_sdk_returns_the_dtype(url: str, ranges: np.ndarray) -> None:
    from attnserve_client import Client

    with Client(url) as client:
        floats = client.encode(TEXTS, model="minilm-l6", pooling="mean", normalize=True)
        packed = client.encode(
            TEXTS, model="minilm-l6", pooling="mean", normalize=True, embedding_type="binary"
        )
        small = client.encode(
            TEXTS, model="minilm-l6", pooling="mean", normalize=True, embedding_type="uint8"
        )
    assert packed.stack("pooled").dtype == np.int8 and packed.stack("pooled").shape == (5, 48)
    want = quantize_embeddings(floats.stack("pooled"), precision="binary")
    np.testing.assert_array_equal(packed.stack("pooled"), want)
    assert small.stack("pooled").dtype == np.uint8


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"embedding_type": "int4"}, "embedding_type"),
        ({"embedding_type": "int8", "quantization_ranges": [[0.0] * 3, [1.0] * 3]}, "384"),
        ({"embedding_type": "int8", "quantization_ranges": [[1.0] * 384, [0.0] * 384]}, "max"),
        ({"embedding_type": "int8", "quantization_ranges": [[0.0] * 384]}, "quantization_ranges"),
        ({"embedding_type": "int8", "quantization_ranges": [["NaN"] * 384] * 2}, "quantization"),
        ({"embedding_type": "binary", "quantization_ranges": [[0.0], [1.0]]}, "int8 and uint8"),
    ],
)
def test_bad_quantization_requests_are_refused_naming_the_field(
    url: str, extra: dict[str, Any], field: str
) -> None:
    answer = embeddings(url, **extra)  # OpenAI's protocol: 400 invalid_request_error
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        # the model's ranges are of its own vectors: mean pooling, normalised
        ({"pooling": "cls", "normalize": True}, "quantization_ranges: is needed for int8"),
        ({"pooling": "mean", "normalize": False}, "quantization_ranges: is needed for int8"),
        ({"pooling": "none"}, "embedding_type: quantizes pooled vectors"),
    ],
)
def test_the_models_ranges_serve_only_its_own_vectors(
    url: str, extra: dict[str, Any], says: str
) -> None:
    body = {"model": "minilm-l6", "inputs": TEXTS, "embedding_type": "int8", **extra}
    answer = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith(says), answer.text


def test_open_inference_protocol_answers_quantized_pooled_vectors(url: str) -> None:
    """parameters.embedding_type: the pooled output as INT8 (UINT8 for ubinary), the
    same integers as /v1/embeddings."""
    want = vectors(embeddings(url, embedding_type="int8"))
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}],
        "outputs": [{"name": "pooled"}],
        "parameters": {"pooling": "mean", "normalize": True, "embedding_type": "int8"},
    }
    answer = httpx.post(f"{url}/v2/models/minilm-l6/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    (pooled,) = answer.json()["outputs"]
    assert pooled["datatype"] == "INT8" and pooled["shape"] == [len(TEXTS), 384]
    np.testing.assert_array_equal(np.asarray(pooled["data"]).reshape(len(TEXTS), 384), want)
