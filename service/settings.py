"""Service settings: the only reader of the environment (prefix ``ATTNSERVE_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


class Settings(BaseSettings):
    """Every knob of the server; each can be set as ``ATTNSERVE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="ATTNSERVE_", extra="ignore")

    model_repository: Path = Field(
        Path("models"), description="Directory with one sub-directory per model (model_export)."
    )
    default_model: str | None = Field(
        None, description="Model used when a request names none; the only/first model if unset."
    )
    model_control: Literal["none", "explicit", "poll"] = Field(
        "none",
        description="none: every model directory loads at start, for good. explicit: the "
        "default model and ATTNSERVE_LOAD_MODELS load at start, others on "
        "POST /v2/repository/models/{name}/load (and unload). poll: the repository is "
        "rescanned every ATTNSERVE_POLL_SECONDS; a new or changed model directory is loaded "
        "beside the serving one and swapped in.",
    )
    version_policy: Literal["latest", "all"] = Field(
        "latest",
        description="Which versions of a model directory (<name>/<version>/) are loaded: "
        "latest, the highest (a new one replaces it, the old is freed after its last run); "
        "all, every one, the highest serving unless a request names another.",
    )
    load_models: str = Field(
        "",
        description="explicit mode: comma-separated model directories loaded at start, "
        "besides the default model ('*': all of them).",
    )
    poll_seconds: float = Field(
        15.0, gt=0, description="poll mode: seconds between two scans of the repository."
    )
    model_memory_bytes: int = Field(
        8192 * MiB,
        ge=16 * MiB,
        description="Memory budget of the loaded models (estimated from their files and their "
        "architecture); a load "
        "that would exceed it is refused with the reason. A swap holds both versions until "
        "the old one's last run ends.",
    )
    follow_symlinks: bool = Field(
        False,
        description="Follow symbolic links that leave the model repository (a model "
        "directory, or a file its config.json names, linked from elsewhere). Off: such a "
        "model is refused, so whoever can write a model directory cannot make the server "
        "read files beyond the repository; links inside it are always followed.",
    )
    response_cache_bytes: int = Field(
        64 * MiB,
        ge=0,
        description="Bytes of answers kept for requests that come again (keyed by model "
        "version, exact inputs and options, and API key); 0 turns the cache off.",
    )
    response_cache_shared: bool = Field(
        False,
        description="Without ATTNSERVE_API_KEY the server cannot tell callers apart, and a "
        "hit (its x-cache header, its speed) would tell one caller what another sent: the "
        "cache is then off unless this is true (one tenant, or callers that may see each "
        "other's texts). With API keys each key has its own partition either way.",
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OpenTelemetry: the OTLP/HTTP collector's base URL (e.g. "
        "http://otel-collector:4318); one span per request, with its phases, is sent to "
        "<endpoint>/v1/traces. Unset: no traces are made or sent.",
    )
    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    tei: bool = Field(
        True,
        description="Serve Hugging Face text-embeddings-inference's API (POST / and /embed, "
        "/embed_all, /embed_sparse, /similarity, /tokenize, /decode, GET /info, /health) "
        "for its clients.",
    )
    grpc_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="TCP port of the Open Inference Protocol over gRPC (Triton's default "
        "8001), on the same host, engine and limits as HTTP; 0 turns gRPC off.",
    )
    api_key: SecretStr | None = Field(
        None,
        description="Comma-separated keys (a key cannot hold a comma), any of which is "
        "accepted: when set, /v1/*, /v2/models/* and TEI's routes require 'Authorization: "
        "Bearer <key>' (health, metrics and server metadata stay open for probes and "
        "scrapers). Several keys let one be rotated without a restart of every client.",
    )

    admin_keys: SecretStr | None = Field(
        None,
        description="Comma-separated keys for the model repository API (/v2/repository/*). "
        "When set, those calls need 'Authorization: Bearer <admin key>'; when unset and "
        "ATTNSERVE_API_KEY is set, the repository API is refused (inference keys never "
        "manage models).",
    )

    @property
    def api_key_list(self) -> list[str]:
        return _key_list(self.api_key)

    @property
    def admin_key_list(self) -> list[str]:
        return _key_list(self.admin_keys)

    @field_validator("api_key", "admin_keys")
    @classmethod
    def _empty_key_is_no_key(cls, value: SecretStr | None) -> SecretStr | None:
        # ATTNSERVE_API_KEY="" must not mean "any Bearer token passes".
        if value is None or not value.get_secret_value().strip(", "):
            return None
        # A header carries a token as visible ASCII: any other key could never match.
        for key in value.get_secret_value().split(","):
            key = key.strip()
            if key and (not key.isascii() or not key.isprintable() or " " in key):
                raise ValueError("must be printable ASCII without spaces (it travels in a header)")
        return value

    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Log level of the service and uvicorn."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: one readable line per record; json: one JSON object per line "
        "(time, level, logger, message, request_id) for log collectors.",
    )

    max_seq_len: int = Field(
        512, ge=1, description="Longest sequence accepted (also capped by each model's own limit)."
    )
    max_sequences: int = Field(
        64,
        ge=1,
        description="Most sequences in one request whose answer is per token (embeddings, "
        "attention, hidden states); also the size of the parts a larger pooled request runs in.",
    )
    max_tokens: int = Field(16384, ge=1, description="Most tokens (sum of lengths) in one request.")
    max_pooled_sequences: int = Field(
        2048,
        ge=1,
        description="Most sequences in one request that asks only for pooled vectors (pooling "
        "set, no per-token embeddings, attention or hidden states): OpenAI accepts 2,048 inputs "
        "and LangChain sends 1,000. The engine runs it in parts of ATTNSERVE_MAX_SEQUENCES.",
    )
    max_pooled_tokens: int = Field(
        262144,
        ge=1,
        description="Most tokens in one request that asks only for pooled vectors.",
    )
    max_body_bytes: int = Field(32 * MiB, ge=1024, description="Largest request body accepted.")
    max_response_bytes: int = Field(
        128 * MiB,
        ge=1024,
        description="Largest response the server will build; larger asks are refused up front.",
    )

    intra_op_threads: int = Field(
        0, ge=0, description="onnxruntime intra-op threads per session (0: one per core)."
    )
    inter_op_threads: int = Field(1, ge=1, description="onnxruntime inter-op threads.")
    providers: str = Field(
        "CPUExecutionProvider",
        description="onnxruntime execution providers, comma-separated in order of preference "
        "(e.g. 'CUDAExecutionProvider,CPUExecutionProvider' with onnxruntime-gpu installed); "
        "the server refuses to start when one is not available in this onnxruntime.",
    )

    @property
    def provider_list(self) -> list[str]:
        return [p.strip() for p in self.providers.split(",") if p.strip()]

    max_concurrent_codecs: int = Field(
        1,
        ge=1,
        description="Requests decoded, tokenized or serialised off the event loop at once "
        "(small bodies, parsed on the loop, have one more slot of their own). More lets codec "
        "work take the cores onnxruntime runs on.",
    )

    allow_spinning: bool = Field(
        False,
        description="Let onnxruntime threads spin while idle: a little more peak throughput "
        "for much more idle CPU.",
    )
    cpu_mem_arena: bool = Field(
        True,
        description="onnxruntime's memory arena for the embeddings and hidden-state graphs "
        "(the attention graph never has one): allocations are reused, but the arena keeps "
        "the largest run's memory for good; false returns it after each run "
        "(bench/bench_shape_churn.py measures both).",
    )

    max_batch_tokens: int = Field(
        4096,
        ge=1,
        description="Padded tokens (sequences x longest) per onnxruntime run formed by the "
        "batcher; sequences from queued requests are grouped by length up to this budget.",
    )
    max_batch_attention_floats: int = Field(
        32 * 1024 * 1024,
        ge=1,
        description="Attention weights (sequences x layers x heads x longest²) per run of "
        "the attention graph: bounds its memory, which grows with the square of the length.",
    )
    max_queued_requests: int = Field(
        256,
        ge=1,
        description="Requests past their body read and not yet answered, at most; beyond "
        "it new ones get 429 (a body still arriving holds no slot).",
    )
    max_inflight_bytes: int = Field(
        2048 * MiB,
        ge=16 * MiB,
        description="Memory budget of all requests in progress: bodies as they arrive (x4 "
        "for parsing) plus each admitted request's working memory (decoded inputs, model "
        "outputs, answer). Beyond it new requests get 429; one request needing more than "
        "all of it gets 413.",
    )
    body_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a request may take to send its whole body; slower ones get 408.",
    )
    request_timeout: float = Field(
        60.0,
        gt=0,
        description="Deadline of a request, from its arrival, unless its X-Request-Timeout "
        "header asks for less; one still queued at its deadline is dropped and gets 504.",
    )
    drain_seconds: float = Field(
        5.0,
        ge=0,
        description="After SIGTERM: seconds to keep listening (readiness 503, new work 503) "
        "while load balancers stop routing here; accepted requests are answered meanwhile. "
        "SIGINT (Ctrl-C) skips it.",
    )
    shutdown_timeout: float = Field(
        30.0,
        gt=0,
        description="After SIGTERM: seconds until the process has exited (status 0), drain "
        "included, whatever clients do; requests still running 2.5 s before it are answered "
        "503 shutting_down (the time to send that and stop the server).",
    )
    max_connections: int = Field(
        4096,
        ge=16,
        description="Open client connections, at most (also kept below the file-descriptor "
        "limit, which the server raises to its hard limit at start); beyond it new "
        "connections are closed at once and a warning logged.",
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a connection may take to send a request's headers (also how "
        "long a new connection may stay silent); then it is closed.",
    )
    send_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a client may leave an answer unread (the socket's send buffer "
        "full, no progress); then the connection is dropped and the answer's memory freed.",
    )
    keep_alive_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds an idle keep-alive connection stays open; keep it above the "
        "idle timeout of clients and load balancers, so they close first (a request sent "
        "just as the server closes is lost to the client).",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Request line plus headers, at most; beyond it 431 and the connection "
        "is closed.",
    )
    max_headers: int = Field(100, ge=8, description="Header lines per request, at most (431).")
    warmup: bool = Field(True, description="Run a warm-up inference per graph before ready.")
    openai_truncate: bool = Field(
        False,
        description="POST /v1/embeddings: cut texts longer than the model's max_seq_len instead "
        "of refusing them with 400 (OpenAI's API refuses them).",
    )

    @model_validator(mode="after")
    def _drain_within_shutdown(self) -> Settings:
        if self.drain_seconds >= self.shutdown_timeout:
            raise ValueError(
                f"drain_seconds ({self.drain_seconds}) must be shorter than shutdown_timeout "
                f"({self.shutdown_timeout}): the drain is part of the shutdown"
            )
        return self


def _key_list(keys: SecretStr | None) -> list[str]:
    """A comma-separated list of keys, blanks dropped."""
    if keys is None:
        return []
    return [k.strip() for k in keys.get_secret_value().split(",") if k.strip()]
