"""What a soak is made of: its classes of request, its settings and the server's limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from model_export.manifest import Manifest

# fp32, the same graph on both sides, but batched with other requests' padding on the
# server and alone here: observed differences ~1e-6 (graph_io.DEFAULT_ATOL's reasoning).
ATOL = 1e-4
MB = 1e6
MiB = 1024 * 1024
KEEP_ALIVE_TIMEOUT = 5.0  # the server's default ATTNSERVE_KEEP_ALIVE_TIMEOUT
SECOND_ANSWER_WAIT = 0.2  # after a raw request's answer, seconds to watch for another

VALID, ATTENTION, INVALID, OVERSIZED, SLOW, ABANDONED = (
    "valid",
    "valid+attention",
    "invalid",
    "oversized",
    "slow",
    "abandoned",
)
CLASSES = (VALID, ATTENTION, INVALID, OVERSIZED, SLOW, ABANDONED)
# What the --clients draw from (slow requests have their own --slow-clients).
MIX = {VALID: 50, ATTENTION: 20, INVALID: 12, OVERSIZED: 10, ABANDONED: 8}
INVALID_VARIANTS = (
    "bad-json",
    "wrong-width",
    "nan-base64",
    "nan-json",
    "empty-sequence",
    "unknown-field",
    "unknown-model",
    "bad-base64",
    "text-plain",
)
OVERSIZED_VARIANTS = ("too-many-sequences", "too-long", "too-many-tokens", "body-too-large")
SLOW_VARIANTS = ("slow-body", "slow-head")
ABANDONED_VARIANTS = ("after-request", "mid-body")
SHED = (429, 503, 504)  # load shedding: each must say when to come back (Retry-After)
# Kinds of failure, in the order the report lists them.
FAILURES = (
    "wrong",
    "lost",
    "unexpected 5xx",
    "shed without Retry-After",
    "bad request accepted",
    "valid request refused",
    "unexpected status",
    "answered twice",
    "server",
    "rss",
)


@dataclass(frozen=True)
class SoakConfig:
    """One soak run; every loop and wait below is bounded by these."""

    seconds: float = 60.0
    clients: int = 16
    slow_clients: int = 2
    warmup_seconds: float = 5.0  # RSS growth is measured from the end of the warm-up
    max_rss_growth_mb: float = 64.0
    atol: float = ATOL
    body_timeout: float = 2.0  # the server's ATTNSERVE_BODY_TIMEOUT / HEADER_TIMEOUT
    slow_seconds: float = 6.0  # a slow client spreads one request over this long
    slow_interval: float = 0.25  # seconds between a slow client's chunks
    max_queued: int | None = None  # ATTNSERVE_MAX_QUEUED_REQUESTS; None: clients // 2
    request_timeout: float = 30.0  # client side, per request
    seed: int = 0
    server_settings: dict[str, str] = field(default_factory=dict)  # more ATTNSERVE_* values

    def __post_init__(self) -> None:
        assert self.seconds > 0 and self.clients >= 1 and self.slow_clients >= 0
        assert 0 <= self.warmup_seconds < self.seconds
        assert self.slow_interval > 0 and self.slow_seconds >= self.slow_interval


@dataclass(frozen=True)
class Limits:
    """The request limits the soak gives its server, derived from the model."""

    d_model: int
    max_seq_len: int  # the model's own (ATTNSERVE_MAX_SEQ_LEN is set to it)
    valid_len: int  # valid sequences are 1..valid_len tokens
    valid_sequences: int  # and 1..valid_sequences per request
    max_sequences: int
    max_tokens: int
    max_body_bytes: int

    @classmethod
    def for_model(cls, manifest: Manifest) -> Limits:
        arch = manifest.architecture
        valid_len, valid_sequences = min(32, arch.max_seq_len), 4
        max_tokens = valid_len * valid_sequences
        # The largest bodies sent: valid ones as nested floats (<= 24 bytes a float),
        # the too-long and too-many-tokens ones as base64 (16/3 bytes a float).
        largest = max(
            valid_sequences * valid_len * arch.d_model * 24,
            (max(arch.max_seq_len, max_tokens) + 1) * arch.d_model * 16 // 3,
        )
        return cls(
            d_model=arch.d_model,
            max_seq_len=arch.max_seq_len,
            valid_len=valid_len,
            valid_sequences=valid_sequences,
            max_sequences=2 * valid_sequences,
            max_tokens=max_tokens,
            max_body_bytes=max(MiB, 2 * largest + 64 * 1024),
        )

    def server_settings(self) -> dict[str, str]:
        return {
            "MAX_SEQ_LEN": str(self.max_seq_len),
            "MAX_SEQUENCES": str(self.max_sequences),
            "MAX_TOKENS": str(self.max_tokens),
            "MAX_BODY_BYTES": str(self.max_body_bytes),
        }
