"""The response cache (ATTNSERVE_RESPONSE_CACHE_BYTES) on a real server: a hit is the
first answer bit for bit, every option that changes an answer changes the key, its
bytes stay within the bound under a flood of distinct inputs, identical requests in
flight run once, and a model swap drops the old version's answers."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import running_server, server_process
from tests.service.helpers import D_MODEL
from tests.service.raw_http import metric
from tests.service.test_model_control import exports, hidden_of, infer, repository  # noqa: F401

BOUND = 1024 * 1024


@pytest.fixture(scope="module")
def cached_url(model_repository: Path) -> Iterator[str]:
    with running_server(model_repository, response_cache_bytes=str(BOUND)) as url:
        yield url


def body(seed: int, **options: object) -> dict[str, object]:
    rows = np.random.default_rng(seed).standard_normal((1, 24, D_MODEL)).astype(np.float32)
    return {"inputs": rows.tolist(), "return_attention": True, **options}


def encode(url: str, payload: dict[str, object]) -> httpx.Response:
    answer = httpx.post(f"{url}/v1/encode", json=payload, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer


def test_a_hit_is_the_first_answer_bit_for_bit(cached_url: str) -> None:
    first = encode(cached_url, body(1))
    again = encode(cached_url, body(1))
    assert (first.headers["x-cache"], again.headers["x-cache"]) == ("miss", "hit")
    assert again.content == first.content
    # The /v2 protocol asks other outputs: its own key, then its own hits.
    rows = np.asarray(body(1)["inputs"], np.float32)
    v2 = {"inputs": [{"name": "inputs_embeds", "datatype": "FP32", "shape": list(rows.shape),
                      "data": rows.ravel().tolist()}]}  # fmt: skip
    answers = [httpx.post(f"{cached_url}/v2/models/tiny/infer", json=v2) for _ in range(2)]
    assert [a.headers["x-cache"] for a in answers] == ["miss", "hit"]
    assert answers[0].content == answers[1].content


@pytest.mark.parametrize(
    "changed",
    [
        {"pooling": "mean"},
        {"return_attention": False},
        {"attention": {"layers": [0]}},
        {"encoding_format": "base64"},
        {"normalize": True, "pooling": "cls"},
    ],
    ids=str,
)
def test_every_option_that_changes_the_answer_misses(
    cached_url: str, changed: dict[str, object]
) -> None:
    seed = 100 + len(str(changed))
    encode(cached_url, body(seed))
    assert encode(cached_url, body(seed, **changed)).headers["x-cache"] == "miss"
    assert encode(cached_url, body(seed + 1000)).headers["x-cache"] == "miss"  # other input


def test_bounded_under_a_flood_of_distinct_inputs(cached_url: str) -> None:
    evicted = metric(cached_url, "attnserve_response_cache_evictions_total")
    for seed in range(2000, 2120):  # ~20 KB answers: several times the 1 MiB bound
        assert encode(cached_url, body(seed)).headers["x-cache"] == "miss"
        assert metric(cached_url, "attnserve_response_cache_bytes") <= BOUND
    assert metric(cached_url, "attnserve_response_cache_evictions_total") > evicted
    assert encode(cached_url, body(2119)).headers["x-cache"] == "hit"  # the newest stay
    assert encode(cached_url, body(2000)).headers["x-cache"] == "miss"  # the oldest went


def test_identical_requests_in_flight_run_once(cached_url: str) -> None:
    """Eight identical requests queued behind a heavy one run once. Whether a later one
    joins the run in flight or, arriving after it ended, finds its answer kept (the
    answer fits the cache), exactly one runs: the count cannot depend on timing. Were
    twins in flight not joined, those queued behind the heavy request would all run."""
    tokens = metric(cached_url, "attnserve_tokens_total", model="tiny")
    heavy = {
        "inputs": np.full((32, 128, D_MODEL), 0.5, np.float32).tolist(),
        "return_attention": True,
    }
    twin = {"inputs": np.ones((8, 64, D_MODEL), np.float32).tolist()}  # ~70 KB answer: fits
    answers: list[httpx.Response] = []
    blocker = threading.Thread(target=lambda: encode(cached_url, heavy))
    blocker.start()
    threads = [
        threading.Thread(target=lambda: answers.append(encode(cached_url, twin))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in [blocker, *threads]:
        thread.join(timeout=60)
    assert sorted(a.headers["x-cache"] for a in answers) == ["hit"] * 7 + ["miss"]
    assert len({a.content for a in answers}) == 1
    ran = metric(cached_url, "attnserve_tokens_total", model="tiny") - tokens
    assert ran == 32 * 128 + 8 * 64


def test_a_model_swap_drops_the_old_versions_answers(tmp_path: Path, exports: Path) -> None:  # noqa: F811
    repo = repository(tmp_path, exports, ("1",))
    with server_process(repo, model_control="explicit", response_cache_bytes=str(BOUND)) as server:
        url = server.url
        assert [infer(url).headers["x-cache"] for _ in range(2)] == ["miss", "hit"]
        shutil.copytree(exports / "2", repo / "tiny" / "2")
        assert httpx.post(f"{url}/v2/repository/models/tiny/load", timeout=60).status_code == 200
        answer = infer(url)
        assert answer.headers["x-cache"] == "miss" and hidden_of(answer)[0] == "2"
        assert metric(url, "attnserve_response_cache_bytes") > 0
