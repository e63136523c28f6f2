"""Admission and dynamic batching between the HTTP layer and the runtime.

No fixed batching window: a fixed window costs its whole length at low load.
Instead each model's worker takes whatever has queued while the previous run
was busy (up to ``max_batch_tokens`` real tokens), sorts those sequences by
length and cuts them into runs of at most ``max_batch_tokens`` padded tokens,
so short and long sequences are not padded to each other. Runs execute one at
a time on a single inference thread: on a small CPU, concurrent onnxruntime
runs only fight over the same cores. Admission happens above, in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from model_export.manifest import graph_io
from service.metrics import Metrics
from service.runtime import ModelRuntime, pad
from service.settings import Settings

log = logging.getLogger(__name__)

# One sequence's outputs by name, trimmed to its n tokens: last_hidden_state [n, d],
# attentions [L, H, n, n], hidden_states [L + 1, n, d] (the last two when its graph has them).
SequenceResult = dict[str, np.ndarray]
# The axes of each output that run over tokens (after the batch axis is dropped).
TOKEN_AXES = {
    graph_io.OUTPUT_HIDDEN: (0,),
    graph_io.OUTPUT_ATTENTIONS: (2, 3),
    graph_io.OUTPUT_HIDDEN_STATES: (1,),
}


@dataclass
class _Job:
    sequences: list[np.ndarray]
    graph: str
    future: asyncio.Future[list[SequenceResult]]
    results: list[SequenceResult | None] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)


def plan_runs(lengths: list[int], fits: Callable[[int, int], bool]) -> list[list[int]]:
    """Group sequence indices into runs, longest first; ``fits(batch, longest)`` bounds a run."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    runs: list[list[int]] = []
    for i in order:
        # Sorted descending, so the run's first sequence is its longest.
        if runs and fits(len(runs[-1]) + 1, lengths[runs[-1][0]]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _trim(value: np.ndarray, axes: tuple[int, ...], n: int) -> np.ndarray:
    """A copy of ``value`` cut to its first ``n`` tokens along ``axes``."""
    index = [slice(None)] * value.ndim
    for axis in axes:
        index[axis] = slice(0, n)
    return value[tuple(index)].copy()


# The inference metric's graph label (the values of the first release kept).
GRAPH_LABELS = {
    graph_io.GRAPH_EMBEDDINGS: "embeddings",
    graph_io.GRAPH_HIDDEN_STATES: "hidden_states",
    graph_io.GRAPH_ATTENTION: "attention",
}


class Batcher:
    """One queue and worker per model, one inference thread for the process."""

    def __init__(
        self, runtimes: dict[str, ModelRuntime], settings: Settings, metrics: Metrics
    ) -> None:
        self._runtimes = runtimes
        self._settings = settings
        self._metrics = metrics
        self._queues: dict[str, deque[_Job]] = {name: deque() for name in runtimes}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")

    async def start(self) -> None:
        for name in self._runtimes:
            self._wakeups[name] = asyncio.Event()
            self._workers.append(asyncio.create_task(self._work(name), name=f"batcher-{name}"))

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def submit(
        self, model: str, sequences: list[np.ndarray], *, graph: str
    ) -> list[SequenceResult]:
        """Queue one request's sequences and wait for their per-sequence results.

        Cancelling the caller (a client that went away) cancels the job: runs not
        yet started skip it.
        """
        loop = asyncio.get_running_loop()
        job = _Job(sequences, graph, loop.create_future(), [None] * len(sequences))
        self._queues[model].append(job)
        self._wakeups[model].set()
        return await job.future

    def _take_batch(self, queue: deque[_Job]) -> list[_Job]:
        """The oldest job plus whatever else is queued, up to the token budget."""
        jobs = [queue.popleft()]
        tokens = jobs[0].tokens
        while queue and tokens + queue[0].tokens <= self._settings.max_batch_tokens:
            jobs.append(queue.popleft())
            tokens += jobs[-1].tokens
        return [j for j in jobs if not j.future.done()]  # skip clients that went away

    async def _work(self, model: str) -> None:
        queue = self._queues[model]
        wakeup = self._wakeups[model]
        runtime = self._runtimes[model]
        loop = asyncio.get_running_loop()
        while True:
            if not queue:
                wakeup.clear()
                await wakeup.wait()
                continue
            jobs = self._take_batch(queue)
            for graph in graph_io.GRAPH_OUTPUTS:
                group = [j for j in jobs if j.graph == graph]
                if group:
                    await self._run_group(loop, runtime, group, graph)

    async def _run_group(
        self,
        loop: asyncio.AbstractEventLoop,
        runtime: ModelRuntime,
        group: list[_Job],
        graph: str,
    ) -> None:
        slots = [(j, i) for j in group for i in range(len(j.sequences))]
        lengths = [len(job.sequences[i]) for job, i in slots]
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

        for run in plan_runs(lengths, fits):
            if all(slots[k][0].future.done() for k in run):
                continue  # every client of this run went away
            embeds, mask = pad([slots[k][0].sequences[slots[k][1]] for k in run])
            start = time.perf_counter()
            try:
                outputs = await loop.run_in_executor(
                    self._executor, partial(runtime.run, embeds, mask, graph)
                )
            except Exception as exc:  # fail this run's requests only, not their neighbours'
                log.exception("inference failed for model %s", runtime.info.name)
                for k in run:
                    if not slots[k][0].future.done():
                        slots[k][0].future.set_exception(exc)
                continue
            self._metrics.inference.labels(runtime.info.name, GRAPH_LABELS[graph]).observe(
                time.perf_counter() - start
            )
            self._metrics.batch_sequences.observe(len(run))
            self._metrics.batch_fill.observe(float(mask.sum()) / mask.size)
            for row, k in enumerate(run):
                job, i = slots[k]
                n = lengths[k]
                # Copies, so the run's full [B, L, H, T, T] tensor is freed now, not when
                # the last response is serialised.
                job.results[i] = {
                    name: _trim(value[row], TOKEN_AXES[name], n) for name, value in outputs.items()
                }
        for job in group:
            if not job.future.done():
                job.future.set_result([r for r in job.results if r is not None])
