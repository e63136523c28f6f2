"""The inference lanes: the gate's rules, the sharing model, a real batcher running
small runs two at a time with answers equal to one at a time, deadlines still kept,
and the drain rate of overlapping runs."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_export import graph_io
from service.batcher import Batcher
from service.drain_rate import DrainRate, retry_after
from service.errors import DeadlineExceeded
from service.inference_lanes import InferenceLanes, LaneGate, LaneThread, run_and_split
from service.metrics import Metrics
from service.run_planner import (
    MIN_SHARING_GAIN,
    SHARING_EXTRAPOLATION,
    LaneModel,
    Placement,
    SharingModel,
)
from service.runtime import ModelRuntime, RunCut
from service.settings import Settings
from tests.service.layers.conftest import layer_settings
from tests.support.inputs import sequences
from tests.support.metrics import metric
from tests.support.tiny import MODEL, MODEL_MAX_SEQ_LEN

EMBEDDINGS = graph_io.GRAPH_EMBEDDINGS
JOBS = 12
TOKENS = 40  # one job per batch: the batch budget below holds one such sequence only


# -- the gate ---------------------------------------------------------------------------


def test_shared_runs_take_a_lane_each_and_an_exclusive_run_waits_for_all() -> None:
    async def main() -> None:
        gate = LaneGate(2)
        first = await gate.acquire(exclusive=False)
        second = await gate.acquire(exclusive=False)
        assert gate.busy == 2 and (first.lane, second.lane) == (0, 1)
        third = asyncio.ensure_future(gate.acquire(exclusive=False))
        exclusive = asyncio.ensure_future(gate.acquire(exclusive=True))
        await asyncio.sleep(0)
        assert not third.done() and not exclusive.done()
        first.release()
        held = await third  # first come, first served, on the lane freed
        assert held.lane == 0
        assert not exclusive.done() and gate.busy == 2
        second.release()
        held.release()
        whole = await exclusive
        assert gate.busy == 2 and whole.held == [0, 1]
        whole.release()
        whole.release()  # a lease releases once
        assert gate.busy == 0

    asyncio.run(main())


def test_shared_runs_do_not_overtake_an_exclusive_run_waiting() -> None:
    async def main() -> None:
        gate = LaneGate(2)
        running = await gate.acquire(exclusive=False)
        exclusive = asyncio.ensure_future(gate.acquire(exclusive=True))
        await asyncio.sleep(0)
        later = asyncio.ensure_future(gate.acquire(exclusive=False))
        await asyncio.sleep(0)
        assert not later.done()  # a lane is free, but the exclusive run asked first
        running.release()
        (await exclusive).release()
        (await later).release()
        assert gate.busy == 0

    asyncio.run(main())


def test_a_cancelled_wait_holds_no_lane() -> None:
    async def main() -> None:
        gate = LaneGate(2)
        running = await gate.acquire(exclusive=False)
        waiting = asyncio.ensure_future(gate.acquire(exclusive=True))
        behind = asyncio.ensure_future(gate.acquire(exclusive=False))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        (await behind).release()  # the free lane went to the next in line
        running.release()
        assert gate.busy == 0
        # Granted and cancelled before it woke: its lanes come back.
        blocker = await gate.acquire(exclusive=True)
        granted = asyncio.ensure_future(gate.acquire(exclusive=False))
        await asyncio.sleep(0)
        blocker.release()  # grants ``granted`` …
        granted.cancel()  # … which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await granted
        assert gate.busy == 0

    asyncio.run(main())


# -- the sharing model ------------------------------------------------------------------


def test_runs_share_up_to_where_the_measured_gain_falls_below_the_minimum() -> None:
    model = SharingModel()
    assert not model.shares(0.001)  # no calibration, no sharing
    # gain = 2·alone / pair: 1.5 at 2 ms, 1.25 at 20 ms, 1.0 at 200 ms (linear in log t).
    for alone, gain in ((0.002, 1.5), (0.02, 1.25), (0.2, 1.0)):
        model.observe(alone, 2 * alone / gain)
    crossing = 0.02 * 10 ** ((1.25 - MIN_SHARING_GAIN) / 0.25)  # 1.1 on the line
    assert model.limit_seconds == pytest.approx(crossing, rel=1e-9)
    assert model.shares(0.05) and not model.shares(0.1)


def test_no_gain_no_sharing_and_no_fall_trusts_only_a_little_beyond() -> None:
    never = SharingModel()
    for alone in (0.001, 0.01, 0.1):
        never.observe(alone, 2 * alone)  # two at once take twice as long: no gain
    assert never.limit_seconds == 0.0
    always = SharingModel()
    for alone in (0.001, 0.01):
        always.observe(alone, alone * 2 / 1.6)
    assert always.limit_seconds == pytest.approx(0.01 * SHARING_EXTRAPOLATION)


def test_each_run_takes_the_placement_of_the_larger_measured_gain() -> None:
    model = LaneModel()
    assert model.place(0.001) is Placement.ALONE  # no calibration: alone
    # On the graph's own session: 1.45 at 1 ms, 1.0 at 100 ms; on the lanes' own
    # sessions: 1.8 at 1 ms, 1.0 at 100 ms (the one-thread lanes' measured shape).
    for alone, shared, own in ((0.001, 1.45, 1.8), (0.01, 1.2, 1.4), (0.1, 1.0, 1.0)):
        model.shared.observe(alone, 2 * alone / shared)
        model.own.observe(alone, 2 * alone / own)
    assert model.place(0.002) is Placement.OWN
    assert model.place(0.5) is Placement.ALONE
    only_shared = LaneModel()  # a graph without lane sessions: its own never observed
    for alone, gain in ((0.001, 1.5), (0.01, 1.3)):
        only_shared.shared.observe(alone, 2 * alone / gain)
    assert only_shared.place(0.002) is Placement.SHARED
    better_shared = LaneModel()
    for alone in (0.001, 0.01):
        better_shared.shared.observe(alone, 2 * alone / 1.5)
        better_shared.own.observe(alone, 2 * alone / 1.2)
    assert better_shared.place(0.005) is Placement.SHARED


# -- a real batcher on tiny ---------------------------------------------------------------


def lane_settings(model_repository: Path, lanes: int, shared_run_ms: float | None) -> Settings:
    return layer_settings(
        model_repository,
        inference_lanes=lanes,
        shared_run_ms=shared_run_ms,
        max_batch_tokens=TOKENS + 8,
    )


def run_jobs(
    settings: Settings, runtimes: dict[str, ModelRuntime], deadlines: list[float | None]
) -> tuple[list[Any], float]:
    """``len(deadlines)`` jobs of one 40-token sequence each, submitted at once; their
    outcomes and how many runs overlapped another."""

    async def main() -> tuple[list[Any], float]:
        metrics = Metrics()
        batcher = Batcher(runtimes, settings, metrics)
        await batcher.start()
        try:
            outcomes = await asyncio.gather(
                *(
                    batcher.submit(
                        MODEL,
                        sequences((TOKENS,), seed=200 + k),
                        graph=EMBEDDINGS,
                        deadline=None if d is None else time.monotonic() + d,
                    )
                    for k, d in enumerate(deadlines)
                ),
                return_exceptions=True,
            )
        finally:
            await batcher.stop()
        return outcomes, metric(metrics.registry, "attnserve_overlapped_runs_total")

    return asyncio.run(main())


def test_small_runs_overlap_on_two_lanes_with_the_answers_of_one_lane(
    model_repository: Path, runtimes: dict[str, ModelRuntime]
) -> None:
    """Every run is [1, 40] either way, so the answers are bitwise those of one lane."""
    serial, overlapped_serial = run_jobs(
        lane_settings(model_repository, 1, None), runtimes, [None] * JOBS
    )
    shared, overlapped = run_jobs(lane_settings(model_repository, 2, 1e9), runtimes, [None] * JOBS)
    assert overlapped_serial == 0
    assert overlapped > 0  # the two lanes did run at once
    for one, two in zip(serial, shared, strict=True):
        hidden = graph_io.OUTPUT_HIDDEN
        np.testing.assert_array_equal(one[0][hidden], two[0][hidden])


def test_runs_too_large_to_share_never_overlap(
    model_repository: Path, runtimes: dict[str, ModelRuntime]
) -> None:
    _, overlapped = run_jobs(lane_settings(model_repository, 2, 0), runtimes, [None] * JOBS)
    assert overlapped == 0


def test_a_job_past_its_deadline_never_runs_on_shared_lanes(
    model_repository: Path, runtimes: dict[str, ModelRuntime]
) -> None:
    deadlines: list[float | None] = [None, -0.001] * (JOBS // 2)
    outcomes, _ = run_jobs(lane_settings(model_repository, 2, 1e9), runtimes, deadlines)
    for outcome, deadline in zip(outcomes, deadlines, strict=True):
        if deadline is None:
            assert outcome[0][graph_io.OUTPUT_HIDDEN].shape[0] == TOKENS
        else:
            assert isinstance(outcome, DeadlineExceeded) and "before it ran" in outcome.message


# -- the lane threads ------------------------------------------------------------------

# One run of tiny at its longest, this many sequences: long enough to be cut under way.
LONG_RUN_SEQUENCES = 512


def test_cancelling_the_caller_cuts_its_run_and_the_lane_runs_the_next(
    tiny_runtime: ModelRuntime,
) -> None:
    """The lane's thread is handed its run through a queue; cancelling the caller
    cuts the run under way (onnxruntime's terminate), so the lane is free again long
    before that run would have ended, runs the next with the answer of a direct run,
    and its thread (named ``inference-0``) stops at shutdown."""
    long = sequences((MODEL_MAX_SEQ_LEN,) * LONG_RUN_SEQUENCES, seed=3)
    short = sequences((TOKENS,), seed=4)

    others = set(lane_threads())  # any other test's still stopping

    async def main() -> tuple[float, float, RunCut, list[Any]]:
        lanes = InferenceLanes(1)
        try:
            start = time.monotonic()
            await lanes.run(0, tiny_runtime, long, EMBEDDINGS)
            whole = time.monotonic() - start
            cut = RunCut()
            start = time.monotonic()
            task = asyncio.ensure_future(lanes.run(0, tiny_runtime, long, EMBEDDINGS, cut=cut))
            await asyncio.sleep(whole / 10)  # under way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            answer = await lanes.run(0, tiny_runtime, short, EMBEDDINGS)
            after_cut = time.monotonic() - start
            assert [t.name for t in set(lane_threads()) - others] == ["inference-0"]
        finally:
            lanes.shutdown()
        return whole, after_cut, cut, answer

    whole, after_cut, cut, answer = asyncio.run(main())
    assert cut.done
    # The cut run gave the lane back within a fraction of its whole time (x2 margin
    # over the sleep of a tenth, and the short run).
    assert after_cut < whole / 2, (after_cut, whole)
    hidden = graph_io.OUTPUT_HIDDEN
    direct = run_and_split(tiny_runtime, short, EMBEDDINGS)
    np.testing.assert_array_equal(answer[0][hidden], direct[0][hidden])
    assert not set(lane_threads()) - others  # stopped at shutdown


def test_a_lane_thread_skips_work_whose_caller_left_and_cancels_the_queue_at_shutdown() -> None:
    """As the one-worker executor did: work cancelled before it started never runs, and
    shutdown waits for the work under way and cancels what is queued behind it."""
    ran: list[str] = []

    async def main() -> None:
        lane = LaneThread("inference-test")
        release = threading.Event()
        holding = lane.submit(release.wait)  # the thread is busy until released
        left = lane.submit(lambda: ran.append("left"))
        after = lane.submit(lambda: ran.append("after"))
        left.cancel()
        release.set()
        assert await holding is True
        await after
        assert ran == ["after"]

        release.clear()
        started = threading.Event()

        def hold() -> bool:
            started.set()
            return release.wait()

        holding = lane.submit(hold)
        queued = lane.submit(lambda: ran.append("queued"))
        await asyncio.to_thread(started.wait)  # under way: shutdown waits for it
        stopping = asyncio.get_running_loop().run_in_executor(None, lane.shutdown)
        while not lane._stopping:  # shutdown has begun (it joins the thread: off the loop)
            await asyncio.sleep(0.001)
        release.set()
        await stopping
        assert await holding is True
        with pytest.raises(asyncio.CancelledError):
            await queued
        with pytest.raises(RuntimeError):
            lane.submit(lambda: ran.append("late"))

    asyncio.run(main())
    assert ran == ["after"]


def lane_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("inference-")]


# -- the drain rate -------------------------------------------------------------------


def test_runs_overlapping_on_two_lanes_drain_at_their_combined_rate() -> None:
    one_at_a_time, together = DrainRate(), DrainRate()
    assert one_at_a_time.seconds_for(100) == 0.0  # nothing measured yet
    one_at_a_time.finished(100, start=0.0, now=1.0)
    one_at_a_time.finished(100, start=1.0, now=2.0)
    assert one_at_a_time.seconds_for(100) == pytest.approx(1.0, rel=1e-9)  # 100 tokens/s
    together.finished(100, start=0.0, now=1.0)
    together.finished(100, start=0.0, now=1.0 + 1e-6)  # the other lane, at the same time
    assert together.seconds_for(200) == pytest.approx(1.0, rel=1e-4)  # 200 tokens/s


def test_retry_after_is_whole_seconds_within_its_bounds() -> None:
    assert [retry_after(s) for s in (0.0, 0.2, 1.01, 59.5, 600.0)] == ["1", "1", "2", "60", "60"]


def test_architecture_states_the_least_gain_a_placement_needs() -> None:
    """docs/architecture.md's lane placement sentence names MIN_SHARING_GAIN."""
    page = Path(__file__).parents[3] / "docs" / "architecture.md"
    text = " ".join(page.read_text(encoding="utf-8").split())
    assert f"larger modelled gain where it reaches {MIN_SHARING_GAIN}:" in text
