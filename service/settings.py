"""Service settings: the only reader of the environment (prefix ``ATTNSERVE_``).

Each field's description (Markdown) is its row of docs/deployment.md's settings
table, with its default and lower bound: ``python -m service.settings`` prints
the table and a test checks that the page holds it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


class Settings(BaseSettings):
    """Every knob of the server; each can be set as ``ATTNSERVE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="ATTNSERVE_", extra="ignore")

    model_repository: Path = Field(
        Path("models"),
        description=(
            "Directory with one sub-directory per model (written by `python -m model_export`); the "
            "server refuses to start if it is missing, empty, or a model's files do not match "
            "their SHA-256 in its manifest (`config.json`), or the manifest's `format_version` is "
            "not one this server reads."
        ),
    )
    default_model: str | None = Field(
        None, description="Model for requests that name none; unset: the alphabetically first."
    )
    model_control: Literal["none", "explicit", "poll"] = Field(
        "none",
        description=(
            "`none`: every model directory loads at start, for good; `explicit`: the default model "
            "and `ATTNSERVE_LOAD_MODELS` load at start, others through the repository API (`POST "
            "/v2/repository/models/{name}/load`, and `unload`); `poll`: the repository is "
            "rescanned every `ATTNSERVE_POLL_SECONDS`, new or changed directories are loaded "
            "beside the serving version and swapped in, removed ones unloaded."
        ),
    )
    version_policy: Literal["latest", "all"] = Field(
        "latest",
        description=(
            "Which versions of a model directory (`<name>/<version>/`) are loaded: `latest`, only "
            "the highest (a new one replaces it; the old is freed after its last run); `all`, "
            "every one, the highest serving unless a request names another."
        ),
    )
    load_models: str = Field(
        "",
        description=(
            "`explicit` mode: comma-separated model directories loaded at start besides the "
            "default model (`*`: all of them)."
        ),
    )
    export_models: str = Field(
        "",
        description=(
            "Checkpoints to serve by name, comma-separated, each `[name=]spec`: a checkpoint "
            "directory, or a Hugging Face id with an optional `@revision`. Before the server "
            "listens, each is exported into `ATTNSERVE_MODEL_REPOSITORY/<name>` (`name`, else "
            "the spec's last part: `BAAI/bge-small-en-v1.5` serves as `bge-small-en-v1.5`) by "
            "`python -m model_export` in a subprocess, which needs the `export` extra (torch); "
            "the export is pinned to its spec (`attnserve-export.json`), so later starts serve "
            "it without exporting, or torch. A directory pinned to another spec, or not "
            "written so, is refused: the server does not start. The first is the default "
            "model unless `ATTNSERVE_DEFAULT_MODEL` is set; `explicit` mode loads each at start "
            "(see [Serving a model by its name](models.md#serving-a-model-by-its-name))."
        ),
    )
    poll_seconds: float = Field(
        15.0, gt=0, description="`poll` mode: seconds between two scans of the repository."
    )
    model_memory_bytes: int = Field(
        8192 * MiB,
        ge=16 * MiB,
        description=(
            "Memory budget of the loaded models. A load is priced at its estimate from its files "
            "and its architecture (at least one byte per weight of each graph) and refused (400 "
            "`load_failed`, with the numbers; at start: the server does not start) before any file "
            "is hashed or opened if that does not fit beside what is held; a loaded version is "
            "held at what its load and warm-up added to the process's PSS (pre-packed weights "
            "shared through the session cache counted once; the estimate where PSS cannot be "
            "read: `attnserve_model_memory_bytes`). A swap holds both versions until the old "
            "one's last run ends."
        ),
    )
    follow_symlinks: bool = Field(
        False,
        description=(
            "Follow symbolic links that leave the model repository (a model directory, or a file "
            "its `config.json` names, linked from elsewhere). `false`: such a model is refused, so "
            "whoever can write a model directory cannot make the server read files beyond the "
            "repository (see [models.md](models.md#a-model-directory-is-untrusted-input)); links "
            "inside it are always followed."
        ),
    )
    response_cache_bytes: int = Field(
        64 * MiB,
        ge=0,
        description=(
            "Bytes of answers kept for requests that come again (keyed by model version, exact "
            "inputs and options, and API key; least recently used evicted first); `0` turns the "
            "cache off."
        ),
    )
    response_cache_shared: bool = Field(
        False,
        description=(
            "Without `ATTNSERVE_API_KEY` the server cannot tell callers apart, and a hit (its "
            "`x-cache` header, its speed) would tell one caller what another sent: the cache is "
            "then off unless this is `true` (one tenant, or callers that may see each other's "
            "texts). With API keys each key has its own partition either way."
        ),
    )
    otlp_endpoint: str | None = Field(
        None,
        description=(
            "OpenTelemetry: the OTLP/HTTP collector's base URL (e.g. "
            "`http://otel-collector:4318`); one span per request, with its phases, is sent to "
            "`<endpoint>/v1/traces`. Unset: no traces are made or sent."
        ),
    )
    host: str = Field(
        "127.0.0.1", description="Interface to listen on (HTTP, and gRPC on its own port)."
    )
    port: int = Field(8000, ge=0, le=65535, description="TCP port of the HTTP API.")
    tei: bool = Field(
        True,
        description=(
            "Serve Hugging Face text-embeddings-inference's routes (`POST /`, `/embed`, "
            "`/embed_all`, `/embed_sparse`, `/similarity`, `/tokenize`, `/decode`, `/invocations`, "
            "`GET /info`, `/health`, `/ping`) for its clients."
        ),
    )
    grpc_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description=(
            "TCP port of the Open Inference Protocol over gRPC (Triton's default 8001), on "
            "`ATTNSERVE_HOST`, with the same engine and limits as HTTP; `0` turns gRPC off."
        ),
    )
    api_key: SecretStr | None = Field(
        None,
        description=(
            "Comma-separated keys (a key cannot hold a comma), any of which is accepted: when set, "
            "`/v1/*`, `/v2/models/*` and TEI's routes (but `/health`, `/ping`) require "
            "`Authorization: Bearer <key>` (401 otherwise); health, metrics and server metadata "
            "stay open for probes and scrapers. Printable ASCII without spaces, else the server "
            "refuses to start. Several keys let one be rotated without a restart of every client. "
            "Listening on a non-loopback address without a key logs a warning."
        ),
    )

    admin_keys: SecretStr | None = Field(
        None,
        description=(
            "Comma-separated keys for the model repository API (`/v2/repository/*`, "
            "`Authorization: Bearer <admin key>`); unset while `ATTNSERVE_API_KEY` is set: the "
            "repository API is refused (inference keys never manage models)."
        ),
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
        "info",
        description=(
            "Log level of the service and uvicorn: `critical`, `error`, `warning`, `info` or "
            "`debug`."
        ),
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description=(
            "`text`: one readable line per record; `json`: one JSON object per line (`time`, "
            "`level`, `logger`, `message`, `request_id`, `exception`), uvicorn's access log "
            "included, for log collectors."
        ),
    )

    max_seq_len: int = Field(
        8192,
        ge=1,
        description=(
            "Tokens per sequence (413 beyond), further capped by each model's own `max_seq_len` "
            "and by the longest sequence whose attention scratch fits in "
            "`ATTNSERVE_MAX_INFLIGHT_BYTES` (it grows with the square of the length: "
            "`service/attention_scratch.py`); `/v1/models` and the 413 say which bound "
            "applies. A 12-head model's 8,192 tokens need about 9 GiB of it (see [Long inputs]"
            "(benchmarks.md#long-inputs-benchlong_inputspy))."
        ),
    )
    max_sequences: int = Field(
        64,
        ge=1,
        description=(
            "Sequences per request whose answer is per token (embeddings, attention, hidden "
            "states) (413); also the size of the parts a larger pooled request runs in."
        ),
    )
    max_tokens: int = Field(
        16384, ge=1, description="Tokens per request, summed over its sequences (413)."
    )
    max_pooled_sequences: int = Field(
        2048,
        ge=1,
        description=(
            "Sequences per request that asks only for pooled vectors (`/v1/embeddings`; "
            "`/v1/encode` with `pooling` and `return_embeddings: false`; `/v2` and gRPC asking "
            "only for `pooled`) (413): OpenAI accepts 2,048 inputs and LangChain sends 1,000. The "
            "engine runs it in parts of `ATTNSERVE_MAX_SEQUENCES`."
        ),
    )
    max_pooled_tokens: int = Field(
        262144,
        ge=1,
        description="Tokens per request that asks only for pooled vectors (413).",
    )
    max_body_bytes: int = Field(32 * MiB, ge=1024, description="Request body size (413).")
    max_response_bytes: int = Field(
        128 * MiB,
        ge=1024,
        description=(
            "Response size, bounded from above before inference (413): 17 bytes per number for "
            "`float` (the longest float32 orjson writes, with its separator, plus brackets) and "
            "16/3 for `base64`, plus each protocol's envelope and token strings. Answers whose "
            "size depends on values are priced at their worst case: a sparse vector's nonzeros "
            "at the whole vocabulary (SPLADE), a word per token (BM42) or `top_k`, each its "
            "index and value, and its token with `return_text` (the 413 says how many texts "
            "fit); a thresholded attention row at ⌊1/t⌋ + 1 keys, or every key where rows "
            "need not sum to 1. A built sparse answer is checked against that price before "
            "it is written."
        ),
    )

    intra_op_threads: int = Field(
        0, ge=0, description="onnxruntime intra-op threads per session (`0`: one per core)."
    )
    inter_op_threads: int = Field(1, ge=1, description="onnxruntime inter-op threads.")
    inference_lanes: int = Field(
        2,
        ge=1,
        le=64,
        description=(
            "onnxruntime runs that may execute at once. Small runs share the lanes, large ones "
            "run alone, as measured per graph at start-up (see [Inference lanes]"
            "(architecture.md#inference-lanes)); `1`: one run at a time."
        ),
    )
    shared_run_ms: float | None = Field(
        None,
        ge=0,
        description=(
            "Runs whose modelled time alone is at most this many milliseconds share the "
            "inference lanes; a graph whose cost model has no fit yet counts its runs as small. "
            "Unset: measured per graph at start-up (two runs at once against one at a time); "
            "`0`: every run alone."
        ),
    )
    lane_sessions: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "One session per inference lane for each pre-packed graph, with the intra-op "
            "threads split between the lanes (2 cores, 2 lanes: one thread each), beside the "
            "graph's own session: a small run that overlaps another then runs on its lane's "
            "session, a large one on the graph's, as measured per graph and shape at start-up "
            "(see [Inference lanes](architecture.md#inference-lanes)). `auto`: only for the "
            "graphs opened from the session cache, whose pre-packed weights every session "
            "shares; `on`: also without it, each such session then holding its own pre-packed "
            "copy of the encoder's weights; `off`: none."
        ),
    )
    providers: str = Field(
        "CPUExecutionProvider",
        description=(
            "onnxruntime execution providers, comma-separated in order of preference "
            "(`CUDAExecutionProvider,CPUExecutionProvider` with onnxruntime-gpu installed, "
            "`TensorrtExecutionProvider,...`); the server refuses to start when this onnxruntime "
            "lacks one (see [GPUs](#gpus))."
        ),
    )

    @property
    def provider_list(self) -> list[str]:
        return [p.strip() for p in self.providers.split(",") if p.strip()]

    prepacked_graphs: str = Field(
        "embeddings,attention",
        description=(
            "Graphs whose sessions pre-pack their weights, comma-separated (`embeddings`, "
            "`hidden_states`, `attention`, `compact_attention`, `selected_attention`, `sparse`; "
            "empty for none). A "
            "pre-packed session runs its matrix products faster, most on small runs, but holds "
            "a copy of the encoder's weights of its own; the others share one mapping of the "
            "model's `weights.bin`. "
            "Text asking only for embeddings runs on `embeddings`. Exports before format 5 keep "
            "a copy per graph and always pre-pack (measured in "
            "[benchmarks.md](benchmarks.md#memory-weights-held-once))."
        ),
    )

    @property
    def prepacked_graph_labels(self) -> frozenset[str]:
        return frozenset(
            label.strip() for label in self.prepacked_graphs.split(",") if label.strip()
        )

    @field_validator("prepacked_graphs")
    @classmethod
    def _known_graphs(cls, value: str) -> str:
        known = (
            "embeddings",
            "hidden_states",
            "attention",
            "compact_attention",
            "selected_attention",
            "sparse",
        )
        unknown = [g.strip() for g in value.split(",") if g.strip() and g.strip() not in known]
        if unknown:
            raise ValueError(f"unknown graphs {unknown}: choose from {', '.join(known)}")
        return value

    session_cache_dir: str = Field(
        "auto",
        description=(
            "Where each pre-packed graph's optimised form (its weights in the layout the matrix "
            "kernels want, in a file sessions map) is made at load and reused by later starts: "
            "every session then shares one copy instead of packing its own. `auto`: "
            "`$XDG_CACHE_HOME/attnserve/sessions` (else `~/.cache/attnserve/sessions`; off "
            "with neither a home directory nor `XDG_CACHE_HOME`); empty: off (each session packs "
            "its own copy). The files are specific to this machine's "
            "CPU and onnxruntime, so they never go in a model directory. The server makes the "
            "directory (mode 0700) and uses it only if no other user can write it; otherwise, or "
            "where it cannot be written, it packs in memory, with one log line (see "
            "[the session cache](#the-session-cache))."
        ),
    )
    session_cache_bytes: int = Field(
        4096 * MiB,
        ge=0,
        description=(
            "Disk the session cache may take: after an entry is made, the least recently used "
            "others are removed until the total fits; an entry larger than this alone is not "
            "kept (its graph packs in memory as without a cache)."
        ),
    )

    @property
    def session_cache_path(self) -> Path | None:
        """The session cache's directory (``session_cache_dir`` resolved); None: off."""
        chosen = self.session_cache_dir.strip()
        if not chosen:
            return None
        if chosen != "auto":
            return Path(chosen).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        try:
            base = Path(xdg) if xdg else Path.home() / ".cache"
        except (RuntimeError, KeyError):  # no $HOME and a uid with no passwd entry
            return None
        return base / "attnserve" / "sessions"

    max_concurrent_codecs: int = Field(
        1,
        ge=1,
        description=(
            "Requests decoded, tokenized or serialised on worker threads at once (small array-only "
            "bodies are handled on the event loop; other small bodies, up to ~64 KiB, have one "
            "more slot of their own, so a one-text request is never tokenized after megabyte "
            "bodies). More lets codec work take the cores onnxruntime runs on (measured: 1 and 4 "
            "within noise on W2/W3, see [benchmarks.md](benchmarks.md))."
        ),
    )

    allow_spinning: bool = Field(
        False,
        description=(
            "Let onnxruntime's threads spin-wait between runs: lower latency at low load, for "
            "cores burnt while waiting under load (an idle server burns none either way; see "
            "[Sizing on a small CPU](#sizing-on-a-small-cpu))."
        ),
    )
    cpu_mem_arena: bool = Field(
        True,
        description=(
            "onnxruntime's memory arena for the embeddings and hidden-state graphs (the attention "
            "graph never has one): allocations are reused, but the arena keeps the largest run's "
            "memory for good; `false` returns it after each run (measured in "
            "[benchmarks.md](benchmarks.md#memory-under-shape-churn-benchshape_churnpy))."
        ),
    )

    max_batch_tokens: int = Field(
        4096,
        ge=1,
        description=(
            "Padded tokens (sequences × longest) per onnxruntime run the batcher forms from queued "
            "requests, grouped by length."
        ),
    )
    max_batch_attention_floats: int = Field(
        32 * 1024 * 1024,
        ge=1,
        description=(
            "Attention weights (sequences × layers × heads × longest²) per run of the attention "
            "graph: bounds its memory, which grows with the square of the length; also "
            "a SPLADE graph's logits (sequences × longest × vocabulary) per run."
        ),
    )
    max_queued_requests: int = Field(
        256,
        ge=1,
        description=(
            "Requests in progress: counted once the body is read, released once the answer has "
            "been sent; beyond it 429 with `Retry-After` (a body still arriving holds no slot)."
        ),
    )
    max_inflight_bytes: int = Field(
        2048 * MiB,
        ge=16 * MiB,
        description=(
            "Memory all requests in progress may hold: what each body will cost to parse, as its "
            "bytes arrive (a JSON body ~13× its bytes plus 40 bytes per value, 64 per array or "
            "object and 48 per string, measured with orjson: `service/protocols/wire.py`; binary "
            "tensor bytes ×2; what a `Content-Length` announces costs nothing until sent), then "
            "each admitted request's working memory (decoded inputs, the model outputs kept per "
            "sequence, the answer's arrays and bytes, and onnxruntime's attention scratch for its "
            "longest sequence, which grows with the square of its length: "
            "`service/attention_scratch.py`), held until the answer has been "
            "sent. Full: "
            "429 with `Retry-After`; one request needing more than all of it: 413 (see [Memory "
            "budget](#memory-budget))."
        ),
    )
    body_timeout: float = Field(
        30.0,
        gt=0,
        description=(
            "Seconds to receive a whole body (408), or a gRPC call's message (`DEADLINE_EXCEEDED`)."
        ),
    )
    request_timeout: float = Field(
        60.0,
        gt=0,
        description=(
            "Deadline of each inference request from its arrival; a client may ask for less with "
            "the header `X-Request-Timeout: <seconds>` (float). Still queued at the deadline: "
            "dropped before inference, 504 `deadline_exceeded`."
        ),
    )
    drain_seconds: float = Field(
        5.0,
        ge=0,
        description=(
            "After SIGTERM: seconds the listener stays open answering readiness and new work with "
            "503 `shutting_down` while load balancers stop routing here; accepted requests are "
            "answered meanwhile (see [Shutdown and drain](#shutdown-and-drain)). SIGINT "
            "(Ctrl-C) skips it."
        ),
    )
    shutdown_timeout: float = Field(
        30.0,
        gt=0,
        description=(
            "After SIGTERM: seconds until the process has exited with status 0, drain included, "
            "whatever clients do; requests still running 2.5 s before it are answered 503 "
            "`shutting_down` (the time to send that and stop the server). Must exceed "
            "`ATTNSERVE_DRAIN_SECONDS`."
        ),
    )
    max_connections: int = Field(
        4096,
        ge=16,
        description=(
            "Open client connections; also kept 64 below the file-descriptor limit, whose soft "
            "value the server raises to the hard one at start. Beyond it new connections are "
            "closed at once and a warning is logged (at most every 10 s)."
        ),
    )
    grpc_max_connections: int = Field(
        1024,
        ge=1,
        description=(
            "Open gRPC connections (each takes at most 100 concurrent calls). Beyond it grpc "
            "closes a new connection as soon as it is accepted: its client's calls fail "
            "`UNAVAILABLE` and it retries elsewhere; the connections already open are served."
        ),
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description=(
            "Seconds a connection may take to send a request's headers, or stay silent after "
            "connecting (or after an answer, for the rest of an early-refused body); then it is "
            "answered 408 if a request had begun, and closed."
        ),
    )
    send_timeout: float = Field(
        30.0,
        gt=0,
        description=(
            "Seconds a client may leave its answer unread (send buffer full, no progress; over "
            "gRPC, the whole answer not taken by HTTP/2 flow control); then the connection is "
            "dropped and the answer's memory freed. Answers stay counted in the memory budget "
            "until sent."
        ),
    )
    keep_alive_timeout: float = Field(
        30.0,
        gt=0,
        description=(
            "Seconds an idle keep-alive connection stays open; keep it above the idle timeout of "
            "clients and load balancers, so they close first: a request sent just as the server "
            "closes is lost to the client. httpx closes after 5 s; the shipped "
            "`deploy/nginx/nginx.conf` after 20 s (`keepalive_timeout 20s`), so 30 suits it; "
            "behind an nginx left at its default upstream `keepalive_timeout` of 60 s, set 75."
        ),
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Request line plus headers (431, and the connection is closed).",
    )
    max_headers: int = Field(100, ge=8, description="Header lines per request (431).")
    warmup: bool = Field(True, description="Run one inference per graph before answering ready.")
    openai_truncate: bool = Field(
        False,
        description=(
            "`POST /v1/embeddings`: cut texts longer than the model's `max_seq_len` instead of "
            "refusing them (400 `context_length_exceeded`, as OpenAI's API does)."
        ),
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
