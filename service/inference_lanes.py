"""The inference lanes: where every onnxruntime run of the process executes.

Requests' runs, the token embeddings of text asking for attention or hidden
states, the warm-up of the models served from the start and the timing of
calibration shapes all run here, on ``ATTNSERVE_INFERENCE_LANES`` worker threads over the
same sessions (one ``InferenceSession`` may be run from several threads at
once), or, for a graph with lane sessions, each on its lane's own session with
fewer threads (service/lane_sessions.py). A small run leaves its intra-op
threads waiting at every operator's join, so two of them at once keep both
cores busy; two large runs only fight over the cores (measured in-process,
MiniLM, 2 cores, 2 intra-op threads: two [1,16] runs at once 1.45× one at a
time, [1,128] with attention 1.24×, [8,128] 0.87×). So each run is *shared*
(takes any free lane) or *exclusive* (waits for every lane and holds them all,
as one run at a time did); which, and on which session, is the batcher's call,
measured per graph and shape (``run_planner.LaneModel``). Warm-up and
calibration's single runs are exclusive; a model loaded while serving calibrates
between requests (each run waits until none is queued), its warm-up on the loader
thread (``engine.control``), off the lanes. Outputs are cut back per sequence
here too, so no copy blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np

from model_export.manifest import graph_io
from service.runtime import PLAIN_RUN, ModelRuntime, RunCut, RunOptions, pad

# One sequence's outputs by name, trimmed to its n tokens: last_hidden_state [n, d],
# attentions [L, H, n, n], hidden_states [L + 1, n, d], value_norms [L, H, n] (the last
# three when its graph has them).
SequenceResult = dict[str, np.ndarray]
SHRINKING_RUN = RunOptions(shrink_arena=True)
# Awaited before a calibration run takes the lanes: until no request waits for them.
Idle = Callable[[], Awaitable[None]]
T = TypeVar("T")


class Lease:
    """Lanes held by one run; released once, whatever happens to the run."""

    def __init__(self, gate: LaneGate, held: list[int]) -> None:
        self._gate = gate
        self.held = held
        self.acquisition = gate.acquisitions  # this lease's own number
        self.alone = gate.busy == len(held)  # nothing else ran when it started

    @property
    def lane(self) -> int:
        """The lane whose thread runs it: the lowest held, so a lone run keeps to lane 0
        and its thread's caches."""
        return self.held[0]

    def release(self) -> None:
        if self.held:
            held, self.held = self.held, []
            self._gate.release(held)

    def ran_alone(self) -> bool:
        """Did the run have the lanes to itself from start to now?"""
        return self.alone and self._gate.acquisitions == self.acquisition


class LaneGate:
    """Up to ``lanes`` shared runs at once, or one exclusive run; first come, first
    served, so an exclusive run waiting is never overtaken forever by shared ones."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self._free = list(range(lanes))  # lanes no run holds, lowest first
        self.acquisitions = 0
        self._waiters: deque[tuple[int, asyncio.Future[list[int]]]] = deque()
        self._freed = asyncio.Event()

    @property
    def busy(self) -> int:
        return self.lanes - len(self._free)

    async def acquire(self, *, exclusive: bool) -> Lease:
        need = self.lanes if exclusive else 1
        if not self._waiters and len(self._free) >= need:
            return self._lease(self._hold(need))
        waiter: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._waiters.append((need, waiter))
        try:
            held = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as it was cancelled
                self.release(waiter.result())
            else:
                self._grant()  # the next in line may fit now
            raise
        return self._lease(held)

    async def until_free(self) -> None:
        """Until a shared run could start now: so a worker takes its next batch only
        when a lane can run it (the queue meanwhile fills the batch)."""
        while self._waiters or not self._free:
            self._freed.clear()
            await self._freed.wait()

    def release(self, held: list[int]) -> None:
        self._free = sorted(self._free + held)
        self._grant()
        self._freed.set()

    def _hold(self, need: int) -> list[int]:
        held, self._free = self._free[:need], self._free[need:]
        return held

    def _lease(self, held: list[int]) -> Lease:
        self.acquisitions += 1
        return Lease(self, held)

    def _grant(self) -> None:
        while self._waiters:
            need, waiter = self._waiters[0]
            if waiter.done():  # its caller was cancelled
                self._waiters.popleft()
                continue
            if len(self._free) < need:
                return
            self._waiters.popleft()
            waiter.set_result(self._hold(need))  # held for it until it wakes


class LaneThread:
    """One lane's worker thread: it takes (work, future) pairs from a queue, runs
    each and settles its asyncio future on the loop that awaits it.

    The hand-off is one queue put and, when the work is done, one
    ``call_soon_threadsafe``: a ``ThreadPoolExecutor`` behind ``run_in_executor``
    cost a concurrent future, its work item, the thread-count check and the
    chaining of the two futures on every run (6% of the loop's busy samples at
    [1,16] c=1). Work whose caller was cancelled before it started is skipped, and
    ``shutdown`` cancels what is still queued and waits for the run in progress,
    as the executor's ``shutdown(wait=True, cancel_futures=True)`` did. The thread
    is a daemon: a process that never calls ``shutdown`` still exits.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop] | None
        ] = queue.SimpleQueue()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], T]) -> asyncio.Future[T]:
        """``work`` queued for this thread; the future (of the running loop) settles
        with its result or exception."""
        if self._stopping:
            raise RuntimeError("the inference lane is shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((work, future, loop))
        return future

    def shutdown(self) -> None:
        self._stopping = True
        self._queue.put(None)  # wakes the thread to stop
        self._thread.join()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            work, future, loop = item
            if self._stopping:
                _settle(loop, future.cancel)
                continue
            if future.cancelled():  # its caller gave up before it started
                continue
            try:
                result = work()
            except BaseException as error:  # handed to the awaiting caller, as an executor does
                _settle(loop, partial(_set_exception, future, error))
            else:
                _settle(loop, partial(_set_result, future, result))


def _settle(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it
        loop.call_soon_threadsafe(callback)


def _set_result(future: asyncio.Future[T], result: T) -> None:
    if not future.done():  # cancelled meanwhile
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class InferenceLanes:
    """One worker thread per lane behind one gate; each method awaits its work there."""

    def __init__(self, lanes: int) -> None:
        self.gate = LaneGate(lanes)
        self._threads = [LaneThread(f"inference-{lane}") for lane in range(lanes)]

    async def run(
        self,
        lane: int,
        runtime: ModelRuntime,
        sequences: list[np.ndarray],
        graph: str,
        options: RunOptions = PLAIN_RUN,
        cut: RunCut | None = None,
    ) -> list[SequenceResult]:
        """``sequences`` through ``graph`` as one padded run on ``lane``'s thread, cut
        back per sequence; the caller holds the lanes it needs (``gate.acquire``).
        ``cut`` stops the run from the loop (RunCutShort); so does cancelling the
        caller, so no thread goes on with a run nobody awaits (at shutdown too)."""
        cut = cut or RunCut()
        work = partial(run_and_split, runtime, sequences, graph, options, cut)
        try:
            return await self._threads[lane].submit(work)
        except asyncio.CancelledError:
            cut.cut()
            raise

    async def time(
        self,
        runtime: ModelRuntime,
        graph: str,
        batch: int,
        longest: int,
        *,
        idle: Idle | None = None,
    ) -> float:
        """Seconds of one run of ``batch`` sequences of ``longest`` tokens, alone (run
        twice: the first pays the allocations). ``idle``: awaited before each run takes
        the lanes (a model being loaded lets queued requests go first)."""
        sequences = [runtime.sample_sequence(graph, longest)] * batch
        await self._alone(runtime, graph, sequences, idle)
        return await self._alone(runtime, graph, sequences, idle)

    async def time_full(
        self, runtime: ModelRuntime, graph: str, batch: int, longest: int, *, idle: Idle | None
    ) -> float:
        """Seconds of one run of a full batch, alone, timed once (its allocations are a
        small part of it) and its arena growth given back afterwards (no idle memory
        kept for it)."""
        sequences = [runtime.sample_sequence(graph, longest)] * batch
        return await self._alone(runtime, graph, sequences, idle, SHRINKING_RUN)

    async def _alone(
        self,
        runtime: ModelRuntime,
        graph: str,
        sequences: list[np.ndarray],
        idle: Idle | None,
        options: RunOptions = PLAIN_RUN,
    ) -> float:
        if idle is not None:
            await idle()
        lease = await self.gate.acquire(exclusive=True)
        try:
            start = time.monotonic()
            await self.run(lease.lane, runtime, sequences, graph, options)
            return time.monotonic() - start
        finally:
            lease.release()

    async def time_shared(
        self,
        runtime: ModelRuntime,
        graph: str,
        batch: int,
        longest: int,
        *,
        idle: Idle | None = None,
        own: bool = False,
    ) -> float:
        """Seconds until two such runs started at once on two lanes have both finished
        (the better of two tries: a pair's timing is the noisier); ``own``: each on its
        lane's own session (service/lane_sessions.py), else both on the graph's."""
        sequences = [runtime.sample_sequence(graph, longest)] * batch

        def options(lane: int) -> RunOptions:
            return RunOptions(lane_session=lane) if own else PLAIN_RUN

        tries = []
        for _ in range(2):
            if idle is not None:
                await idle()
            lease = await self.gate.acquire(exclusive=True)
            try:
                start = time.monotonic()
                await asyncio.gather(
                    *(
                        self.run(lane, runtime, sequences, graph, options(lane))
                        for lane in lease.held[:2]
                    )
                )
                tries.append(time.monotonic() - start)
            finally:
                lease.release()
        return min(tries)

    async def warm_up(self, runtime: ModelRuntime) -> None:
        lease = await self.gate.acquire(exclusive=True)
        try:
            await self._threads[lease.lane].submit(runtime.warmup)
        finally:
            lease.release()

    def shutdown(self) -> None:
        for thread in self._threads:
            thread.shutdown()


def _trim(value: np.ndarray, axes: tuple[int, ...], n: int) -> np.ndarray:
    """A copy of ``value`` cut to its first ``n`` tokens along ``axes``."""
    index = [slice(None)] * value.ndim
    for axis in axes:
        index[axis] = slice(0, n)
    return value[tuple(index)].copy()


def run_and_split(
    runtime: ModelRuntime,
    sequences: list[np.ndarray],
    graph: str,
    options: RunOptions = PLAIN_RUN,
    cut: RunCut | None = None,
) -> list[SequenceResult]:
    """Pad, run and cut the outputs back per sequence, all on an inference lane.

    When every sequence fills the run (one sequence, or equal lengths) each gets a
    view of its row: no copy, and the run's tensors are exactly the answers'. Else
    each is copied out, cut to its length, so the run's full [B, L, H, T, T] tensor
    is freed now, not when the last response is serialised; and none of this
    copying blocks the event loop.
    """
    embeds, mask = pad(sequences)
    outputs = runtime.run(embeds, mask, graph, options, cut)
    if all(len(seq) == embeds.shape[1] for seq in sequences):
        return [
            {name: value[row] for name, value in outputs.items()} for row in range(len(sequences))
        ]
    return [
        {
            name: _trim(value[row], graph_io.TOKEN_AXES[name], len(seq))
            for name, value in outputs.items()
        }
        for row, seq in enumerate(sequences)
    ]
