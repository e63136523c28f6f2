"""Prometheus metrics, kept in a registry per app so several apps never collide."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """The service's counters, exposed at ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "attnserve_requests",
            "Requests by protocol, route (or gRPC method) and status.",
            ["protocol", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "attnserve_request_seconds",
            "Request latency by protocol and route (or gRPC method).",
            ["protocol", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.tokens = Counter(
            "attnserve_tokens", "Tokens encoded, by model.", ["model"], registry=self.registry
        )
        self.queue_depth = Gauge(
            "attnserve_queued_requests",
            "Requests waiting for their first inference run.",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "attnserve_in_flight_requests",
            "Requests admitted (body read) and not yet answered.",
            registry=self.registry,
        )
        self.in_flight_bytes = Gauge(
            "attnserve_in_flight_bytes",
            "Memory held by requests in progress, as admission counts it.",
            registry=self.registry,
        )
        self.queue_time = Histogram(
            "attnserve_queue_seconds",
            "Time from queueing to a request's first inference run.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.refusals = Counter(
            "attnserve_refusals",
            "Work refused to protect the node, by reason: queue_full, memory, "
            "deadline, late, body_timeout, header_timeout, headers_too_large, bad_http, "
            "connections, send_timeout.",
            ["reason"],
            registry=self.registry,
        )
        self.cache_requests = Counter(
            "attnserve_response_cache_requests",
            "Encode requests looked up in the response cache, by result: hit (also a twin "
            "in flight) or miss.",
            ["result"],
            registry=self.registry,
        )
        self.cache_evictions = Counter(
            "attnserve_response_cache_evictions",
            "Answers evicted from the response cache (least recently used first).",
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            "attnserve_response_cache_bytes",
            "Bytes held by the response cache (at most ATTNSERVE_RESPONSE_CACHE_BYTES).",
            registry=self.registry,
        )
        self.model_versions = Gauge(
            "attnserve_model_versions_in_memory",
            "Versions of each model held in memory: the serving one, and one being swapped "
            "out until its last run ends.",
            ["model"],
            registry=self.registry,
        )
        self.model_loads = Counter(
            "attnserve_model_loads",
            "Model loads (start-up, repository API, poll), by outcome: loaded, failed, refused.",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.worker_restarts = Counter(
            "attnserve_batcher_restarts",
            "Batcher workers restarted after an unexpected error.",
            ["model"],
            registry=self.registry,
        )
        self.batch_sequences = Histogram(
            "attnserve_batch_sequences",
            "Sequences per onnxruntime run.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.batch_fill = Histogram(
            "attnserve_batch_fill_ratio",
            "Real tokens / padded tokens per onnxruntime run.",
            buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
            registry=self.registry,
        )
        self.inference = Histogram(
            "attnserve_inference_seconds",
            "Wall time of one onnxruntime run.",
            ["model", "graph"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
