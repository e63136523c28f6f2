"""The node's state: starting, warming up, ready, failed, draining, cut.

Probes read it (``check_live``, ``check_ready``), every request asks it first
(``require_ready``) and shutdown moves it on in two steps: SIGTERM
(``begin_shutdown``: new work is refused, accepted work goes on) and the end of
the grace window (``end_work``: what still waits is answered 503 while the
server can still send it, and a model load still hashing gives up). Bodies
still arriving when the drain ends are cut (``end_body_reads``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from service.batcher import Batcher
from service.errors import BodyTimeout, NotReady, ShuttingDown
from service.metrics import Metrics

log = logging.getLogger(__name__)


class Lifecycle:
    """Ready, failed, shutting down; the batcher once running."""

    def __init__(
        self, body_timeout: float, metrics: Metrics, requests_in_progress: Callable[[], int]
    ) -> None:
        self._metrics = metrics
        self.batcher: Batcher | None = None  # set once the models are loaded
        self.ready = False
        self.failure: str | None = None  # set when the process can never serve
        self.shutting_down = False
        self.work_ended = False  # the grace window is over: what waits now answers 503
        # Set with work_ended, read from load threads: a load still hashing gives up.
        self.stopping = threading.Event()
        self._work_waits: set[asyncio.Timeout] = set()
        self.closing = False  # the drain is over: no body may still arrive
        self._body_timeout = body_timeout
        self._body_reads: set[asyncio.Timeout] = set()
        self._requests_in_progress = requests_in_progress

    def retry_after(self) -> str:
        """Seconds for a refused client to wait: the measured drain time of the backlog."""
        return self.batcher.retry_after() if self.batcher is not None else "1"

    async def warm(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run the warm-up ``work`` (on the inference lanes); ready after it, failed
        (liveness too) if it raises."""
        try:
            await work()
        except Exception as exc:
            log.exception("warm-up failed: the server will never be ready")
            # Fail liveness too, so an orchestrator restarts it instead of keeping a
            # process that answers health checks but can never serve.
            self.failure = f"warm-up failed: {exc}"
            return
        self.ready = True

    def check_live(self) -> None:
        """Liveness: 503 once the process can never serve (its warm-up failed)."""
        if self.failure is not None:
            raise NotReady(self.failure)

    def require_ready(self) -> Batcher:
        """The running batcher; 503 while loading or warming up, or shutting down."""
        if self.shutting_down:
            raise ShuttingDown(
                "the server is shutting down: send this request to another replica",
                headers={"Retry-After": self.retry_after()},
            )
        if not self.ready or self.batcher is None:
            raise NotReady("models are loading or warming up", headers={"Retry-After": "1"})
        return self.batcher

    def check_ready(self, models: int, saturated: str | None) -> None:
        """Readiness: ready, not shutting down, serving a model (explicit or poll mode can
        unload them all: every inference would be 404), and not ``saturated``."""
        self.require_ready()
        if not models:
            raise NotReady(
                "no model is loaded: every inference would be 404 (load one with POST "
                "/v2/repository/models/{name}/load)",
                headers={"Retry-After": "1"},
            )
        if saturated is not None:
            raise NotReady(f"saturated: {saturated}", headers={"Retry-After": self.retry_after()})

    def begin_shutdown(self) -> None:
        """SIGTERM: readiness and new work answer 503 from now on; accepted work goes on."""
        self.shutting_down = True
        log.info(
            "shutting down: refusing new work, answering %d requests in progress",
            self._requests_in_progress(),
        )

    @contextlib.asynccontextmanager
    async def body_read(
        self,
        what: str,
        received: Callable[[], int] | None = None,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[None]:
        """Bound the read of ``what`` (a body, a call's message) by ATTNSERVE_BODY_TIMEOUT
        (BodyTimeout, 408), or by the end of the drain (ShuttingDown, 503), so a slow
        upload never holds the shutdown past its timeout. ``received`` says how many
        bytes came; ``headers`` go with either error (HTTP closes the connection)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (0.0 if self.closing else self._body_timeout)
        try:
            async with asyncio.timeout_at(deadline) as timeout:
                self._body_reads.add(timeout)
                try:
                    yield
                finally:
                    self._body_reads.discard(timeout)
        except TimeoutError:
            if self.closing:
                raise ShuttingDown(
                    f"the server is shutting down and {what} was still arriving: send the "
                    "request to another replica",
                    headers={**(headers or {}), "Retry-After": "1"},
                ) from None
            self._metrics.refusals.labels("body_timeout").inc()
            came = f" ({received():,} bytes received)" if received is not None else ""
            raise BodyTimeout(
                f"{what} did not arrive within {self._body_timeout:g} s{came}", headers=headers
            ) from None

    def end_body_reads(self) -> None:
        """The drain is over: bodies still arriving end now (their requests get 503)."""
        if self.closing:
            return
        self.closing = True
        now = asyncio.get_running_loop().time()
        for timeout in self._body_reads:
            timeout.reschedule(now)

    def end_work(self) -> None:
        """Shutdown's grace window is over: requests still waiting for their runs (or a
        model load) are answered 503 shutting_down now, while the server can still send
        it (uvicorn would cut them with a plain 500); their queued runs are dropped."""
        self.work_ended = True
        self.stopping.set()
        now = asyncio.get_running_loop().time()
        for bound in self._work_waits:
            bound.reschedule(now)
        if self._work_waits:
            log.warning("grace window over: %d requests answered 503", len(self._work_waits))

    @contextlib.contextmanager
    def until_work_ends(self, bound: asyncio.Timeout) -> Iterator[None]:
        """Let ``end_work`` expire ``bound`` (a timeout around what a request awaits)."""
        if self.work_ended:
            bound.reschedule(asyncio.get_running_loop().time())
        self._work_waits.add(bound)
        try:
            yield
        finally:
            self._work_waits.discard(bound)

    @staticmethod
    def work_cut() -> ShuttingDown:
        """The 503 of a request still waiting when the grace window ends."""
        return ShuttingDown(
            "the server is shutting down and this request did not finish within the "
            "shutdown's grace window: send it to another replica",
            headers={"Retry-After": "1"},
        )
