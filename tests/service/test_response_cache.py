"""The response cache (ATTNSERVE_RESPONSE_CACHE_BYTES) on a real server: a hit is the
first answer bit for bit, every option that changes an answer changes the key, its
bytes stay within the bound under a flood of distinct inputs, identical requests in
flight run once, and a model swap drops the old version's answers."""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.engine.response_cache import compact, result_bytes
from service.engine.types import EncodeResult, SequenceOutput
from tests.conftest import running_server, server_process
from tests.service.helpers import b64_array
from tests.service.test_model_control import hidden_of, infer, repository
from tests.support.metrics import metric
from tests.support.tiny import D_MODEL
from tests.support.wait import wait_until

BOUND = 1024 * 1024


@pytest.fixture(scope="module")
def cached_url(model_repository: Path) -> Iterator[str]:
    with running_server(
        model_repository, response_cache_bytes=str(BOUND), response_cache_shared="true"
    ) as url:
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


def test_callers_the_server_cannot_tell_apart_share_no_cache(model_repository: Path) -> None:
    """Without API keys every caller looks alike, so a hit would tell one what another
    sent: the cache is off unless ATTNSERVE_RESPONSE_CACHE_SHARED says they may share
    it. With a key the cache is on, its partition that key's."""
    payload = body(7)
    with running_server(model_repository, response_cache_bytes=str(BOUND)) as url:
        tokens = metric(url, "attnserve_tokens_total", model="tiny")
        answers = [encode(url, payload) for _ in range(2)]
        assert [a.headers.get("x-cache") for a in answers] == [None, None]
        assert metric(url, "attnserve_tokens_total", model="tiny") - tokens == 2 * 24
        assert metric(url, "attnserve_response_cache_requests_total") == 0
    keys = {"api_key": "k1,k2"}
    with running_server(model_repository, response_cache_bytes=str(BOUND), **keys) as url:
        answers = [
            httpx.post(
                f"{url}/v1/encode",
                json=payload,
                headers={"Authorization": f"Bearer {k}"},
                timeout=30,
            )
            for k in ("k1", "k1", "k2", "k2")
        ]
        # Each key its own partition: k2's first answer is computed, not k1's shown to it.
        assert [a.headers["x-cache"] for a in answers] == ["miss", "hit", "miss", "hit"]


def test_a_model_swap_drops_the_old_versions_answers(tmp_path: Path, exports: Path) -> None:
    repo = repository(tmp_path, exports, ("1",))
    with server_process(
        repo,
        model_control="explicit",
        response_cache_bytes=str(BOUND),
        response_cache_shared="true",
    ) as server:
        url = server.url
        assert [infer(url).headers["x-cache"] for _ in range(2)] == ["miss", "hit"]
        shutil.copytree(exports / "2", repo / "tiny" / "2")
        assert httpx.post(f"{url}/v2/repository/models/tiny/load", timeout=60).status_code == 200
        answer = infer(url)
        assert answer.headers["x-cache"] == "miss" and hidden_of(answer)[0] == "2"
        assert metric(url, "attnserve_response_cache_bytes") > 0


def vm_rss(pid: int) -> int:
    """The process's resident set, in bytes (Linux: /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def arrays_body(seed: int, count: int, **options: object) -> dict[str, object]:
    """``count`` sequences of the tiny model's full 128 tokens, in base64."""
    rows = np.random.default_rng(seed).standard_normal((count, 128, D_MODEL)).astype(np.float32)
    return {"inputs": [b64_array(r) for r in rows], "encoding_format": "base64", **options}


def pinning_round(url: str, seed: int) -> bool:
    """A keeper (one sequence, every attention map) and a mate (63 sequences, small
    rollout answers) of 128 tokens each, sent while a run of the attention graph keeps
    the inference thread busy, so they queue together and share one run: the keeper's
    maps are then a view of the run's [64, L, H, 128, 128] output (33.5 MB), 64 times
    their own size. Whether that happened (no run of a lone sequence)."""
    alone = metric(url, "attnserve_batch_sequences_bucket", le="1.0")
    started = metric(url, "attnserve_queue_seconds_count")
    rollout = {"return_attention": True, "attention": {"reduce": "rollout"}}
    blocker = arrays_body(seed, 64, return_embeddings=False, **rollout)
    sent = [threading.Thread(target=encode, args=(url, blocker))]
    sent[0].start()
    wait_until(
        lambda: metric(url, "attnserve_queue_seconds_count") > started,
        "the blocker never started",
        timeout=30,
    )
    keeper = arrays_body(seed + 2, 1, return_attention=True)
    for body in (arrays_body(seed + 1, 63, return_embeddings=False, **rollout), keeper):
        sent.append(threading.Thread(target=encode, args=(url, body)))
        sent[-1].start()
    for thread in sent:
        thread.join(timeout=60)
    return metric(url, "attnserve_batch_sequences_bucket", le="1.0") == alone


def test_an_entry_holds_no_view_of_its_whole_run(model_repository: Path) -> None:
    """Entries whose arrays were views of a whole run's output keep only their own
    bytes. Five keepers fit the bound (the mates' answers do not); kept as views they
    would pin 33.5 MB each, a floor under the process's RSS. The allocator adds
    transient peaks of a round's buffers, so the RSS compared is the lowest seen
    after the warm-up rounds and after each of the last three rounds."""
    bound = 3 * 1024 * 1024
    # The allocator's noise: 84 MiB was seen once in a full run with two inference lanes
    # (a second thread's malloc arena). Five keepers held as views pin 5 × 33.5 MB = 160
    # MiB, still well past bound + margin (99 MiB), so the test keeps failing on views.
    margin = 96 * 1024 * 1024
    with server_process(
        model_repository,
        response_cache_bytes=str(bound),
        response_cache_shared="true",
        max_batch_tokens="8192",
        # One lane: the keeper queues behind the blocker's run. With two, whether it ran
        # alone on the free lane was the start-up calibration's call, which a loaded
        # machine swayed (a full run saw it share in 1 of 15 rounds).
        inference_lanes="1",
    ) as server:
        url, pid = server.url, server.proc.pid
        at_rest = []
        for seed in (1000, 1010):  # warm-up: the graphs' first runs, the allocator's pools
            pinning_round(url, seed)
            at_rest.append(vm_rss(pid))
        start = min(at_rest)
        rss = []
        rounds = attempts = 0
        while rounds < 5 and attempts < 15:  # rounds where the keeper shared its run
            attempts += 1
            rounds += pinning_round(url, 10 * attempts)
            rss.append(vm_rss(pid))
        assert rounds == 5, f"the keeper shared its run in {rounds} of {attempts} rounds"
        assert metric(url, "attnserve_response_cache_bytes") <= bound
        grown = min(rss[-3:]) - start
        assert grown <= bound + margin, f"RSS grew {grown / 2**20:.0f} MiB"


def test_an_entry_is_charged_what_it_holds() -> None:
    """Token strings at their real size (a str object is ~50 bytes, not 16); a view of a
    larger buffer is copied to its own compact array, an array owning its data kept."""
    tokens = [f"token{i}" for i in range(1000)]
    run = np.zeros((8, 2, 4, 16, 16), np.float32)  # a whole run's output
    owned = np.ones(32, np.float32)
    out = SequenceOutput(tokens, 16, None, run[3], None, owned)
    result = EncodeResult("tiny", [out], 0.0)
    held = sum(sys.getsizeof(t) for t in tokens) + run[3].nbytes + owned.nbytes
    assert result_bytes(result) >= held
    kept = compact(result).outputs[0]
    assert kept.attention is not None and kept.attention.base is None
    np.testing.assert_array_equal(kept.attention, run[3])  # exact: a copy
    assert kept.pooled is owned
