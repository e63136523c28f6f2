"""Admission and dynamic batching between the HTTP layer and the runtime.

No fixed batching window: a fixed window costs its whole length at low load.
Instead each model's worker takes whatever has queued while the previous run
was busy (up to ``max_batch_tokens`` real tokens), sorts those sequences by
length and cuts them into the runs of least modelled time (``run_planner``:
each run within ``max_batch_tokens`` padded tokens and the attention budget,
its cost fitted per graph from timed shapes at warm-up and every live run),
so short and long sequences are not padded to each other. Runs execute one at
a time on a single inference thread: on a small CPU, concurrent onnxruntime
runs only fight over the same cores. Admission happens above, in the engine.

A job whose deadline has passed, or whose caller went away, is dropped when
its batch is taken, before any inference. Each run's tokens per second feed
an estimate of how long the backlog takes to drain, which the engine turns
into Retry-After. A worker that fails unexpectedly fails the requests it
holds and is restarted, so no caller ever waits on a dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from model_export.manifest import graph_io
from service.errors import DeadlineExceeded
from service.metrics import Metrics
from service.run_planner import RunCostModel, plan_runs
from service.runtime import ModelRuntime, pad
from service.settings import Settings

log = logging.getLogger(__name__)

# One sequence's outputs by name, trimmed to its n tokens: last_hidden_state [n, d],
# attentions [L, H, n, n], hidden_states [L + 1, n, d], value_norms [L, H, n] (the last
# three when its graph has them).
SequenceResult = dict[str, np.ndarray]
# The axes of each output that run over tokens (after the batch axis is dropped).
TOKEN_AXES = {
    graph_io.OUTPUT_HIDDEN: (0,),
    graph_io.OUTPUT_ATTENTIONS: (2, 3),
    graph_io.OUTPUT_HIDDEN_STATES: (1,),
    graph_io.OUTPUT_CLS_ATTENTION: (0,),
    graph_io.OUTPUT_VALUE_NORMS: (2,),  # [L, H, n]
}


# Shapes (sequences, tokens) timed per graph at warm-up, so the run planner has a cost
# model before the first request (each is run twice; the first pays allocations). The
# graphs with attention or hidden-state outputs get small shapes only: onnxruntime's
# arena keeps what a run needed, and their outputs grow with B·T² (with all of them,
# idle RSS was 540 MB instead of 300); their live runs refine the fit.
CALIBRATION_SHAPES = ((1, 8), (1, 64), (8, 16), (4, 32), (2, 128), (4, 96))
SMALL_CALIBRATION_SHAPES = ((1, 8), (1, 32), (4, 8), (2, 32), (1, 64), (4, 16))
# Weight of the newest run in the tokens-per-second estimate.
RATE_SMOOTHING = 0.2
# Retry-After bounds, in seconds.
RETRY_AFTER_MIN, RETRY_AFTER_MAX = 1, 60


@dataclass
class RunTiming:
    """Where one request's time went (seconds): preparing by the engine, the rest by
    the batcher."""

    # When (time.monotonic()) each phase began and ended, for traces; None: never reached.
    prepare_began: float | None = None  # parsing, tokenizing, checking: before queueing
    prepare_ended: float | None = None
    queued: float | None = None  # first submitted to the batcher
    started: float | None = None  # its first run began
    finished: float | None = None  # its last run ended
    queue: float = 0.0  # from submission to its first run
    compute: float = 0.0  # the runs that held its sequences (shared with their batch)

    @property
    def prepare(self) -> float:
        """Seconds spent preparing (0 if it never was)."""
        if self.prepare_began is None or self.prepare_ended is None:
            return 0.0
        return self.prepare_ended - self.prepare_began


@dataclass
class _Job:
    runtime: ModelRuntime  # the version it was prepared for: a swap never changes it
    sequences: list[np.ndarray]
    graph: str
    future: asyncio.Future[list[SequenceResult]]
    deadline: float | None  # time.monotonic() after which it must not run
    timing: RunTiming
    submitted: float = field(default_factory=time.monotonic)
    started: bool = False
    results: list[SequenceResult | None] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)


def _trim(value: np.ndarray, axes: tuple[int, ...], n: int) -> np.ndarray:
    """A copy of ``value`` cut to its first ``n`` tokens along ``axes``."""
    index = [slice(None)] * value.ndim
    for axis in axes:
        index[axis] = slice(0, n)
    return value[tuple(index)].copy()


def _run_and_split(
    runtime: ModelRuntime, sequences: list[np.ndarray], graph: str
) -> list[SequenceResult]:
    """Pad, run and cut the outputs back per sequence, all on the inference thread.

    When every sequence fills the run (one sequence, or equal lengths) each gets a
    view of its row: no copy, and the run's tensors are exactly the answers'. Else
    each is copied out, cut to its length, so the run's full [B, L, H, T, T] tensor
    is freed now, not when the last response is serialised; and none of this
    copying blocks the event loop.
    """
    embeds, mask = pad(sequences)
    outputs = runtime.run(embeds, mask, graph)
    if all(len(seq) == embeds.shape[1] for seq in sequences):
        return [
            {name: value[row] for name, value in outputs.items()} for row in range(len(sequences))
        ]
    return [
        {name: _trim(value[row], TOKEN_AXES[name], len(seq)) for name, value in outputs.items()}
        for row, seq in enumerate(sequences)
    ]


# The inference metric's graph label (the values of the first release kept).
GRAPH_LABELS = {
    graph_io.GRAPH_EMBEDDINGS: "embeddings",
    graph_io.GRAPH_HIDDEN_STATES: "hidden_states",
    graph_io.GRAPH_ATTENTION: "attention",
    graph_io.GRAPH_TEXT: "text",
    graph_io.GRAPH_SPARSE: "sparse",
}


class Batcher:
    """One queue and worker per model, one inference thread for the process."""

    def __init__(
        self, runtimes: dict[str, ModelRuntime], settings: Settings, metrics: Metrics
    ) -> None:
        self._runtimes = dict(runtimes)  # the serving version of each model
        self._settings = settings
        self._metrics = metrics
        self._queues: dict[str, deque[_Job]] = {}
        self._in_hand: dict[str, list[_Job]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._started_workers = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self._queued = 0  # jobs waiting for their first run
        self._backlog_tokens = 0  # tokens of jobs not yet finished
        self._tokens_per_second: float | None = None
        self._costs: dict[tuple[str, str], RunCostModel] = {
            (name, graph): RunCostModel() for name in runtimes for graph in GRAPH_LABELS
        }

    async def start(self) -> None:
        self._started_workers = True
        for name in self._runtimes:
            self._add_worker(name)

    def _add_worker(self, name: str) -> None:
        self._queues[name] = deque()
        self._in_hand[name] = []
        self._wakeups[name] = asyncio.Event()
        self._workers.append(asyncio.create_task(self._supervise(name), name=f"batcher-{name}"))

    def serve(self, runtime: ModelRuntime) -> None:
        """Make ``runtime`` the version its model's new work runs on (a load or a swap).
        Jobs already queued keep the version they were prepared for."""
        name = runtime.info.name
        self._runtimes[name] = runtime
        if self._started_workers and name not in self._queues:
            self._add_worker(name)
        for graph in GRAPH_LABELS:
            self._costs.setdefault((name, graph), RunCostModel())

    def retire(self, name: str) -> None:
        """No new work for ``name`` (unloaded); what is queued still runs."""
        self._runtimes.pop(name, None)

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def calibrate(self, runtimes: list[ModelRuntime] | None = None) -> None:
        """Time ``CALIBRATION_SHAPES`` per model (every served one, or ``runtimes``) and
        graph on the inference thread: the run planner's first cost model (every live run
        refines it)."""
        loop = asyncio.get_running_loop()
        for runtime in list(self._runtimes.values()) if runtimes is None else runtimes:
            name = runtime.info.name
            most = runtime.info.max_seq_len
            for graph in runtime.graphs:
                fits = self._fits(runtime, graph)
                shapes = (
                    CALIBRATION_SHAPES
                    if graph in (graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_TEXT)
                    else SMALL_CALIBRATION_SHAPES
                )
                for batch, longest in shapes:
                    longest = min(longest, most)
                    if not fits(batch, longest):
                        continue
                    sequences = [runtime.sample_sequence(graph, longest)] * batch
                    run = partial(_run_and_split, runtime, sequences, graph)
                    await loop.run_in_executor(self._executor, run)
                    start = time.monotonic()
                    await loop.run_in_executor(self._executor, run)
                    cost = self._costs.setdefault((name, graph), RunCostModel())
                    cost.observe(batch, longest, time.monotonic() - start)

    def cost_model(self, model: str, graph: str) -> RunCostModel:
        return self._costs[model, graph]

    def busy(self) -> bool:
        """Is anything queued or running, so new work would wait for it?"""
        return self._queued > 0 or any(self._in_hand.values())

    def backlog_seconds(self) -> float:
        """How long the work not yet finished takes at the measured rate (0 if unknown)."""
        if not self._tokens_per_second:
            return 0.0
        return self._backlog_tokens / self._tokens_per_second

    def retry_after(self) -> str:
        """Retry-After for a refused request: the backlog's drain time, whole seconds."""
        seconds = math.ceil(self.backlog_seconds())
        return str(min(max(seconds, RETRY_AFTER_MIN), RETRY_AFTER_MAX))

    async def submit(
        self,
        model: str,
        sequences: list[np.ndarray],
        *,
        graph: str,
        deadline: float | None = None,
        timing: RunTiming | None = None,
        runtime: ModelRuntime | None = None,
    ) -> list[SequenceResult]:
        """Queue one request's sequences and wait for their per-sequence results, run on
        ``runtime`` (the version the request was prepared for; default: the serving one).

        Cancelling the caller (a client that went away) cancels the job: runs not
        yet started skip it. A job still queued at ``deadline`` (``time.monotonic``)
        fails with DeadlineExceeded without running.
        """
        runtime = runtime or self._runtimes[model]
        if graph not in runtime.graphs:
            raise ValueError(f"unknown graph {graph!r}")  # it would never be run
        loop = asyncio.get_running_loop()
        job = _Job(
            runtime,
            sequences,
            graph,
            loop.create_future(),
            deadline,
            timing or RunTiming(),
            results=[None] * len(sequences),
        )
        tokens = job.tokens  # before queueing: a malformed job must leave nothing behind
        self._queues[model].append(job)
        self._queued += 1
        self._backlog_tokens += tokens
        self._metrics.queue_depth.set(self._queued)
        self._wakeups[model].set()
        try:
            return await job.future
        finally:
            if not job.started:
                self._queued -= 1
                self._metrics.queue_depth.set(self._queued)
            self._backlog_tokens -= tokens

    def _take_batch(self, queue: deque[_Job]) -> list[_Job]:
        """The oldest job plus whatever else is queued, up to the token budget; jobs whose
        caller went away or whose deadline passed are dropped here, before any run."""
        jobs = [queue.popleft()]
        tokens = jobs[0].tokens
        while queue and tokens + queue[0].tokens <= self._settings.max_batch_tokens:
            jobs.append(queue.popleft())
            tokens += jobs[-1].tokens
        now = time.monotonic()
        for job in jobs:
            if not job.future.done() and job.deadline is not None and job.deadline <= now:
                self._metrics.refusals.labels("deadline").inc()
                job.future.set_exception(
                    DeadlineExceeded(
                        f"the request's deadline passed after {now - job.submitted:.3f} s in "
                        "the queue, before it ran"
                    )
                )
        return [j for j in jobs if not j.future.done()]

    async def _supervise(self, model: str) -> None:
        """Run the model's worker; if it fails unexpectedly, fail the jobs it held and
        restart it, so no request waits forever on a dead worker."""
        while True:
            try:
                await self._work(model)
            except Exception as exc:  # CancelledError (stop) is not an Exception
                log.exception("batcher worker for model %s failed; restarting it", model)
                self._metrics.worker_restarts.labels(model).inc()
                for job in self._in_hand[model]:
                    if not job.future.done():
                        job.future.set_exception(exc)
                self._in_hand[model] = []

    async def _work(self, model: str) -> None:
        queue = self._queues[model]
        wakeup = self._wakeups[model]
        loop = asyncio.get_running_loop()
        while True:
            if not queue:
                wakeup.clear()
                await wakeup.wait()
                continue
            jobs = self._in_hand[model] = self._take_batch(queue)
            # Around a swap, jobs of two versions may share a batch: each runs on its own.
            runtimes = {id(job.runtime): job.runtime for job in jobs}
            for runtime in runtimes.values():
                for graph in GRAPH_LABELS:
                    group = [j for j in jobs if j.graph == graph and j.runtime is runtime]
                    if group:
                        await self._run_group(loop, runtime, group, graph)
            self._in_hand[model] = []

    async def _run_group(
        self,
        loop: asyncio.AbstractEventLoop,
        runtime: ModelRuntime,
        group: list[_Job],
        graph: str,
    ) -> None:
        slots = [(j, i) for j in group for i in range(len(j.sequences))]
        lengths = [len(job.sequences[i]) for job, i in slots]
        cost = self._costs[runtime.info.name, graph]
        for run in plan_runs(lengths, self._fits(runtime, graph), cost if cost.fitted else None):
            jobs = list({id(slots[k][0]): slots[k][0] for k in run}.values())
            if all(job.future.done() for job in jobs):
                continue  # every client of this run went away
            start = time.monotonic()
            self._started(jobs, start)
            try:
                results = await loop.run_in_executor(
                    self._executor,
                    partial(
                        _run_and_split,
                        runtime,
                        [slots[k][0].sequences[slots[k][1]] for k in run],
                        graph,
                    ),
                )
            except Exception as exc:  # fail this run's requests only, not their neighbours'
                log.exception("inference failed for model %s", runtime.info.name)
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            elapsed = time.monotonic() - start
            self._measured(runtime.info.name, graph, run, lengths, elapsed, jobs)
            for k, result in zip(run, results, strict=True):
                job, i = slots[k]
                job.results[i] = result
        for job in group:
            if not job.future.done():
                job.future.set_result([r for r in job.results if r is not None])

    def _fits(self, runtime: ModelRuntime, graph: str) -> Callable[[int, int], bool]:
        """The memory bounds of one run of ``graph``: (sequences, longest) -> within them."""
        with_attention = graph == graph_io.GRAPH_ATTENTION
        maps = runtime.info.config.n_layers * runtime.info.config.n_heads
        settings = self._settings

        def fits(batch: int, longest: int) -> bool:
            # Padded tokens bound the embeddings; attention grows with longest², so
            # its floats get their own budget (the graph's memory is mostly these).
            if batch * longest > settings.max_batch_tokens:
                return False
            return not with_attention or (
                batch * maps * longest * longest <= settings.max_batch_attention_floats
            )

        return fits

    def _started(self, jobs: list[_Job], now: float) -> None:
        for job in jobs:
            if not job.started:
                job.started = True
                job.timing.queue = now - job.submitted
                job.timing.queued = job.timing.queued or job.submitted
                job.timing.started = job.timing.started or now
                self._queued -= 1
                self._metrics.queue_time.observe(job.timing.queue)
        self._metrics.queue_depth.set(self._queued)

    def _measured(
        self,
        model: str,
        graph: str,
        run: list[int],
        lengths: list[int],
        elapsed: float,
        jobs: list[_Job],
    ) -> None:
        """Record one run: metrics, each job's compute time, the drain-rate estimate."""
        tokens = sum(lengths[k] for k in run)
        longest = max(lengths[k] for k in run)
        self._costs[model, graph].observe(len(run), longest, elapsed)
        self._metrics.inference.labels(model, GRAPH_LABELS[graph]).observe(elapsed)
        self._metrics.batch_sequences.observe(len(run))
        self._metrics.batch_fill.observe(tokens / (len(run) * longest))
        now = time.monotonic()
        for job in jobs:
            job.timing.compute += elapsed
            job.timing.finished = now
        rate = tokens / max(elapsed, 1e-6)
        previous = self._tokens_per_second
        self._tokens_per_second = (
            rate if previous is None else previous + RATE_SMOOTHING * (rate - previous)
        )
