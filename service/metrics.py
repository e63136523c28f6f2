"""Prometheus metrics, kept in a registry per app so several apps never collide.

Each metric's help text is also its row in docs/deployment.md's metrics table
(``python -m service.metrics`` prints it; a test checks the page holds it), so
the label values a reader needs are written in the help.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from model_export.manifest import graph_io

# The inference metric's graph label, by graph file.
GRAPH_LABELS = graph_io.GRAPH_LABELS
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True)
class Documented:
    """One metric as the docs show it: its exposed name, type, labels and help."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


class Metrics:
    """The service's counters, exposed at ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.documented: list[Documented] = []
        self.requests = self._counter(
            "attnserve_requests",
            "Requests by protocol (native, openai, kserve_v2, tei, grpc; http for the viewer "
            "and paths no protocol serves; /metrics and the /health/* probes count as native), "
            "route (the route template, or the gRPC method) and status (including 504, and 499 "
            "for a client that left before its answer or whose answer was cut: it left, or "
            "stopped reading for ATTNSERVE_SEND_TIMEOUT).",
            ("protocol", "route", "status"),
        )
        self.latency = self._histogram(
            "attnserve_request_seconds",
            "Request latency by protocol and route (or gRPC method).",
            ("protocol", "route"),
            buckets=LATENCY_BUCKETS,
        )
        self.tokens = self._counter("attnserve_tokens", "Tokens encoded, by model.", ("model",))
        self.queue_depth = self._gauge(
            "attnserve_queued_requests", "Requests waiting for their first inference run."
        )
        self.in_flight = self._gauge(
            "attnserve_in_flight_requests",
            "Requests admitted (body read) and not yet answered.",
        )
        self.in_flight_bytes = self._gauge(
            "attnserve_in_flight_bytes",
            "Memory held by requests in progress, as admission counts it.",
        )
        self.queue_time = self._histogram(
            "attnserve_queue_seconds",
            "Time from queueing to a request's first inference run.",
            buckets=(*LATENCY_BUCKETS, 30),
        )
        self.refusals = self._counter(
            "attnserve_refusals",
            "Work refused to protect the node, by reason: queue_full, memory (429), deadline "
            "(504), late (413/429: estimated to miss its deadline, refused before running), "
            "body_timeout (408), header_timeout, headers_too_large (431), bad_http (malformed "
            "HTTP, 400), connections (the connection cap), send_timeout (a client that stopped "
            "reading its answer).",
            ("reason",),
        )
        self.cache_requests = self._counter(
            "attnserve_response_cache_requests",
            "Encode requests looked up in the response cache, by result: hit (also a twin "
            "in flight) or miss.",
            ("result",),
        )
        self.cache_evictions = self._counter(
            "attnserve_response_cache_evictions",
            "Answers evicted from the response cache (least recently used first).",
        )
        self.cache_bytes = self._gauge(
            "attnserve_response_cache_bytes",
            "Bytes held by the response cache (at most ATTNSERVE_RESPONSE_CACHE_BYTES).",
        )
        self.model_versions = self._gauge(
            "attnserve_model_versions_in_memory",
            "Versions of each model held in memory: the serving one, and one being swapped "
            "out until its last run ends.",
            ("model",),
        )
        self.model_memory = self._gauge(
            "attnserve_model_memory_bytes",
            "Memory the model memory ledger counts for each model's loaded versions: what "
            "loading and warming up each added to the process's PSS (mapped pages shared "
            "with other sessions or servers counted in proportion), its estimate from its "
            "files where PSS cannot be read.",
            ("model",),
        )
        self.model_loads = self._counter(
            "attnserve_model_loads",
            "Model loads (start-up, repository API, poll), by outcome: loaded, failed, refused.",
            ("model", "outcome"),
        )
        self.worker_restarts = self._counter(
            "attnserve_batcher_restarts",
            "Batcher workers restarted after an unexpected error.",
            ("model",),
        )
        self.batch_sequences = self._histogram(
            "attnserve_batch_sequences",
            "Sequences per onnxruntime run.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.batch_fill = self._histogram(
            "attnserve_batch_fill_ratio",
            "Real tokens / padded tokens per onnxruntime run.",
            buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
        )
        self.overlapped_runs = self._counter(
            "attnserve_overlapped_runs",
            "onnxruntime runs that shared the inference lanes with another run for some of "
            "their time (small runs share; see ATTNSERVE_INFERENCE_LANES).",
        )
        self.lane_session_runs = self._counter(
            "attnserve_lane_session_runs",
            "onnxruntime runs on their inference lane's own session, with the lane's share of "
            "the intra-op threads, while another run was in flight (see "
            "ATTNSERVE_LANE_SESSIONS).",
        )
        self.inference = self._histogram(
            "attnserve_inference_seconds",
            "Wall time of one onnxruntime run, by model and graph: embeddings (model.onnx), "
            "hidden_states (model_hidden.onnx), attention (model_attn.onnx), compact_attention "
            "(model_attn_compact.onnx: top-k rows and summaries), selected_attention "
            "(model_attn_select.onnx: some layers' and heads' maps, or float16 ones), text "
            "(token ids through text_model.onnx), sparse (BM42's sparse_model.onnx), "
            "token_embeddings (token ids to input embeddings through embeddings.onnx, before "
            "the attention or hidden-state graph), scores (a reranker's or classifier's "
            "scores_model.onnx), splade (a SPLADE model's splade_model.onnx), multi_vector "
            "(a late-interaction model's multi_vector_model.onnx).",
            ("model", "graph"),
            buckets=LATENCY_BUCKETS[:-1],
        )

    def _counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        self._note(f"{name}_total", "counter", labels, help)  # the name Prometheus exposes
        return Counter(name, help, labels, registry=self.registry)

    def _gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        self._note(name, "gauge", labels, help)
        return Gauge(name, help, labels, registry=self.registry)

    def _histogram(
        self, name: str, help: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        self._note(name, "histogram", labels, help)
        return Histogram(name, help, labels, buckets=buckets, registry=self.registry)

    def _note(self, name: str, kind: str, labels: Sequence[str], help: str) -> None:
        """A metric of this app, noted for the docs' table."""
        self.documented.append(Documented(name, kind, tuple(labels), help))
