"""The batcher's queue of one model: fair by request, not by part.

Every part of a request is queued with that request's ``Flow``. A batch is filled
sequence by sequence, first from the requests that fit in one batch (first come,
first served), then from the larger ones a batch each in turn, so a one-text
request waits for at most the run in progress, however many large requests are
queued. A large request sure to miss its deadline is not queued at all
(``late_refusal``). Kept apart from ``batcher`` (which runs the batches) because
the order of service is its own concern.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import numpy as np

from service.errors import Overloaded, PayloadTooLarge


class Flow:
    """One request's claim on its model's queue.

    Every part of a request is submitted with the same flow, so the queue is fair per
    request, not per part, and the batcher knows how much of the request is still to
    come (for Retry-After and the deadline estimate of the requests after it).
    """

    __slots__ = ("finished", "seconds", "submitted", "tokens")

    def __init__(self, tokens: int, seconds: float = 0.0) -> None:
        self.tokens = tokens  # the whole request's
        self.seconds = seconds  # its estimated inference time alone (0: not estimated)
        self.submitted = 0  # tokens of its jobs submitted so far
        self.finished = 0  # tokens of its jobs answered, failed or dropped

    def remaining_seconds(self) -> float:
        """Its estimated inference time still to come."""
        if not self.tokens:
            return 0.0
        return self.seconds * max(self.tokens - self.finished, 0) / self.tokens


class QueuedJob(Protocol):
    """What the queue needs of a job: its request's flow, its sequences, and how many
    of them (a prefix) have been taken into batches."""

    flow: Flow
    sequences: list[np.ndarray]
    taken: int


J = TypeVar("J", bound=QueuedJob)
# A request is refused up front when its estimated time exceeds its deadline by this
# factor. The estimate prices full runs at their measured rate (``RunCostModel.estimate``,
# refreshed by every full run alone), so a request estimated past its deadline is
# sure to miss it: running it only ends in a 504 after holding the lanes.
LATE_FACTOR = 1.0


class FairQueue(Generic[J]):
    """A model's queued jobs: one FIFO per flow, the flows in a heap.

    A flow's key is (large, when it was queued or last served): a request that fits
    in one batch waits for no large one (small ones first come, first served), and
    large requests take a batch each in turn (round-robin, a served flow goes to the
    back), so a large request that arrives late neither jumps ahead of the ones
    running nor is held back until they finish. A flow's key changes only when it
    is served, and then it is popped and pushed back.
    """

    def __init__(self, batch_tokens: int) -> None:
        self._batch = batch_tokens
        self._heap: list[tuple[bool, int, Flow]] = []
        self._jobs: dict[Flow, deque[J]] = {}
        self._order = itertools.count()  # ties: first queued, first served
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, job: J) -> None:
        jobs = self._jobs.get(job.flow)
        if jobs is None:
            self._jobs[job.flow] = deque([job])
            self._push(job.flow)
        else:
            jobs.append(job)
        self._count += 1

    def take(self, budget: int, drop: Callable[[J], bool]) -> list[tuple[J, int, int]]:
        """Sequences up to ``budget`` real tokens (at least one), in the flows' turn;
        a job that ``drop`` says must not run (and says why) leaves unrun."""
        slices: list[tuple[J, int, int]] = []
        tokens = 0
        while self._heap:
            flow = self._heap[0][2]
            jobs = self._jobs[flow]
            job = jobs[0]
            if drop(job):
                self._pop_job(flow, jobs)
                continue
            start = end = job.taken
            taken = 0
            while end < len(job.sequences):
                n = len(job.sequences[end])
                if tokens + taken and tokens + taken + n > budget:
                    break
                taken += n
                end += 1
            if end == start:
                break  # the batch is full
            job.taken = end
            slices.append((job, start, end))
            tokens += taken
            heapq.heappop(self._heap)
            if end == len(job.sequences):
                jobs.popleft()
                self._count -= 1
            if jobs:
                self._push(flow)
            else:
                del self._jobs[flow]
            if end < len(job.sequences):
                break  # the budget is spent inside this job
        return slices

    def _push(self, flow: Flow) -> None:
        large = flow.tokens > self._batch
        heapq.heappush(self._heap, (large, next(self._order), flow))

    def _pop_job(self, flow: Flow, jobs: deque[J]) -> None:
        jobs.popleft()
        self._count -= 1
        if not jobs:
            heapq.heappop(self._heap)
            del self._jobs[flow]


def late_refusal(
    model: str, flow: Flow, running: list[float], deadline: float, longest: float
) -> PayloadTooLarge | Overloaded | None:
    """Why ``flow`` must not start, if it is sure to miss its ``deadline``
    (``time.monotonic()``) by ``LATE_FACTOR``: alone on an idle server (413; ``longest``
    is the longest deadline any request may have), or sharing the model with the large
    requests ``running`` (their remaining seconds: 429)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None  # already late: the deadline's own 504 says so
    own = flow.seconds
    said = (
        f"its {flow.tokens:,} tokens are estimated at {own:.1f} s of inference for model "
        f"{model!r} on this server"
    )
    if own > LATE_FACTOR * min(left, longest):
        longer = (
            f", or give it a longer deadline (at most {longest:g} s)"
            if own <= LATE_FACTOR * longest
            else ""
        )
        return PayloadTooLarge(
            f"this request cannot finish within its deadline of {left:.1f} s even on an "
            f"idle server: {said}; send fewer or shorter inputs{longer}"
        )
    # Large requests share the model round-robin: each one running delays this one by at
    # most its own remaining time, or this one's.
    wait = sum(min(seconds, own) for seconds in running)
    if own + wait > LATE_FACTOR * left:
        return Overloaded(
            f"this request would miss its deadline of {left:.1f} s: {said}, plus about "
            f"{wait:.1f} s shared with the {sum(s > 0 for s in running)} large requests "
            "running; retry after Retry-After seconds"
        )
    return None
