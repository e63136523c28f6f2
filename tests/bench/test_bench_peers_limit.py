"""The peers' in-process limit: the worker's concurrent timing on the tiny model's real
graph, and which setting the report names. No timed assertions: counts and bounds only."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.peers.common import Results
from bench.peers.limit import BASELINE, CONCURRENT, batch_sizes, limit_names, limit_of, settings
from bench.peers.workers.inproc_worker import run_task, timed_together
from bench.peers.workloads import WORKLOADS

BY_KEY = {w.key: w for w in WORKLOADS}


def _task(model_dir: Path, **setting: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    d_model = json.loads((model_dir / "config.json").read_text())["architecture"]["d_model"]
    embeds = np.random.default_rng(0).standard_normal((2, 8, d_model)).astype(np.float32)
    inputs = {"e": embeds, "m": np.ones((2, 8), dtype=np.int64)}
    task = {"name": "t", "kind": "embeds", "graph": str(model_dir / "model.onnx")}
    task |= {"embeds": "e", "mask": "m", "seconds": 30.0, "runs": 40, "threads": 1} | setting
    return task, inputs


@pytest.mark.parametrize(
    "setting",
    [{}, {"concurrent": 2}, {"concurrent": 2, "sessions": 2}],
    ids=["one-run", "two-runs-one-session", "two-sessions"],
)
def test_the_worker_times_concurrent_runs_on_a_real_graph(
    tiny_model_dir: Path, setting: dict[str, int]
) -> None:
    task, inputs = _task(tiny_model_dir, **setting)
    stats = run_task(task, inputs, {})
    assert stats["runs"] == 40  # the count bounds the runs of all threads together
    assert stats["items"] == 16
    assert 0 < stats["p50_ms"] <= stats["p99_ms"] <= 1000 * stats["wall_s"]
    assert stats["cores"] > 0 and stats["peak_rss_mb"] > 0


def test_concurrent_timing_stops_at_its_time_and_raises_a_threads_failure() -> None:
    calls = []
    start = time.perf_counter()
    stats = timed_together([lambda: calls.append(time.sleep(0.01))] * 2, 0.2, 10**6)
    assert stats["runs"] == len(calls) - 2  # after one warm-up each
    assert stats["wall_s"] < 5 and time.perf_counter() - start < 5

    turn = iter(range(10**6))

    def fails_later() -> None:
        if next(turn) == 5:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        timed_together([fails_later, fails_later], 30.0, 10**6)


def test_two_runs_at_once_only_where_two_requests_are_in_flight() -> None:
    assert all(s.runs == 1 for s in settings(BY_KEY["W1"]))  # c=1
    assert set(CONCURRENT) <= set(settings(BY_KEY["W2"]))
    assert batch_sizes(BY_KEY["W2"], BASELINE) == [1, 2, 4, 8, 16, 32]
    assert batch_sizes(BY_KEY["W2"], CONCURRENT[0]) == [1, 2, 4, 8, 16]  # 2 × 16 ≤ c=32
    assert batch_sizes(BY_KEY["W4"], CONCURRENT[0]) == [1, 2, 4]  # 2 × 4 ≤ c=8


def test_the_limit_is_the_best_setting_per_round_and_is_named() -> None:
    results = Results("t", 4, 16, rounds=3, requests=6, seconds=2.0)
    per_round = {  # contender -> items/s by round; p50 ms = 1000 / items/s
        "batch ×1, 1 run × 2 threads": (100.0, 100.0, 100.0),
        "batch ×4, 1 run × 2 threads": (300.0, 200.0, 300.0),
        "batch ×4, 2 runs × 1 thread": (400.0, 250.0, 500.0),
        "batch ×1, 2 runs × 1 thread": (150.0, 150.0, 150.0),  # lower p50 but two at once
    }
    for contender, values in per_round.items():
        row = results.row("W2 limit", contender)
        row.rounds += [
            {
                "round": i + 1,
                "items_per_s": v,
                "p50_ms": 1000 / v * (0.1 if "2 runs" in contender else 1),
            }
            for i, v in enumerate(values)
        ]
    best, p50 = limit_of(results, BY_KEY["W2"])
    assert best == {1: 400.0, 2: 250.0, 3: 500.0}
    assert p50 == {1: 10.0, 2: 10.0, 3: 10.0}  # one run at a time only
    assert limit_names(results, BY_KEY["W2"]) == (
        "batch ×4, 2 runs × 1 thread",
        "batch ×1, 1 run × 2 threads",
    )
    results.rows[("W2 limit", "batch ×4, 1 run × 2 threads")].rounds[1]["items_per_s"] = 260.0
    assert limit_names(results, BY_KEY["W2"])[0] == (
        "batch ×4, 2 runs × 1 thread (best in 2/3 rounds)"
    )
