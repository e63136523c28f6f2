"""The protocol-neutral core's one door: what protocols and the server call.

Protocols (``service/protocols/<name>/``) turn bytes into typed requests and
call :class:`Engine`; it never sees JSON or HTTP. Each concern lives in a
module of its own, composed here: ``registry`` (which version serves),
``control`` (load, swap, unload, poll), ``lifecycle`` (ready, draining),
``admit`` (slots, deadline, the parse's thread hop), ``text`` (tokenizers), ``prepare``
(every limit before any work), ``execute`` (the batcher, parts, deadlines),
``finish`` (outputs) and ``response_cache``.

Every request runs through :meth:`Engine.handle`, the prologue its kind shares
(``kind.py``). The kinds are declared in the modules that own them: ``encode.ENCODE``,
``sparse.SPARSE`` (BM42, SPLADE), ``rerank.RERANK`` and ``rerank.CLASSIFY`` (heads),
``similarity.SIMILARITY`` (why two texts match), ``text.TOKENIZE`` and ``text.DECODE``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar, cast

from service.engine import encode
from service.engine.admission import Admission, Ticket
from service.engine.admit import Admit, BodyMeter
from service.engine.control import ModelControl
from service.engine.execute import OFFLOAD_BYTES, Executor
from service.engine.kind import RequestKind, Serving
from service.engine.lifecycle import Lifecycle
from service.engine.limits import serving_limits
from service.engine.prepare import PreparedEncode
from service.engine.registry import Registry
from service.engine.response_cache import ResponseCache, allowed_bytes
from service.engine.scope import Caller, Disconnected, RequestScope
from service.engine.types import EncodeRequest, EncodeResult, ServingLimits
from service.metrics import Metrics
from service.model_info import ModelInfo
from service.settings import Settings
from service.timing import RunTiming
from service.tracing import Tracing

log = logging.getLogger(__name__)
Headers = dict[str, str] | None
T = TypeVar("T")
W = TypeVar("W")  # what a protocol keeps from parsing to writing its answer
Rq = TypeVar("Rq")  # a kind's typed request
P = TypeVar("P")  # what its ``prepare`` makes of it
Res = TypeVar("Res")  # its result


class Sized(Protocol):
    """A result that knows its answer's estimated size (EncodeResult, SimilarityResult)."""

    @property
    def response_bytes(self) -> float: ...


R = TypeVar("R", bound=Sized)


class Engine:
    """Models, their lifecycle, and every request, whatever its kind (``handle``)."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.admission = Admission(
            settings.max_queued_requests, settings.max_inflight_bytes, metrics, self.retry_after
        )
        self.lifecycle = Lifecycle(settings.body_timeout, metrics, lambda: self.admission.requests)
        self.registry = Registry(settings.model_repository, metrics)
        self.tracing = Tracing(settings.otlp_endpoint)
        self._execute = Executor(settings, metrics, self.lifecycle, self.off_loop)
        self._admit = Admit(settings, self._execute)
        self._serving = Serving(self.registry, settings, self._execute, self._admit)
        self.cache = ResponseCache(allowed_bytes(settings), metrics, self.off_loop)
        self.control = ModelControl(settings, metrics, self.registry, self.lifecycle, self.cache)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models to serve from the start (ModelLoadError: refuse to start), then
        warm up in the background (see ``control.py``)."""
        await self.control.start()

    async def stop(self) -> None:
        await self.control.stop()
        self.tracing.shutdown()  # what is still buffered goes to the collector

    # -- the node's state (lifecycle.py) -----------------------------------------------------

    def check_live(self) -> None:
        self.lifecycle.check_live()

    def require_ready(self) -> None:
        self.lifecycle.require_ready()

    def check_ready(self) -> None:
        self.lifecycle.check_ready(len(self.registry.runtimes), self.admission.saturated())

    @property
    def shutting_down(self) -> bool:
        return self.lifecycle.shutting_down

    def begin_shutdown(self) -> None:
        self.lifecycle.begin_shutdown()

    def end_work(self) -> None:
        self.lifecycle.end_work()

    def end_body_reads(self) -> None:
        self.lifecycle.end_body_reads()

    def retry_after(self) -> str:
        return self.lifecycle.retry_after()

    def serving_limits(self) -> ServingLimits:
        """The limits a client may want to know (TEI's ``/info`` reports them)."""
        return serving_limits(self.settings)

    # -- models -----------------------------------------------------------------------------

    @property
    def default_model(self) -> str:
        return self.registry.default_model

    def models(self) -> list[ModelInfo]:
        return self.registry.models()

    def model(self, name: str | None, version: str | None = None) -> ModelInfo:
        return self.registry.runtime(name, version).info

    def model_versions(self, name: str) -> list[str]:
        return self.registry.model_versions(name)

    def repository_index(self) -> list[dict[str, str]]:
        return self.registry.index()

    async def load_model(self, name: str) -> ModelInfo:
        """Load ``name``'s highest version and swap it in (see ``control.py``)."""
        return (await self.control.load(name)).info

    async def unload_model(self, name: str) -> None:
        await self.control.unload(name)

    # -- requests ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def request(self, caller: Caller) -> Iterator[RequestScope]:
        """A request's scope, from arrival to its last byte (see ``scope.py``): HTTP's
        middleware and each gRPC call open it, set its route and status, and it is closed
        on every exit path (a bug of ours: 500)."""
        scope = RequestScope(self, caller)
        try:
            yield scope
        except Exception:
            scope.status = 500
            raise
        finally:
            scope.close()

    def ticket(self) -> Ticket:
        """A request's share of the node's budget, taken at arrival (503 if not ready or
        shutting down); see ``admission.py`` for what it holds when."""
        self.lifecycle.require_ready()
        return self.admission.ticket()

    def deadline(self, arrival: float, asked: float | None) -> float:
        """The ``time.monotonic()`` by which a request arriving at ``arrival`` must be
        answered: ATTNSERVE_REQUEST_TIMEOUT, or less if the client asks for less."""
        timeout = self.settings.request_timeout
        return arrival + (timeout if asked is None else min(asked, timeout))

    def body_meter(self, scope: RequestScope) -> BodyMeter:
        """What counts a WORK request's body as it arrives (limits, ticket)."""
        return self._admit.body(scope)

    def body_read(
        self, what: str, received: Callable[[], int] | None = None, headers: Headers = None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Bound a body's read by ATTNSERVE_BODY_TIMEOUT and the drain (see lifecycle.py)."""
        return self.lifecycle.body_read(what, received, headers)

    async def off_loop(self, work: Callable[..., T], *args: Any, small: bool = False) -> T:
        return await self._admit.off_loop(work, *args, small=small)

    async def render(self, result: R, write: Callable[[R, W], T], wire: W) -> T:
        """The protocol's ``write`` of an answer: on a codec thread when it is large."""
        if result.response_bytes > OFFLOAD_BYTES:
            return await self.off_loop(write, result, wire)
        return write(result, wire)

    async def handle(
        self,
        kind: RequestKind[Rq, P, Res],
        parse: Callable[[], tuple[Rq, W]],
        scope: RequestScope,
    ) -> tuple[Res, W]:
        """A request of ``kind``, through the prologue every kind shares: a slot and the
        deadline, then ``parse`` (the protocol's decoding) and the kind's ``prepare``, on
        or off the loop (``admit.py``); the model it is served by; its working memory held
        on its ticket; its run (or its answer from the response cache); the deadline
        again before its answer is written. ``parse`` returns the request and what the
        protocol needs later to write the answer, handed back beside the result."""
        serving = self._serving
        prepared, wire = await self._admit.prepared(
            scope,
            parse,
            lambda request: kind.prepare(request, serving),
            lambda request: kind.inline(request, serving),
        )
        model = kind.model(prepared)
        if model is not None:
            scope.served(model.name, model.version)
        scope.admitted().add(kind.held(prepared, serving), "this request")

        def run() -> Awaitable[Res]:
            return kind.run(prepared, scope, serving)

        key = (
            None
            if kind.cache_key is None or model is None or not self.cache.enabled
            else kind.cache_key(prepared, scope, serving)
        )
        if key is None or model is None:
            result = await run()
        else:
            result = await self._cached(key, model, run, scope)
        self._execute.check_deadline(scope.deadline, "before its answer was written")
        return result, wire

    async def _cached(
        self, key: bytes, model: ModelInfo, run: Callable[[], Awaitable[T]], scope: RequestScope
    ) -> T:
        """The answer from the response cache, or ``run``'s, kept there. The cache keeps
        encode answers only (it sizes their arrays): the one kind that declares a key."""
        result, hit = await self.cache.get_or_run(
            key,
            model.name,
            cast(Callable[[], Awaitable[EncodeResult]], run),
            lambda twin: self._execute.unless_gone(twin, scope.cancelled, scope.deadline),
        )
        scope.cache = "hit" if hit else "miss"
        return cast(T, result)

    def prepare(self, request: EncodeRequest) -> PreparedEncode:
        """Check everything, before any graph runs (see ``prepare.py``)."""
        return encode.prepared(request, self._serving)

    async def run(
        self,
        prepared: PreparedEncode,
        *,
        deadline: float | None = None,
        until: Disconnected | None = None,
        timing: RunTiming | None = None,
    ) -> EncodeResult:
        """Run a prepared request on the version it was prepared for (see ``execute.py``)."""
        runtime = prepared.runtime or self.registry.serving(prepared.model.name)
        return await self._execute.run(
            prepared, runtime, deadline=deadline, until=until, timing=timing
        )
