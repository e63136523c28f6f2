"""Concurrency: batched requests equal their solo results; admission refuses a burst (429)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.conftest import running_server
from tests.service.helpers import TIMEOUT, as_array, b64_array, encode
from tests.support.inputs import sequences
from tests.support.metrics import metric

N_REQUESTS = 16
CONCURRENCY = 8  # in flight at once: enough to queue several requests per onnxruntime run
ATOL = 1e-5  # same graph, different batch composition and padding: float32 noise only


def _request(k: int) -> dict[str, Any]:
    """Request k: 1-2 sequences of lengths that differ per request; every 3rd wants attention."""
    lengths = (3 + 7 * k % 29,) if k % 2 else (1 + k, 2 + 5 * k % 11)
    body: dict[str, Any] = {"inputs": [s.tolist() for s in sequences(lengths, seed=100 + k)]}
    if k % 3 == 0:
        body["return_attention"] = True
    return body


def _onnxruntime_runs(url: str) -> float:
    """The count of attnserve_batch_sequences: one observation per onnxruntime run."""
    return metric(url, "attnserve_batch_sequences_count")


def test_concurrent_requests_equal_solo(http_client: httpx.Client, server_url: str) -> None:
    bodies = [_request(k) for k in range(N_REQUESTS)]
    runs_before = _onnxruntime_runs(server_url)
    solo = [encode(http_client, **body) for body in bodies]  # one at a time: nothing to batch with
    runs_solo = _onnxruntime_runs(server_url) - runs_before
    assert runs_solo == N_REQUESTS  # each small request is one run of its own

    async def all_at_once() -> list[httpx.Response]:
        gate = asyncio.Semaphore(CONCURRENCY)
        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with httpx.AsyncClient(base_url=server_url, timeout=TIMEOUT, limits=limits) as c:

            async def one(body: dict[str, Any]) -> httpx.Response:
                async with gate:
                    return await c.post("/v1/encode", json=body)

            return await asyncio.gather(*(one(b) for b in bodies))

    responses = asyncio.run(all_at_once())
    runs_together = _onnxruntime_runs(server_url) - runs_before - runs_solo
    # The batcher merged sequences of different requests into shared runs (observed:
    # 9-12 runs for the 16 requests on 2 cores).
    assert runs_together < N_REQUESTS
    for k, (r, alone, body) in enumerate(zip(responses, solo, bodies, strict=True)):
        assert r.status_code == 200, (k, r.text)
        got = r.json()
        assert got["usage"] == alone["usage"]
        assert len(got["data"]) == len(body["inputs"])
        for item, item_alone, seq in zip(got["data"], alone["data"], body["inputs"], strict=True):
            emb = as_array(item["embeddings"])
            assert emb.shape == (len(seq), len(seq[0]))
            np.testing.assert_allclose(emb, as_array(item_alone["embeddings"]), rtol=0, atol=ATOL)
            if body.get("return_attention"):
                attn = as_array(item["attention"])
                assert attn.shape[-2:] == (len(seq), len(seq))
                np.testing.assert_allclose(
                    attn, as_array(item_alone["attention"]), rtol=0, atol=ATOL
                )
            else:
                assert item["attention"] is None


def test_admission_refuses_with_429_then_recovers(model_repository: Path) -> None:
    """With room for one request in the batcher, a burst gets 429 + Retry-After, not a hang."""
    x = sequences((128,), seed=120)[0]
    body = {"inputs": [b64_array(x)] * 8, "return_attention": True, "encoding_format": "base64"}

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as c:
            return await asyncio.gather(*(c.post("/v1/encode", json=body) for _ in range(8)))

    with running_server(model_repository, max_queued_requests="1") as url:
        responses = asyncio.run(burst(url))
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 429}, statuses
        for r in responses:
            if r.status_code == 429:
                assert r.json()["error_type"] == "overloaded"
                assert int(r.headers["retry-after"]) >= 1
        again = httpx.post(f"{url}/v1/encode", json={"inputs": [x[:4].tolist()]}, timeout=TIMEOUT)
        assert again.status_code == 200, again.text
