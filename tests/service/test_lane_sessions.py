"""Lanes with sessions of their own (service/lane_sessions.py): opened only with the
session cache (or when asked for), counted in the memory ledger when they hold copies,
and a real server running overlapping runs on them with answers bitwise equal to one
lane's. Real exports, real onnxruntime, real servers."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from model_export import graph_io
from service.calibration import calibrate_graph, calibration_shapes
from service.inference_lanes import InferenceLanes
from service.run_planner import LaneModel, RunCostModel, memory_bounds
from service.runtime import RunOptions, load_repository, pad
from service.settings import Settings
from tests.conftest import server_process
from tests.service.helpers import as_array, b64_array
from tests.support.metrics import scrape
from tests.support.tiny import D_MODEL, MODEL

# The graphs that pre-pack by default (ATTNSERVE_PREPACKED_GRAPHS): cached, so with lanes.
CACHED = frozenset({graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_ATTENTION})
REQUESTS = 24
TOKENS = 100  # one request per run: the batch budget below holds one such sequence only


def _settings(repository: Path, cache: str, **more: Any) -> Settings:
    """Two lanes over two intra-op threads: one thread per lane session."""
    chosen: dict[str, Any] = {"intra_op_threads": 2, "inference_lanes": 2, **more}
    return Settings(model_repository=repository, session_cache_dir=cache, **chosen)


def test_lane_sessions_exist_only_with_the_cache_or_when_asked(
    model_repository: Path, tmp_path: Path
) -> None:
    cache = str(tmp_path / "sessions")
    with_cache = load_repository(_settings(model_repository, cache))[MODEL]
    assert with_cache.lane_graphs == CACHED
    assert not load_repository(_settings(model_repository, ""))[MODEL].lane_graphs
    assert not load_repository(_settings(model_repository, cache, lane_sessions="off"))[
        MODEL
    ].lane_graphs
    # One lane, or one thread to split: nothing to gain, none opened.
    one_lane = _settings(model_repository, cache, inference_lanes=1)
    assert not load_repository(one_lane)[MODEL].lane_graphs
    one_thread = _settings(model_repository, cache, intra_op_threads=1)
    assert not load_repository(one_thread)[MODEL].lane_graphs
    # Asked for without the cache: each holds its own pre-packed copy, and the ledger
    # counts one more copy of the encoder's weights per lane and pre-packed graph.
    forced = load_repository(_settings(model_repository, "", lane_sessions="on"))[MODEL]
    assert forced.lane_graphs == CACHED
    plain = with_cache.info.estimated_bytes
    assert (
        load_repository(_settings(model_repository, "", lane_sessions="off"))[
            MODEL
        ].info.estimated_bytes
        == plain
    )  # mapped from the cache: no copy counted
    per_copy = (plain - _unpacked_bytes(model_repository)) // len(CACHED)
    assert per_copy > 0
    assert forced.info.estimated_bytes == plain + 2 * len(CACHED) * per_copy


def _unpacked_bytes(repository: Path) -> int:
    settings = Settings(model_repository=repository, session_cache_dir="", prepacked_graphs="")
    return load_repository(settings)[MODEL].info.estimated_bytes


def test_each_lane_session_answers_bitwise_as_the_graphs_own(
    model_repository: Path, tmp_path: Path
) -> None:
    runtime = load_repository(_settings(model_repository, str(tmp_path / "sessions")))[MODEL]
    rng = np.random.default_rng(46)
    batch, mask = pad([rng.standard_normal((n, D_MODEL)).astype(np.float32) for n in (9, 4)])
    for graph in CACHED:
        want = runtime.run(batch, mask, graph)
        for lane in (0, 1):
            got = runtime.run(batch, mask, graph, RunOptions(lane_session=lane))
            for name, value in want.items():  # exact: the same float32 bits
                np.testing.assert_array_equal(got[name].view("<u4"), value.view("<u4"))


def test_calibration_times_pairs_on_the_graphs_and_the_lanes_own_sessions(
    model_repository: Path, tmp_path: Path
) -> None:
    settings = _settings(model_repository, str(tmp_path / "sessions"))
    runtime = load_repository(settings)[MODEL]

    async def calibrate(graph: str) -> LaneModel:
        lanes = InferenceLanes(settings.inference_lanes)
        try:
            return await calibrate_graph(
                lanes,
                runtime,
                graph,
                memory_bounds(settings.max_batch_tokens, 0, settings.max_batch_attention_floats),
                RunCostModel(settings.max_batch_tokens),
                measure_sharing=True,
                batch_tokens=settings.max_batch_tokens,
            )
        finally:
            lanes.shutdown()

    shapes = len(calibration_shapes(graph_io.GRAPH_EMBEDDINGS))
    with_lanes = asyncio.run(calibrate(graph_io.GRAPH_EMBEDDINGS))
    assert with_lanes.shared.observed == with_lanes.own.observed == shapes
    without = asyncio.run(calibrate(graph_io.GRAPH_HIDDEN_STATES))  # not pre-packed: no lanes
    assert without.shared.observed > 0 and without.own.observed == 0


def _body(k: int) -> dict[str, Any]:
    rng = np.random.default_rng(300 + k)
    return {
        "inputs": [b64_array(rng.standard_normal((TOKENS, D_MODEL)).astype(np.float32))],
        "return_embeddings": True,
        "return_attention": k % 2 == 1,  # every other one through the attention graph
        "encoding_format": "base64",
    }


def _answers(url: str) -> list[list[np.ndarray]]:
    """``REQUESTS`` requests sent at once, each one run of one sequence."""

    def one(k: int) -> list[np.ndarray]:
        with httpx.Client(base_url=url, timeout=60) as client:
            r = client.post("/v1/encode", json=_body(k))
        assert r.status_code == 200, r.text
        item = r.json()["data"][0]
        return [as_array(item[key]) for key in ("embeddings", "attention") if key in item]

    with ThreadPoolExecutor(max_workers=REQUESTS) as pool:
        return list(pool.map(one, range(REQUESTS)))


def test_overlapping_runs_on_lane_sessions_answer_as_one_lane(
    model_repository: Path, tmp_path: Path
) -> None:
    """Every run is [1, 100] either way, on a one-thread lane session or the two-thread
    graph's own, so the answers are bitwise those of one lane."""
    common = {"max_batch_tokens": str(TOKENS + 8), "session_cache_dir": str(tmp_path / "s")}
    with server_process(model_repository, inference_lanes="1", **common) as one:
        want = _answers(one.url)
        assert scrape(one.url).value("attnserve_lane_session_runs_total") == 0
    lanes = {"inference_lanes": "2", "intra_op_threads": "2", "shared_run_ms": "1e9"}
    with server_process(model_repository, **lanes, **common) as two:
        with httpx.Client(base_url=two.url, timeout=60) as client:
            for k in range(3):  # one at a time: each alone, on the graph's own session
                assert client.post("/v1/encode", json=_body(k)).status_code == 200
        assert scrape(two.url).value("attnserve_lane_session_runs_total") == 0
        got = _answers(two.url)
        seen = scrape(two.url)
    assert seen.value("attnserve_overlapped_runs_total") > 0
    assert seen.value("attnserve_lane_session_runs_total") > 0  # overlap on own sessions
    for expected, answer in zip(want, got, strict=True):
        for e, a in zip(expected, answer, strict=True):
            np.testing.assert_array_equal(a.view("<u4"), e.view("<u4"))
