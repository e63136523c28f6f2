"""Running prepared work: queueing, parts, deadlines and callers gone.

Every onnxruntime run goes through the batcher (the inference lanes): token
ids that a graph cannot take are embedded there first, as a run of the
token-embedding graph. A request of more sequences than ATTNSERVE_MAX_SEQUENCES
runs in parts, ``PARTS_IN_FLIGHT`` queued at a time, sharing one batcher flow.
What a request awaits is cancelled when its caller goes away
(ClientClosedRequest) or its deadline passes (DeadlineExceeded, with the
backlog's Retry-After: said here only), and answered 503 at the end of the
shutdown's grace window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np

from model_export.manifest import graph_io
from service.batcher import Batcher
from service.engine.finish import finish
from service.engine.lifecycle import Lifecycle
from service.engine.prepare import PARTS_IN_FLIGHT, PreparedEncode
from service.engine.scope import Disconnected, RequestScope
from service.engine.types import EncodeResult, SequenceOutput
from service.errors import ClientClosedRequest, DeadlineExceeded, NotReady
from service.fair_queue import Flow
from service.inference_lanes import SequenceResult
from service.metrics import Metrics
from service.runtime import PLAIN_RUN, ModelRuntime, RunOptions
from service.settings import Settings
from service.timing import RunTiming

T = TypeVar("T")
P = TypeVar("P")  # what one part of a large request yields, per sequence

# Answers estimated larger than this are finished (and written) on a codec thread, so
# a big answer never stalls the event loop; small ones are cheaper inline.
OFFLOAD_BYTES = 256 * 1024
# Up to this many tokens, an embeddings request on an idle server is not watched for
# its client's disconnect (see Executor._run_part).
UNWATCHED_TOKENS = 256

OffLoop = Callable[..., Coroutine[Any, Any, Any]]


class Executor:
    """Submits prepared work to the batcher and waits for it within its bounds."""

    def __init__(
        self, settings: Settings, metrics: Metrics, lifecycle: Lifecycle, off_loop: OffLoop
    ) -> None:
        self.settings = settings
        self._metrics = metrics
        self._lifecycle = lifecycle
        self._off_loop = off_loop

    # -- deadlines and callers gone ------------------------------------------------------------

    def check_deadline(self, deadline: float | None, when: str) -> None:
        """504 now if ``deadline`` has passed (``when`` says at which step)."""
        if deadline is not None and time.monotonic() >= deadline:
            self._metrics.refusals.labels("deadline").inc()
            raise self._late(f"the request's deadline passed {when}")

    def _late(self, message: str) -> DeadlineExceeded:
        return DeadlineExceeded(message, headers={"Retry-After": self._lifecycle.retry_after()})

    async def unless_gone(
        self, work: Awaitable[T], until: Disconnected | None, deadline: float | None
    ) -> T:
        """Await ``work`` unless the caller goes away or the deadline passes first; then
        cancel it (queued runs skip it).

        uvicorn does not cancel a handler whose client disconnected, so without this a
        burst of abandoned requests would still be computed in full.
        """
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            async with asyncio.timeout(timeout) as bound:  # a timer on this task, no second task
                with self._lifecycle.until_work_ends(bound):
                    if until is None:
                        return await work
                    return await _first_of(work, until)
        except TimeoutError:
            if self._lifecycle.work_ended:
                raise self._lifecycle.work_cut() from None
            self._metrics.refusals.labels("deadline").inc()  # the batcher counts its own drops
            raise self._late(
                "the request's deadline passed before its answer was ready (its queued "
                "work was dropped)"
            ) from None

    def count_tokens(self, runtime: ModelRuntime, tokens: int) -> None:
        """Tokens run through a model (a request's, once its runs are done)."""
        self._metrics.tokens.labels(runtime.info.name).inc(tokens)

    # -- submitting ------------------------------------------------------------------------------

    def _batcher(self) -> Batcher:
        batcher = self._lifecycle.batcher
        if batcher is None:  # stopped under it
            raise NotReady("the engine is not running", headers={"Retry-After": "1"})
        return batcher

    async def _submit(
        self,
        runtime: ModelRuntime,
        sequences: list[np.ndarray],
        graph: str,
        *,
        deadline: float | None,
        until: Disconnected | None,
        timing: RunTiming | None,
        flow: Flow | None,
        options: RunOptions = PLAIN_RUN,
    ) -> list[SequenceResult]:
        """One batcher job, awaited within the request's bounds."""
        work = self._batcher().submit(
            runtime.info.name,
            sequences,
            graph=graph,
            deadline=deadline,
            timing=timing,
            runtime=runtime,
            flow=flow,
            options=options,
        )
        try:
            return await self.unless_gone(work, until, deadline)
        except DeadlineExceeded as exc:  # dropped in the queue: say when to come back
            exc.headers = {"Retry-After": self._lifecycle.retry_after()}
            raise

    async def embed(
        self, runtime: ModelRuntime, pairs: list[np.ndarray], scope: RequestScope
    ) -> list[np.ndarray]:
        """(token id, type) pairs -> their input embeddings [n, d], run by the batcher."""
        results = await self._submit(
            runtime,
            pairs,
            graph_io.GRAPH_TOKEN_EMBEDDINGS,
            deadline=scope.deadline,
            until=scope.cancelled,
            timing=scope.timing,
            flow=None,
        )
        return [result[graph_io.INPUT_EMBEDS] for result in results]

    # -- encode ----------------------------------------------------------------------------------

    async def run(
        self,
        prepared: PreparedEncode,
        runtime: ModelRuntime,
        *,
        deadline: float | None = None,
        until: Disconnected | None = None,
        timing: RunTiming | None = None,
    ) -> EncodeResult:
        """Queue a prepared request, wait for its runs, and post-process the outputs.

        A request of more sequences than ATTNSERVE_MAX_SEQUENCES (only pooled vectors
        asked for) runs in parts of that many, each pooled as it finishes; the answer
        keeps the request's order. Its parts share one batcher flow (fair per request;
        refused up front if sure to be late)."""
        lengths = [len(s) for s in prepared.sequences]
        part = self.settings.max_sequences
        with self._batcher().flow(runtime, prepared.graph, lengths, deadline) as flow:
            if len(lengths) <= part:
                return await self._run_part(prepared, runtime, deadline, until, timing, flow)

            async def outputs_of(start: int) -> list[SequenceOutput]:
                piece = dataclasses.replace(
                    prepared,
                    sequences=prepared.sequences[start : start + part],
                    tokens=prepared.tokens[start : start + part],
                    span_tokens=prepared.span_tokens[start : start + part],
                    pool_skip=prepared.pool_skip[start : start + part],
                    first_index=start,
                )
                done = await self._run_part(piece, runtime, deadline, until, timing, flow)
                return done.outputs

            outputs = await self.in_parts(len(lengths), outputs_of)
        model = prepared.model
        return EncodeResult(model.name, outputs, prepared.response_bytes, model.version)

    async def in_parts(
        self, count: int, run_part: Callable[[int], Coroutine[Any, Any, list[P]]]
    ) -> list[P]:
        """``run_part(start)`` for each part of ATTNSERVE_MAX_SEQUENCES of ``count``
        sequences, ``PARTS_IN_FLIGHT`` queued at a time, results joined in order. A part
        that fails (or a caller gone) cancels the parts not yet awaited."""
        pending: deque[asyncio.Task[list[P]]] = deque()
        results: list[P] = []
        try:
            for start in range(0, count, self.settings.max_sequences):
                pending.append(asyncio.ensure_future(run_part(start)))
                if len(pending) >= PARTS_IN_FLIGHT:
                    results += await pending.popleft()
            while pending:
                results += await pending.popleft()
        finally:
            for task in pending:
                task.cancel()
        return results

    async def _run_part(
        self,
        prepared: PreparedEncode,
        runtime: ModelRuntime,
        deadline: float | None,
        until: Disconnected | None,
        timing: RunTiming | None,
        flow: Flow,
    ) -> EncodeResult:
        self.check_deadline(deadline, "before it could be queued")
        # A watcher task (a task and a wake-up per request) pays only when there is
        # work to skip: runs queued ahead of this request, or a request big enough to
        # matter. A small embeddings request on an idle server runs at once, for a few
        # ms; computing it for a client that has left costs less than watching it.
        watch = (
            self._batcher().busy()
            or prepared.graph != graph_io.GRAPH_EMBEDDINGS
            or sum(map(len, prepared.sequences)) > UNWATCHED_TOKENS
        )
        bounds: dict[str, Any] = {
            "deadline": deadline,
            "until": until if watch else None,
            "timing": timing,
        }
        sequences = prepared.sequences
        to_embed = [k for k, s in enumerate(sequences) if prepared.needs_embedding(s)]
        if to_embed:  # token ids first become the input embeddings the graph takes
            pairs = [sequences[k] for k in to_embed]
            found = await self._submit(
                runtime,
                pairs,
                graph_io.GRAPH_TOKEN_EMBEDDINGS,
                flow=None,
                options=RunOptions(task=prepared.task),
                **bounds,
            )
            sequences = list(sequences)
            for k, result in zip(to_embed, found, strict=True):
                sequences[k] = result[graph_io.INPUT_EMBEDS]
            prepared = dataclasses.replace(prepared, sequences=sequences)
        results = await self._submit(
            runtime, sequences, prepared.graph, flow=flow, options=prepared.run_options, **bounds
        )
        self.count_tokens(runtime, sum(len(s) for s in sequences))
        if prepared.response_bytes > OFFLOAD_BYTES:
            done: EncodeResult = await self._off_loop(finish, prepared, results)
            return done
        return finish(prepared, results)

    # -- other graphs ----------------------------------------------------------------------------

    async def results_in_parts(
        self, runtime: ModelRuntime, sequences: list[np.ndarray], graph: str, scope: RequestScope
    ) -> list[SequenceResult]:
        """Per-sequence outputs of ``graph``, queued in parts like a large pooled request."""
        part = self.settings.max_sequences
        lengths = [len(s) for s in sequences]
        with self._batcher().flow(runtime, graph, lengths, scope.deadline) as flow:

            async def run(start: int) -> list[SequenceResult]:
                return await self._submit(
                    runtime,
                    sequences[start : start + part],
                    graph,
                    deadline=scope.deadline,
                    until=scope.cancelled,
                    timing=scope.timing,
                    flow=flow,
                )

            return await self.in_parts(len(sequences), run)


async def _first_of(work: Awaitable[T], until: Disconnected) -> T:
    """``work``'s result, or ClientClosedRequest once ``until`` returns (work cancelled)."""
    watcher = asyncio.ensure_future(until())
    await asyncio.sleep(0)  # a client already gone is seen before its work is queued
    if watcher.done():
        if asyncio.iscoroutine(work):
            work.close()
        raise ClientClosedRequest("the client closed the connection before its run")
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientClosedRequest("the client closed the connection before the answer")
    finally:
        watcher.cancel()
        task.cancel()  # no-op when done; drops the queued job otherwise
