"""The hand-off micro-benchmark runs (its numbers are not checked: a shared machine)."""

from __future__ import annotations

import asyncio

from bench.lane_handoff import measure


def test_the_handoff_benchmark_times_both_ways() -> None:
    results = asyncio.run(measure(rounds=2, items=20))
    assert set(results) == {"executor", "lane"}
    for rounds in results.values():
        assert len(rounds) == 2 and all(wall > 0 and cpu >= 0 for wall, cpu in rounds)
