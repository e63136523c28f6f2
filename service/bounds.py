"""Every bound a caller or a model directory meets, as docs/security.md lists them.

Each row names where its value lives, a setting (read from ``Settings``' defaults) or
a constant (imported from the module that enforces it), and the answer a caller gets
past it (an error class, so its status and ``error_type`` are the code's). A test
keeps the page equal to ``python -m service.bounds`` and checks that every setting is
either a bound here or named in ``NOT_BOUNDS``, so a new knob cannot go unlisted.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from model_export import manifest
from service import errors, tokenizer, tracing
from service.engine import rank_explain, scope, similarity
from service.protocols.open_inference import attention as oip_attention
from service.protocols.open_inference import tensors as oip_tensors
from service.reference_tables import _default
from service.settings import Settings

PAGE = Path("docs/security.md")
# A model directory past a bound is never served: a load through the repository API is
# answered this; at start, the server does not start.
REFUSED = (
    f"model refused: {errors.LoadFailed.status_code} `{errors.LoadFailed.error_type}` "
    "(at start: the server does not start)"
)
# Settings that choose behaviour rather than bound what a caller or a model directory
# can make the server do.
NOT_BOUNDS = frozenset(
    {
        "model_repository",
        "default_model",
        "model_control",
        "version_policy",
        "load_models",
        "export_models",
        "poll_seconds",
        "response_cache_shared",
        "otlp_endpoint",
        "host",
        "port",
        "tei",
        "grpc_port",
        "api_key",
        "admin_keys",
        "log_level",
        "log_format",
        "intra_op_threads",
        "inter_op_threads",
        "inference_lanes",
        "shared_run_ms",
        "lane_sessions",
        "providers",
        "prepacked_graphs",
        "session_cache_dir",
        "session_cache_bytes",  # the server's own disk, not what a caller can make it take
        "allow_spinning",
        "cpu_mem_arena",
        "warmup",
        "openai_truncate",
        "drain_seconds",
    }
)


@dataclass(frozen=True)
class Bound:
    """One bound: what it limits, where its value lives, what a caller gets past it."""

    what: str
    setting: str | None = None  # a Settings field
    constant: tuple[object, str] | None = None  # (module, name) of a module constant
    answer: type[errors.ServiceError] | str = "-"

    def value(self) -> str:
        if self.setting is not None:
            default = Settings.model_fields[self.setting].default
            return f"{_default(self.setting, default)} (`ATTNSERVE_{self.setting.upper()}`)"
        assert self.constant is not None
        module, name = self.constant
        value = getattr(module, name)
        if isinstance(value, dict):
            return ", ".join(f"{key} ≤ {limit:,}" for key, limit in value.items())
        return f"`{value:,}`" if isinstance(value, int) else f"`{value}`"

    def answer_text(self) -> str:
        if isinstance(self.answer, str):
            return self.answer
        return f"{self.answer.status_code} `{self.answer.error_type}`"


CALLER: tuple[Bound, ...] = (
    Bound("open connections", "max_connections", answer="new connections closed at once"),
    Bound("open gRPC connections", "grpc_max_connections", answer="new connections closed at once"),
    Bound("time to send a request's headers", "header_timeout", answer="408, then closed"),
    Bound("request line plus headers", "max_header_bytes", answer="431, then closed"),
    Bound("header lines per request", "max_headers", answer="431, then closed"),
    Bound("time to send a body", "body_timeout", answer=errors.BodyTimeout),
    Bound("request body", "max_body_bytes", answer=errors.PayloadTooLarge),
    Bound("idle keep-alive connection", "keep_alive_timeout", answer="closed"),
    Bound("answer left unread", "send_timeout", answer="connection dropped, memory freed"),
    Bound("sequences per request", "max_sequences", answer=errors.PayloadTooLarge),
    Bound("tokens per request", "max_tokens", answer=errors.PayloadTooLarge),
    Bound(
        "sequences per pooled-only request", "max_pooled_sequences", answer=errors.PayloadTooLarge
    ),
    Bound("tokens per pooled-only request", "max_pooled_tokens", answer=errors.PayloadTooLarge),
    Bound(
        "tokens per sequence (less where the model's own length or the memory budget is)",
        "max_seq_len",
        answer=errors.SequenceTooLong,
    ),
    Bound(
        "answer size, priced before any run", "max_response_bytes", answer=errors.PayloadTooLarge
    ),
    Bound("memory of requests in progress", "max_inflight_bytes", answer=errors.Overloaded),
    Bound("requests queued", "max_queued_requests", answer=errors.Overloaded),
    Bound("bodies decoded at once", "max_concurrent_codecs", answer="waits its turn"),
    Bound("time to answer", "request_timeout", answer=errors.DeadlineExceeded),
    Bound(
        "time clients can hold the exit after SIGTERM",
        "shutdown_timeout",
        answer=errors.ShuttingDown,
    ),
    Bound(
        "`X-Request-Timeout` asked",
        constant=(scope, "MAX_ASKED_TIMEOUT"),
        answer=errors.InvalidHeader,
    ),
    Bound("tokens per run", "max_batch_tokens", answer="split into runs"),
    Bound("attention floats per run", "max_batch_attention_floats", answer="split into runs"),
    Bound("response cache", "response_cache_bytes", answer="oldest entries evicted"),
    Bound(
        "`traceparent`/`tracestate` length",
        constant=(tracing, "MAX_TRACE_HEADER"),
        answer="ignored",
    ),
    Bound("`tracestate` members", constant=(tracing, "MAX_TRACESTATE_MEMBERS"), answer="ignored"),
    Bound(
        "error message length (what is echoed back)",
        constant=(errors, "MAX_MESSAGE_CHARS"),
        answer="cut",
    ),
    Bound(
        "rerank explanation: top tokens",
        constant=(rank_explain, "MAX_TOP_TOKENS"),
        answer=errors.InvalidInput,
    ),
    Bound(
        "similarity explanation: top pairs",
        constant=(similarity, "MAX_TOP_PAIRS"),
        answer=errors.InvalidInput,
    ),
    Bound("`/v2` tensor rank", constant=(oip_tensors, "MAX_RANK"), answer=errors.InvalidInput),
    Bound(
        "`/v2` layer or head indices listed",
        constant=(oip_attention, "MAX_INDICES"),
        answer=errors.InvalidInput,
    ),
)

MODEL_DIRECTORY: tuple[Bound, ...] = (
    Bound("memory of the loaded models", "model_memory_bytes", answer=REFUSED),
    Bound("links leaving the repository", "follow_symlinks", answer=REFUSED),
    Bound("`config.json` size", constant=(manifest, "MAX_CONFIG_BYTES"), answer=REFUSED),
    Bound("`config.json` nesting", constant=(manifest, "MAX_CONFIG_DEPTH"), answer=REFUSED),
    Bound("file name length", constant=(manifest, "MAX_NAME_BYTES"), answer=REFUSED),
    Bound("encoder sizes", constant=(manifest, "SIZE_BOUNDS"), answer=REFUSED),
    Bound("text front end sizes", constant=(manifest, "TEXT_SIZE_BOUNDS"), answer=REFUSED),
    Bound("prompts", constant=(manifest, "MAX_PROMPTS"), answer=REFUSED),
    Bound("prompt name length", constant=(manifest, "MAX_PROMPT_NAME"), answer=REFUSED),
    Bound("prompt length (characters)", constant=(manifest, "MAX_PROMPT_CHARS"), answer=REFUSED),
    Bound("`tokenizer.json` size", constant=(tokenizer, "MAX_TOKENIZER_BYTES"), answer=REFUSED),
    Bound("stopwords file size", constant=(tokenizer, "MAX_STOPWORDS_BYTES"), answer=REFUSED),
    Bound("labels", constant=(manifest, "MAX_LABELS"), answer=REFUSED),
    Bound("label length", constant=(manifest, "MAX_LABEL_CHARS"), answer=REFUSED),
)


def table(bounds: tuple[Bound, ...]) -> str:
    lines = ["| bound | limit | past it |", "|---|---|---|"]
    lines += [f"| {b.what} | {b.value()} | {b.answer_text()} |" for b in bounds]
    return "\n".join(lines)


def tables() -> list[str]:
    """The page's two tables: a caller's bounds, then a model directory's."""
    return [table(CALLER), table(MODEL_DIRECTORY)]


def rewrite(page: Path) -> None:
    """Replace the page's two tables (the first two whose header is the bounds header)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    header = tables()[0].split("\n")[0]
    starts = [i for i, line in enumerate(lines) if line == header]
    for start, generated in reversed(list(zip(starts, tables(), strict=True))):
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[start:end] = generated.split("\n")
    page.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:  # run from the checkout's root
        rewrite(PAGE)
    else:
        print(*tables(), sep="\n\n")
