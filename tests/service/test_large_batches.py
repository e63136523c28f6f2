"""Requests of more than ATTNSERVE_MAX_SEQUENCES that ask only for pooled vectors.

Up to ATTNSERVE_MAX_POOLED_SEQUENCES (2,048) inputs run in parts of 64, in order,
on every protocol; a request whose answer is per token keeps the 64 limit, and
every limit answers 413 before any work. Vectors are compared with one
onnxruntime run of the same sequences, masked-mean pooled (tolerance 1e-5: the
server batches them differently, which changes float summation order only).
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from model_export import graph_io
from tests.service.helpers import TIMEOUT, b64_array
from tests.support.metrics import metric
from tests.support.onnx_runs import ort_encode
from tests.support.tiny import D_MODEL, MODEL

ATOL = 1e-5


def many(count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((int(n), D_MODEL)).astype(np.float32)
        for n in rng.integers(1, 9, size=count)
    ]


def mean_pooled(session: ort.InferenceSession, seqs: list[np.ndarray]) -> np.ndarray:
    return np.stack([hidden.mean(axis=0) for hidden, _ in ort_encode(session, seqs)])


def decode(item: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(item["data"]), "<f4").reshape(item["shape"])


def test_a_thousand_pooled_inputs_come_back_in_order(
    server_url: str, embeddings_session: ort.InferenceSession
) -> None:
    seqs = many(1000, seed=1)
    body = {
        "inputs": [b64_array(s) for s in seqs],
        "pooling": "mean",
        "return_embeddings": False,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server_url}/v1/encode", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text[:300]
    data = r.json()["data"]
    assert [item["index"] for item in data] == list(range(1000))
    assert r.json()["usage"]["tokens"] == sum(len(s) for s in seqs)
    got = np.stack([decode(item["pooled"]) for item in data])
    np.testing.assert_allclose(got, mean_pooled(embeddings_session, seqs), rtol=0, atol=ATOL)


def test_pooled_text_of_the_open_inference_protocol_too(
    server_url: str, embeddings_session: ort.InferenceSession
) -> None:
    """A [300, 8, d] tensor asking only for 'pooled' (the /v2 way): 300 vectors."""
    rng = np.random.default_rng(2)
    embeds = rng.standard_normal((300, 8, D_MODEL)).astype(np.float32)
    client = triton.InferenceServerClient(server_url.removeprefix("http://"))
    tensor = triton.InferInput(graph_io.INPUT_EMBEDS, list(embeds.shape), "FP32")
    tensor.set_data_from_numpy(embeds, binary_data=True)
    result = client.infer(
        MODEL,
        [tensor],
        outputs=[triton.InferRequestedOutput("pooled", binary_data=True)],
        parameters={"pooling": "mean"},
    )
    client.close()
    want = mean_pooled(embeddings_session, list(embeds))
    np.testing.assert_allclose(result.as_numpy("pooled"), want, rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    ("count", "options", "says"),
    [
        (65, {"pooling": "mean", "return_embeddings": True}, "limit is 64 (2048 when only pooled"),
        (65, {"return_attention": True, "return_embeddings": False}, "the limit is 64"),
        (2049, {"pooling": "mean", "return_embeddings": False}, "the limit is 2048"),
    ],
)
def test_limits_still_answer_413_before_any_work(
    server_url: str, count: int, options: dict[str, Any], says: str
) -> None:
    body = {"inputs": [[[0.0] * D_MODEL]] * count, **options}
    runs = "attnserve_inference_seconds_count"
    before = metric(server_url, runs)
    r = httpx.post(f"{server_url}/v1/encode", json=body, timeout=TIMEOUT)
    assert r.status_code == 413, r.text[:300]
    assert says in r.json()["error"]
    assert metric(server_url, runs) == before  # no run was made for it
