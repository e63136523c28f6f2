"""Dynamic batching between the engine and the inference lanes.

No fixed batching window: a fixed window costs its whole length at low load.
Instead each model's worker takes whatever has queued while the previous run
was busy (up to ``max_batch_tokens`` real tokens), sorts those sequences by
length and cuts them into the runs of least modelled time (``run_planner``:
each run within ``max_batch_tokens`` padded tokens and the attention budget,
its cost fitted per graph from timed shapes at warm-up and every live run),
so short and long sequences are not padded to each other. A run small enough
that two at once beat one at a time (``LaneModel``) takes one inference
lane, on the lane's own session where the graph has them and another run is
in flight, and the worker takes its next batch when a lane is free; a larger
run waits for every lane and runs alone. Admission happens above, in the engine.

Fair by request, not by part: every part of one request is submitted with its
``Flow``, and batches are filled small requests first, then the large ones a
batch each in turn (``fair_queue``), so a one-text request waits for at most
the run in progress.
A request whose estimated work (the run cost model) cannot meet its deadline
is refused when its flow opens (413 if alone on an idle
server it would miss its deadline, 429 if the requests running make it late),
not run to a 504.

A job whose deadline has passed, or whose caller went away, is dropped when
its batch is taken and again when its run gets its lanes, before any
inference. The drain rate (``drain_rate``) sets Retry-After.
A worker that fails unexpectedly fails the requests it holds and is
restarted, so no caller ever waits on a dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import numpy as np

from model_export.manifest import graph_io
from service.calibration import calibrate_graph
from service.drain_rate import DrainRate, retry_after
from service.errors import DeadlineExceeded, Overloaded
from service.fair_queue import FairQueue, Flow, late_refusal
from service.inference_lanes import InferenceLanes, Lease, SequenceResult
from service.jobs import Job, Slice, forget, run_options
from service.metrics import GRAPH_LABELS, Metrics
from service.progress import GraphSteps
from service.run_planner import (
    Fits,
    LaneModel,
    Placement,
    RunCostModel,
    compact_run_floats,
    memory_bounds,
    plan_runs,
    selected_run_maps,
)
from service.runtime import PLAIN_RUN, ModelRuntime, RunCut, RunCutShort, RunOptions
from service.settings import Settings
from service.timing import RunTiming

log = logging.getLogger(__name__)

# A model loaded while serving calibrates only once the lanes have had no request's
# work for this long (a client between two requests is not idle), and looks this often.
CALIBRATION_SETTLE_SECONDS = 0.2
IDLE_POLL_SECONDS = 0.01


class Batcher:
    """One queue and worker per model, one set of inference lanes for the process."""

    def __init__(
        self,
        runtimes: dict[str, ModelRuntime],
        settings: Settings,
        metrics: Metrics,
        *,
        before_batch: Callable[[str], None] | None = None,
    ) -> None:
        """``before_batch``: called with the model's name on each batch its worker takes,
        outside any run's own error handling, so what it raises fails the worker as an
        unexpected bug would: the tests' fault-injection point for the restart. None
        (the engine's) when serving."""
        self._runtimes = dict(runtimes)  # the serving version of each model
        self._settings = settings
        self._metrics = metrics
        self._before_batch = before_batch
        self._queues: dict[str, FairQueue[Job]] = {}
        self._flows: dict[str, set[Flow]] = {}  # the open flows of each model
        self._in_hand: dict[str, set[Job]] = {}  # taken into batches, not yet answered
        self._wakeups: dict[str, asyncio.Event] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._started_workers = False
        self._lanes = InferenceLanes(settings.inference_lanes)
        self._runs: set[asyncio.Task[None]] = set()  # runs in flight
        self._cuts: set[RunCut] = set()  # what stops each of them
        self._queued = 0  # jobs waiting for their first run
        self._backlog_tokens = 0  # tokens of jobs not yet finished
        self._drain = DrainRate()
        self._costs: dict[tuple[str, str], RunCostModel] = {
            (name, graph): RunCostModel(settings.max_batch_tokens)
            for name in runtimes
            for graph in GRAPH_LABELS
        }
        self._sharing: dict[tuple[str, str], LaneModel] = {}
        self._last_work = 0.0  # time.monotonic() when a request's work last came or went

    async def start(self) -> None:
        self._started_workers = True
        for name in self._runtimes:
            self._add_worker(name)

    def _add_worker(self, name: str) -> None:
        self._queues[name] = FairQueue(self._settings.max_batch_tokens)
        self._in_hand[name] = set()
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
            self._costs.setdefault((name, graph), RunCostModel(self._settings.max_batch_tokens))

    def retire(self, name: str) -> None:
        """No new work for ``name`` (unloaded); what is queued still runs."""
        self._runtimes.pop(name, None)

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for cut in self._cuts:  # past the shutdown's grace window: no run holds the exit
            cut.cut()
        await asyncio.gather(*self._runs, return_exceptions=True)
        self._lanes.shutdown()

    async def calibrate(
        self, runtimes: list[ModelRuntime] | None = None, *, between_requests: bool = False
    ) -> None:
        """Time each graph of every served model (or of ``runtimes``) on the calibration
        shapes: the run planner's first cost model and the graph's sharing model.
        ``between_requests`` (a model loaded while serving): each run waits until no
        request's work has been queued or running for ``CALIBRATION_SETTLE_SECONDS``,
        so serving goes first."""
        measure_sharing = self._lanes.gate.lanes > 1 and self._settings.shared_run_ms is None
        idle = self.until_idle if between_requests else None
        for runtime in list(self._runtimes.values()) if runtimes is None else runtimes:
            steps = GraphSteps(log, f"calibrating model {runtime.info.name}", runtime.graphs)
            for graph in runtime.graphs:
                steps.start(graph)
                key = (runtime.info.name, graph)
                self._sharing[key] = await calibrate_graph(
                    self._lanes,
                    runtime,
                    graph,
                    self._fits(runtime, graph),
                    self._costs.setdefault(key, RunCostModel(self._settings.max_batch_tokens)),
                    measure_sharing=measure_sharing,
                    batch_tokens=self._settings.max_batch_tokens,
                    idle=idle,
                )

    async def until_idle(self) -> None:
        """Until no request's work has been queued or in hand for a while (polled: it is
        a calibration run's wait, not a request's)."""
        while self.busy() or time.monotonic() - self._last_work < CALIBRATION_SETTLE_SECONDS:
            await asyncio.sleep(IDLE_POLL_SECONDS)

    async def warm_up(self, runtime: ModelRuntime) -> None:
        """A small ragged batch per graph of ``runtime`` (a model served from the start),
        on the inference lanes like every other run: proves its sessions run."""
        await self._lanes.warm_up(runtime)

    def cost_model(self, model: str, graph: str) -> RunCostModel:
        return self._costs[model, graph]

    def placement(self, runtime: ModelRuntime, graph: str, batch: int, longest: int) -> Placement:
        """Does a run of this shape take one lane, on which session (else it runs alone)?"""
        model = runtime.info.name
        cost = self._costs.get((model, graph))
        if self._lanes.gate.lanes == 1 or cost is None:
            return Placement.ALONE
        chosen = self._settings.shared_run_ms
        if chosen is not None:  # the operator's limit; runs with no estimate yet are small
            small = chosen > 0 and (not cost.fitted or 1000 * cost(batch, longest) <= chosen)
            own = Placement.OWN if graph in runtime.lane_graphs else Placement.SHARED
            return own if small else Placement.ALONE
        sharing = self._sharing.get((model, graph))
        if sharing is None or not cost.fitted:
            return Placement.ALONE
        return sharing.place(cost(batch, longest))

    def busy(self) -> bool:
        """Is anything queued or running, so new work would wait for it?"""
        return self._queued > 0 or any(self._in_hand.values())

    def backlog_seconds(self) -> float:
        """How long the work not yet finished takes at the measured rate (0 if unknown):
        the jobs submitted, and the parts of open requests still to be submitted."""
        to_come = sum(
            max(flow.tokens - flow.submitted, 0) for flows in self._flows.values() for flow in flows
        )
        return self._drain.seconds_for(self._backlog_tokens + to_come)

    @contextlib.contextmanager
    def flow(
        self,
        runtime: ModelRuntime,
        graph: str,
        lengths: list[int],
        deadline: float | None,
    ) -> Iterator[Flow]:
        """One request's flow, open while it runs: submit each of its parts with it.

        Refused first, when the run cost model says its sequences (``lengths``) cannot
        be run by its ``deadline`` (``time.monotonic()``): ``fair_queue.late_refusal``, 413 if
        alone on an idle server it would miss even the longest deadline, or its own;
        429 with Retry-After if sharing the model with the requests already running
        makes it late. Work that fits in one batch is never refused here.
        """
        name = runtime.info.name
        flow = Flow(sum(lengths), self._estimate(runtime, graph, lengths))
        if flow.seconds and deadline is not None:
            self._refuse_late(name, flow, deadline)
        flows = self._flows.setdefault(name, set())
        flows.add(flow)
        try:
            yield flow
        finally:
            flows.discard(flow)

    def _estimate(self, runtime: ModelRuntime, graph: str, lengths: list[int]) -> float:
        """Seconds ``lengths`` take alone by the run cost model; 0 when it has no fit
        yet, or when they fit in one batch (never refused: their deadline is checked
        as they run)."""
        cost = self._costs.get((runtime.info.name, graph))
        if cost is None or not cost.fitted or sum(lengths) <= self._settings.max_batch_tokens:
            return 0.0
        # Greedy runs: their modelled time bounds the planner's (which minimises it).
        runs = plan_runs(lengths, self._fits(runtime, graph))
        return sum(cost.estimate(len(run), lengths[run[0]]) for run in runs)

    def _refuse_late(self, model: str, flow: Flow, deadline: float) -> None:
        running = [f.remaining_seconds() for f in self._flows.get(model, ())]
        refusal = late_refusal(model, flow, running, deadline, self._settings.request_timeout)
        if refusal is not None:
            self._metrics.refusals.labels("late").inc()
            if isinstance(refusal, Overloaded):
                refusal.headers = {"Retry-After": self.retry_after()}
            raise refusal

    def retry_after(self) -> str:
        """Retry-After for a refused request: the backlog's drain time, whole seconds."""
        return retry_after(self.backlog_seconds())

    async def submit(
        self,
        model: str,
        sequences: list[np.ndarray],
        *,
        graph: str,
        deadline: float | None = None,
        timing: RunTiming | None = None,
        runtime: ModelRuntime | None = None,
        flow: Flow | None = None,
        options: RunOptions = PLAIN_RUN,
    ) -> list[SequenceResult]:
        """Queue one request's sequences and wait for their per-sequence results, run on
        ``runtime`` (the version the request was prepared for; default: the serving one).
        The parts of one request share its ``flow`` (default: a flow of its own).

        Cancelling the caller (a client that went away) cancels the job: runs not
        yet started skip it. A job still queued at ``deadline`` (``time.monotonic``)
        fails with DeadlineExceeded without running.
        """
        runtime = runtime or self._runtimes[model]
        if graph not in runtime.graphs:
            raise ValueError(f"unknown graph {graph!r}")  # it would never be run
        loop = asyncio.get_running_loop()
        job = Job(
            runtime,
            sequences,
            graph,
            loop.create_future(),
            deadline,
            timing or RunTiming(),
            flow or Flow(sum(len(s) for s in sequences)),
            results=[None] * len(sequences),
            pending=len(sequences),
            options=options,
        )
        tokens = job.tokens  # before queueing: a malformed job must leave nothing behind
        self._last_work = time.monotonic()
        self._queues[model].append(job)
        self._queued += 1
        self._backlog_tokens += tokens
        job.flow.submitted += tokens
        self._metrics.queue_depth.set(self._queued)
        self._wakeups[model].set()
        try:
            return await job.future
        finally:
            if not job.started:
                self._queued -= 1
                self._metrics.queue_depth.set(self._queued)
            self._backlog_tokens -= tokens
            job.flow.finished += tokens
            self._last_work = time.monotonic()

    def _take_batch(self, queue: FairQueue[Job]) -> list[Slice]:
        """Up to the token budget of queued sequences, small requests first, then large
        ones in turn (see ``FairQueue``); jobs whose caller went away or whose deadline
        passed are dropped here, before any more of them runs."""
        now = time.monotonic()
        return queue.take(self._settings.max_batch_tokens, lambda job: self._gone(job, now))

    def _gone(self, job: Job, now: float) -> bool:
        """Has ``job`` been answered, or its caller gone? A job whose deadline passed
        is failed here (504), so it never runs."""
        if not job.future.done() and job.deadline is not None and job.deadline <= now:
            self._metrics.refusals.labels("deadline").inc()
            job.future.set_exception(
                DeadlineExceeded(
                    f"the request's deadline passed after {now - job.submitted:.3f} s in "
                    "the queue, before it ran"
                )
            )
        return job.future.done()

    async def _supervise(self, model: str) -> None:
        """Run the model's worker; if it fails unexpectedly, fail the jobs it held and
        restart it, so no request waits forever on a dead worker."""
        while True:
            try:
                await self._work(model)
            except Exception as exc:  # CancelledError (stop) is not an Exception
                log.exception("batcher worker for model %s failed; restarting it", model)
                self._metrics.worker_restarts.labels(model).inc()
                for job in list(self._in_hand[model]):
                    if not job.future.done():
                        job.future.set_exception(exc)
                self._in_hand[model].clear()

    async def _work(self, model: str) -> None:
        queue = self._queues[model]
        wakeup = self._wakeups[model]
        while True:
            if not queue:
                wakeup.clear()
                await wakeup.wait()
                continue
            # Take the batch only when a lane can run it: meanwhile the queue fills it.
            await self._lanes.gate.until_free()
            await self._take_and_dispatch(model, queue)

    async def _take_and_dispatch(self, model: str, queue: FairQueue[Job]) -> None:
        """One batch taken and its runs started. Its own frame: once it returns, an idle
        worker holds no job, so a swapped-out version is freed when its last run ends,
        not at the model's next request."""
        in_hand = self._in_hand[model]
        taken = self._take_batch(queue)
        for job in {id(job): job for job, _, _ in taken}.values():
            if job not in in_hand:
                in_hand.add(job)
                job.future.add_done_callback(partial(forget, in_hand, job))
        if self._before_batch is not None:
            self._before_batch(model)
        # Around a swap, jobs of two versions may share a batch: each runs on its own,
        # as do jobs asking for other layers or heads of the selected-maps graph.
        # Groups go in the order the queue took their first slice (fair order).
        groups: dict[tuple[object, ...], list[Slice]] = {}
        for piece in taken:
            job = piece[0]
            key = (id(job.runtime), job.graph, job.options.selection)
            groups.setdefault(key, []).append(piece)
        for group in groups.values():
            await self._dispatch(group[0][0].runtime, group, group[0][0].graph)

    async def _dispatch(self, runtime: ModelRuntime, group: list[Slice], graph: str) -> None:
        """Plan the group's runs and start each on the lanes it needs, in turn; a run
        goes on in the background while the next waits for its lanes."""
        slots = [(job, i) for job, start, end in group for i in range(start, end)]
        lengths = [len(job.sequences[i]) for job, i in slots]
        name = runtime.info.name
        cost = self._costs[name, graph]
        options = run_options([job for job, _ in slots])
        fits = self._fits(runtime, graph, options)
        runs = plan_runs(lengths, fits, cost if cost.fitted else None)
        # The slots are in the order the fair queue took them: the run holding the first
        # taken (a small request's) goes first, and each job is answered after its own
        # last run, not the batch's.
        for run in sorted(runs, key=min):
            if all(slots[k][0].future.done() for k in run):
                continue  # every client of this run went away
            placed = self.placement(runtime, graph, len(run), max(lengths[k] for k in run))
            lease = await self._lanes.gate.acquire(exclusive=placed is Placement.ALONE)
            now = time.monotonic()  # the lanes may have taken a while: drop who left since
            live = [k for k in run if not self._gone(slots[k][0], now)]
            if not live:
                lease.release()
                continue
            pieces = [slots[k] for k in live]
            task = asyncio.create_task(
                self._execute(lease, runtime, graph, pieces, [lengths[k] for k in live], placed)
            )
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)

    async def _execute(
        self,
        lease: Lease,
        runtime: ModelRuntime,
        graph: str,
        pieces: list[tuple[Job, int]],
        lengths: list[int],
        placed: Placement = Placement.ALONE,
    ) -> None:
        """One run on the lanes ``lease`` holds; its sequences' results go to their jobs,
        and a job is answered when its last sequence is back. Placed on its lane's own
        session, it runs there only if another run is in flight: a lone run is faster
        with the graph's session and all its threads."""
        jobs = list({id(job): job for job, _ in pieces}.values())
        start = time.monotonic()
        self._started(jobs, start)
        cut = RunCut()
        self._cuts.add(cut)
        for job in jobs:  # every request of the run gone (deadline, caller left): cut it
            job.future.add_done_callback(partial(_cut_if_all_done, jobs, cut))
        try:
            try:
                sequences = [job.sequences[i] for job, i in pieces]
                options = run_options(jobs)
                if placed is Placement.OWN and not lease.alone:
                    options = replace(options, lane_session=lease.lane)
                    self._metrics.lane_session_runs.inc()
                results = await self._lanes.run(lease.lane, runtime, sequences, graph, options, cut)
            finally:
                self._cuts.discard(cut)
                alone = lease.ran_alone()
                lease.release()
        except RunCutShort as exc:  # no one waits for it, or the server stops
            log.info("a run of model %s was cut: %s", runtime.info.name, exc)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        except Exception as exc:  # fail this run's requests only, not their neighbours'
            log.exception("inference failed for model %s", runtime.info.name)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        self._measured(runtime.info.name, graph, lengths, start, alone, jobs)
        for (job, i), result in zip(pieces, results, strict=True):
            job.results[i] = result
            job.pending -= 1
        for job in jobs:
            if not job.future.done() and job.pending == 0:  # its last sequences ran
                job.future.set_result([r for r in job.results if r is not None])

    def _fits(self, runtime: ModelRuntime, graph: str, options: RunOptions = PLAIN_RUN) -> Fits:
        """The memory bounds of one run of ``graph`` (see ``run_planner.memory_bounds``)."""
        config, settings = runtime.info.config, self._settings
        text = runtime.info.manifest.text
        per_token, maps = 0, 0.0
        if graph == graph_io.GRAPH_SPLADE and text is not None:
            per_token = text.vocab_size
        elif graph == graph_io.GRAPH_ATTENTION:
            maps = config.n_layers * config.n_heads
        elif graph == graph_io.GRAPH_COMPACT_ATTENTION:
            maps, per_token = compact_run_floats(config.n_layers, config.n_heads, options.top_k)
        elif graph == graph_io.GRAPH_SELECTED_ATTENTION:
            kept = options.kept_maps(config.n_layers, config.n_heads)
            maps = selected_run_maps(config.n_heads, kept, options.half)
        return memory_bounds(
            settings.max_batch_tokens, maps, settings.max_batch_attention_floats, per_token
        )

    def _started(self, jobs: list[Job], now: float) -> None:
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
        lengths: list[int],
        start: float,
        alone: bool,
        jobs: list[Job],
    ) -> None:
        """Record one run: metrics, each job's compute time, the cost model (runs that
        had the lanes to themselves: it models a run alone) and the drain rate."""
        now = time.monotonic()
        elapsed = now - start
        tokens, longest = sum(lengths), max(lengths)
        if alone:
            self._costs[model, graph].observe(len(lengths), longest, elapsed)
        else:
            self._metrics.overlapped_runs.inc()
        self._metrics.inference.labels(model, GRAPH_LABELS[graph]).observe(elapsed)
        self._metrics.batch_sequences.observe(len(lengths))
        for job in jobs:
            job.timing.compute += elapsed
            job.timing.finished = now
        if not tokens:  # a run of empty sequences: no fill, and nothing about the rate
            return
        self._metrics.batch_fill.observe(tokens / (len(lengths) * longest))
        if graph == graph_io.GRAPH_TOKEN_EMBEDDINGS:
            return  # a lookup, not the encoder: its speed says nothing of the drain rate
        self._drain.finished(tokens, start, now)


def _cut_if_all_done(jobs: list[Job], cut: RunCut, _: object) -> None:
    """A job of a run was answered, failed or dropped: cut the run once all are (its
    outputs would go to no one)."""
    if all(job.future.done() for job in jobs):
        cut.cut()
