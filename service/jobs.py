"""What the batcher queues: one request's sequences, where their results go, and
the slices of them a batch takes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from service.fair_queue import Flow
from service.inference_lanes import SequenceResult
from service.runtime import PLAIN_RUN, ModelRuntime, RunOptions
from service.timing import RunTiming


@dataclass(eq=False)  # compared and hashed by identity: jobs are held in sets
class Job:
    runtime: ModelRuntime  # the version it was prepared for: a swap never changes it
    sequences: list[np.ndarray]
    graph: str
    future: asyncio.Future[list[SequenceResult]]
    deadline: float | None  # time.monotonic() after which it must not run
    timing: RunTiming
    flow: Flow
    submitted: float = field(default_factory=time.monotonic)
    started: bool = False
    results: list[SequenceResult | None] = field(default_factory=list)
    taken: int = 0  # sequences taken into batches so far (a prefix)
    pending: int = 0  # sequences whose results have not come back yet
    # What its runs feed the graph beyond the sequences: it shares runs only with jobs of
    # the same selection, and the compact graph's k is the largest of theirs (each
    # sequence keeps its own first k of the sorted rows).
    options: RunOptions = PLAIN_RUN  # frozen: shared safely

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)


def forget(in_hand: set[Job], job: Job, _: object) -> None:
    """A job answered is no longer the worker's to fail."""
    in_hand.discard(job)


# Sequences [start, end) of one job, taken into a batch.
Slice = tuple[Job, int, int]


def run_options(jobs: list[Job]) -> RunOptions:
    """The options of one run of ``jobs`` (one selection): the largest k of theirs."""
    return jobs[0].options.with_top_k(max(job.options.top_k for job in jobs))
