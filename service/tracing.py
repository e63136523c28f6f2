"""Traces of requests (OpenTelemetry), sent to an OTLP/HTTP collector when
``ATTNSERVE_OTLP_ENDPOINT`` is set; nothing is made or sent otherwise.

One span per request, continuing the caller's W3C ``traceparent``, with the
protocol, route, model, version, status and request id; its children are the
request's phases, drawn from the times the engine and batcher record anyway
(so tracing adds no clock reads to the hot path): ``tokenize`` (parse, tokenize,
checks), ``queue`` (waiting for its first run), ``run`` (first run to last) and
``encode`` (writing the answer until its last byte left).

A caller's ``traceparent`` longer than 512 characters or malformed, and a
``tracestate`` over 512 characters or malformed, are ignored here, silently:
the request starts a new trace (or keeps the parent without the state). The
SDK would log a warning per request, echoing the client's header.

Spans are sent in the background; at exit what is still buffered gets at most
``FLUSH_SECONDS``, so a collector that is down or never answers cannot hold
the shutdown (the SDK's own flush would retry for up to 30 s).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from service.timing import RunTiming

SERVICE_NAME = "attnserve"
PROPAGATOR = TraceContextTextMapPropagator()
# At exit: how long the spans still buffered may take to reach the collector.
FLUSH_SECONDS = 0.5
# A caller's trace context is honoured only when it is W3C trace context, whole and short
# (traceparent: version-trace id-parent id-flags, a later version's fields after a dash;
# tracestate: at most 32 key=value members, W3C's key and value alphabets).
MAX_TRACE_HEADER = 512
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[\x20-\x7e]*)?")
_KEY = r"[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
TRACESTATE_MEMBER = re.compile(f"(?:{_KEY})=(?:{_VALUE})")
MAX_TRACESTATE_MEMBERS = 32

log = logging.getLogger(__name__)


class Tracing:
    """The tracer of this process, or nothing (``enabled`` false) without an endpoint."""

    def __init__(self, endpoint: str | None) -> None:
        self._provider: TracerProvider | None = None
        self._exporter: OTLPSpanExporter | None = None
        self._tracer: trace.Tracer | None = None
        if endpoint:
            self._exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
            resource = Resource.create({"service.name": SERVICE_NAME})
            # No exit hook of the SDK's own (unbounded): the engine's stop calls shutdown.
            self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            self._provider.add_span_processor(BatchSpanProcessor(self._exporter))
            self._tracer = self._provider.get_tracer("attnserve")

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start(self, traceparent: str | None, tracestate: str | None, arrival: float) -> Span | None:
        """The request's span, from its arrival (``time.monotonic()``), child of the
        caller's span when it sent a valid ``traceparent``."""
        if self._tracer is None:
            return None
        parent = None
        if traceparent is not None and valid_traceparent(traceparent):
            carrier = {"traceparent": traceparent}
            if tracestate is not None and valid_tracestate(tracestate):
                carrier["tracestate"] = tracestate
            parent = PROPAGATOR.extract(carrier)
        return self._tracer.start_span(
            "attnserve.request",
            context=parent,
            kind=trace.SpanKind.SERVER,
            start_time=clock_offset() + int(arrival * 1e9),
        )

    def finish(
        self, span: Span, timing: RunTiming, attributes: dict[str, str | int], status: int
    ) -> None:
        """Draw the phases as children, then end the request's span (now)."""
        assert self._tracer is not None
        context = trace.set_span_in_context(span)
        end = time.monotonic()
        offset = clock_offset()  # one reading: the phases' ends never cross by jitter

        def wall_ns(monotonic: float) -> int:
            return offset + int(monotonic * 1e9)

        phases = (
            ("tokenize", timing.prepare_began, timing.prepare_ended),
            ("queue", timing.queued, timing.started),
            ("run", timing.started, timing.finished),
            ("encode", timing.finished or timing.prepare_ended, end),
        )
        for name, begin, until in phases:
            if begin is not None and until is not None:
                child = self._tracer.start_span(name, context=context, start_time=wall_ns(begin))
                child.end(end_time=wall_ns(until))
        span.set_attributes(attributes)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=wall_ns(end))

    def shutdown(self) -> None:
        """Send what is still buffered (at exit), for at most FLUSH_SECONDS: then the
        exporter is shut, which ends its retries, and the rest is dropped."""
        if self._provider is None or self._exporter is None:
            return
        flush = threading.Thread(target=self._provider.shutdown, name="otlp-flush", daemon=True)
        flush.start()
        flush.join(FLUSH_SECONDS)
        if flush.is_alive():
            log.warning(
                "traces: the collector took more than %g s at exit; unsent spans dropped",
                FLUSH_SECONDS,
            )
            self._exporter.shutdown()  # type: ignore[no-untyped-call]


def clock_offset() -> int:
    """Wall-clock nanoseconds minus ``time.monotonic()`` nanoseconds: spans carry wall
    time, the engine records monotonic time."""
    return time.time_ns() - int(time.monotonic() * 1e9)


def valid_traceparent(header: str) -> bool:
    return len(header) <= MAX_TRACE_HEADER and TRACEPARENT.fullmatch(header) is not None


def valid_tracestate(header: str) -> bool:
    if len(header) > MAX_TRACE_HEADER:
        return False
    members = [m for m in (m.strip(" \t") for m in header.split(",")) if m]
    return len(members) <= MAX_TRACESTATE_MEMBERS and all(
        TRACESTATE_MEMBER.fullmatch(m) for m in members
    )
