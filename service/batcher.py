"""Admission and dynamic batching between the HTTP layer and the runtime.

No fixed batching window: a fixed window costs its whole length at low load.
Instead each model's worker takes whatever has queued while the previous run
was busy (up to ``max_batch_tokens`` real tokens), sorts those sequences by
length and cuts them into runs of at most ``max_batch_tokens`` padded tokens,
so short and long sequences are not padded to each other. Runs execute one at
a time on a single inference thread: on a small CPU, concurrent onnxruntime
runs only fight over the same cores.

Admission: at most ``max_queued_requests`` requests wait; the next gets 429
with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from service.errors import Overloaded
from service.metrics import Metrics
from service.runtime import ModelRuntime
from service.settings import Settings

log = logging.getLogger(__name__)

SequenceResult = tuple[np.ndarray, np.ndarray | None]  # hidden [n, d], attention [L, H, n, n]


@dataclass
class _Job:
    sequences: list[np.ndarray]
    with_attention: bool
    future: asyncio.Future[list[SequenceResult]]
    results: list[SequenceResult | None] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)


def plan_runs(lengths: list[int], max_padded_tokens: int) -> list[list[int]]:
    """Group sequence indices into runs: longest first, each run's batch x longest within budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    runs: list[list[int]] = []
    for i in order:
        # Sorted descending, so the run's first sequence is its longest.
        if runs and (len(runs[-1]) + 1) * lengths[runs[-1][0]] <= max_padded_tokens:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def pad_batch(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Zero-pad [n_i, d] arrays to [B, T, d] with an int64 1/0 mask."""
    longest = max(len(s) for s in sequences)
    d = sequences[0].shape[1]
    embeds = np.zeros((len(sequences), longest, d), dtype=np.float32)
    mask = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, seq in enumerate(sequences):
        embeds[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return embeds, mask


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
        self._pending = 0
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
        self, model: str, sequences: list[np.ndarray], *, with_attention: bool
    ) -> list[SequenceResult]:
        """Queue one request's sequences and wait for their per-sequence results."""
        if self._pending >= self._settings.max_queued_requests:
            raise Overloaded(
                f"the server is at capacity ({self._pending} requests queued or running, "
                f"limit {self._settings.max_queued_requests}); retry shortly",
                headers={"Retry-After": "1"},
            )
        loop = asyncio.get_running_loop()
        job = _Job(sequences, with_attention, loop.create_future(), [None] * len(sequences))
        self._pending += 1
        self._metrics.queue_depth.set(self._pending)
        try:
            self._queues[model].append(job)
            self._wakeups[model].set()
            return await job.future
        finally:
            self._pending -= 1
            self._metrics.queue_depth.set(self._pending)

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
            for with_attention in (False, True):
                group = [j for j in jobs if j.with_attention == with_attention]
                if not group:
                    continue
                try:
                    await self._run_group(loop, runtime, group, with_attention)
                except Exception as exc:
                    log.exception("inference failed for model %s", model)
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(exc)

    async def _run_group(
        self,
        loop: asyncio.AbstractEventLoop,
        runtime: ModelRuntime,
        group: list[_Job],
        with_attention: bool,
    ) -> None:
        slots = [(j, i) for j in group for i in range(len(j.sequences))]
        lengths = [len(job.sequences[i]) for job, i in slots]
        graph = "attention" if with_attention else "embeddings"
        for run in plan_runs(lengths, self._settings.max_batch_tokens):
            embeds, mask = pad_batch([slots[k][0].sequences[slots[k][1]] for k in run])
            start = time.perf_counter()
            hidden, attn = await loop.run_in_executor(
                self._executor, partial(runtime.run, embeds, mask, with_attention=with_attention)
            )
            self._metrics.inference.labels(runtime.info.name, graph).observe(
                time.perf_counter() - start
            )
            self._metrics.batch_sequences.observe(len(run))
            self._metrics.batch_fill.observe(float(mask.sum()) / mask.size)
            for row, k in enumerate(run):
                job, i = slots[k]
                n = lengths[k]
                job.results[i] = (
                    hidden[row, :n],
                    None if attn is None else attn[row, :, :, :n, :n],
                )
        for job in group:
            if not job.future.done():
                job.future.set_result([r for r in job.results if r is not None])
