"""Traces of requests (OpenTelemetry), sent to an OTLP/HTTP collector when
``ATTNSERVE_OTLP_ENDPOINT`` is set; nothing is made or sent otherwise.

One span per request, continuing the caller's W3C ``traceparent``, with the
protocol, route, model, version, status and request id; its children are the
request's phases, drawn from the times the engine and batcher record anyway
(so tracing adds no clock reads to the hot path): ``tokenize`` (parse, tokenize,
checks), ``queue`` (waiting for its first run), ``run`` (first run to last) and
``encode`` (writing the answer until its last byte left).

Spans are sent in the background; at exit what is still buffered gets at most
``FLUSH_SECONDS``, so a collector that is down or never answers cannot hold
the shutdown (the SDK's own flush would retry for up to 30 s).
"""

from __future__ import annotations

import logging
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
    from service.batcher import RunTiming

SERVICE_NAME = "attnserve"
PROPAGATOR = TraceContextTextMapPropagator()
# At exit: how long the spans still buffered may take to reach the collector.
FLUSH_SECONDS = 0.5

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
        carrier = {"traceparent": traceparent or ""}
        if tracestate:
            carrier["tracestate"] = tracestate
        parent = PROPAGATOR.extract(carrier) if traceparent else None
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
