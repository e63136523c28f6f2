"""Small requests are not starved by large ones; work sure to miss its deadline is refused.

Fairness, by ordering alone (no speed asserted): with ATTNSERVE_MAX_BATCH_TOKENS=1 a
request of 10,000 one-token sequences is a job of 10,000 batches. One such request
runs; a second is queued; then a one-sequence request arrives. The batcher takes
requests that fit in one batch first and large ones a batch at a time in turn, so
the small one is answered while the first large one still has most of its batches
to run. A FIFO
of whole jobs (the old batcher) answers it only after both large ones. The large
answers, assembled from 10,000 slices, are checked against onnxruntime (tolerance
1e-5: summation order only).

The up-front refusal runs on real all-MiniLM-L6-v2: a pooled request of 2,048 texts
of ~126 tokens given a deadline of a fifth of its estimated time (the time of one
64-text part on the same server, times 32) is answered 413 at once, the estimate in
the message, instead of running to a 504; so is one of 128 such texts given 60 % of
the time the same request took whole, before any of it runs.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import running_server
from tests.service.helpers import b64_array
from tests.support.metrics import metric
from tests.support.onnx_runs import ort_encode
from tests.support.tiny import D_MODEL, MODEL
from tests.support.wait import wait_until

LARGE = 10_000  # sequences of one large request
TOKENS = 1  # tokens of each sequence, = the batch budget: one sequence per batch
ATOL = 1e-5
TIMEOUT = httpx.Timeout(120.0)


@pytest.fixture(scope="module")
def url(model_repository: Path) -> Iterator[str]:
    with running_server(
        model_repository,
        max_batch_tokens=str(TOKENS),
        max_sequences=str(LARGE),  # each large request is one job: the old FIFO took it whole
        max_pooled_sequences=str(LARGE),
    ) as base:
        yield base


def runs(url: str) -> float:
    return metric(url, "attnserve_inference_seconds_count", graph="embeddings", model=MODEL)


def pooled_body(seqs: list[np.ndarray]) -> dict[str, Any]:
    return {
        "inputs": [b64_array(s) for s in seqs],
        "pooling": "mean",
        "return_embeddings": False,
        "encoding_format": "base64",
    }


def in_background(url: str, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    answer: list[Any] = []
    thread = threading.Thread(
        target=lambda: answer.append(httpx.post(f"{url}/v1/encode", json=body, timeout=TIMEOUT))
    )
    thread.start()
    return thread, answer


def test_a_small_request_is_answered_before_the_large_one_running(
    url: str, embeddings_session: ort.InferenceSession
) -> None:
    rng = np.random.default_rng(7)
    large = [
        [rng.standard_normal((TOKENS, D_MODEL)).astype(np.float32) for _ in range(LARGE)]
        for _ in range(2)
    ]
    small = rng.standard_normal((TOKENS, D_MODEL)).astype(np.float32)
    before = runs(url)
    started = metric(url, "attnserve_queue_seconds_count")  # requests that began a run
    first, first_answer = in_background(url, pooled_body(large[0]))
    wait_until(lambda: runs(url) > before, "the first never ran", 60, interval=0.01)
    second, second_answer = in_background(url, pooled_body(large[1]))
    wait_until(  # the second is queued (the old FIFO) or has begun its turns
        lambda: (
            metric(url, "attnserve_queued_requests") >= 1
            or metric(url, "attnserve_queue_seconds_count") >= started + 2
        ),
        "the second was neither queued nor begun",
        60,
        interval=0.01,
    )
    answer = httpx.post(f"{url}/v1/encode", json=pooled_body([small]), timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    # The small request is answered while the large one that was running is not.
    assert first.is_alive()
    first.join(timeout=120)
    second.join(timeout=120)
    for seqs, got in ((large[0], first_answer[0]), (large[1], second_answer[0])):
        assert got.status_code == 200, got.text
        data = got.json()["data"]
        assert [item["index"] for item in data] == list(range(LARGE))
        vectors = np.stack(
            [np.frombuffer(base64.b64decode(d["pooled"]["data"]), "<f4") for d in data]
        )
        expected = np.stack(
            [hidden.mean(axis=0) for hidden, _ in ort_encode(embeddings_session, seqs)]
        )
        np.testing.assert_allclose(vectors, expected, rtol=0, atol=ATOL)


# One-token words of MiniLM's vocabulary: 124 of them and [CLS], [SEP] make 126 tokens.
WORDS = ("river", "bank", "money", "water", "stream", "bridge", "boat", "city", "house")


def texts(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=124)) for _ in range(count)]


def test_work_that_cannot_meet_its_deadline_is_refused_up_front(minilm_server_url: str) -> None:
    url = minilm_server_url
    start = time.monotonic()
    body = {"model": "minilm-l6", "input": texts(64, 1)}
    part = httpx.post(f"{url}/v1/embeddings", json=body, timeout=TIMEOUT)
    assert part.status_code == 200, part.text
    estimate = (time.monotonic() - start) * 2048 / 64  # the whole request, about
    before = metric(url, "attnserve_refusals_total", reason="late")
    r = httpx.post(
        f"{url}/v1/embeddings",
        json={"model": "minilm-l6", "input": texts(2048, 2)},
        headers={"X-Request-Timeout": f"{estimate / 5:.3f}"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    assert re.search(r"estimated at \d+\.\d s of inference", message), message
    assert "cannot finish within its deadline" in message, message
    assert metric(url, "attnserve_refusals_total", reason="late") == before + 1


def test_work_estimated_just_past_its_deadline_is_refused_without_running(
    minilm_server_url: str,
) -> None:
    """The same kind of request, timed whole, then sent again with a deadline of 60 % of
    that time: it cannot finish, and is refused before any of it runs. The old
    estimate (the fit of small shapes, 20-35 % low on full batches) with its 1.5x
    margin admitted it to run into a 504."""
    url = minilm_server_url
    body = {"model": "minilm-l6", "input": texts(128, 3)}  # 128 x 126 tokens: 4 batches
    start = time.monotonic()
    whole = httpx.post(f"{url}/v1/embeddings", json=body, timeout=TIMEOUT)
    assert whole.status_code == 200, whole.text
    deadline = 0.6 * (time.monotonic() - start)
    started = metric(url, "attnserve_queue_seconds_count")  # jobs that began a run
    start = time.monotonic()
    r = httpx.post(
        f"{url}/v1/embeddings",
        json={"model": "minilm-l6", "input": texts(128, 4)},  # not the cached answer
        headers={"X-Request-Timeout": f"{deadline:.3f}"},
        timeout=TIMEOUT,
    )
    refused_after = time.monotonic() - start
    assert r.status_code == 413, r.text
    assert "cannot finish within its deadline" in r.json()["error"]["message"], r.text
    assert refused_after < deadline  # refused, not run to the deadline's 504
    assert metric(url, "attnserve_queue_seconds_count") == started  # none of it ran
