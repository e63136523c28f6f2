"""Service settings: the only reader of the environment (prefix ``ATTNSERVE_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
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
    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    api_key: SecretStr | None = Field(
        None,
        description="When set, /v1/* requires 'Authorization: Bearer <key>' (health and "
        "metrics stay open for probes and scrapers).",
    )

    @field_validator("api_key")
    @classmethod
    def _empty_key_is_no_key(cls, value: SecretStr | None) -> SecretStr | None:
        # ATTNSERVE_API_KEY="" must not mean "any Bearer token passes".
        return value if value is not None and value.get_secret_value() else None

    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Log level of the service and uvicorn."
    )

    max_seq_len: int = Field(
        512, ge=1, description="Longest sequence accepted (also capped by each model's own limit)."
    )
    max_sequences: int = Field(64, ge=1, description="Most sequences in one request.")
    max_tokens: int = Field(16384, ge=1, description="Most tokens (sum of lengths) in one request.")
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
    allow_spinning: bool = Field(
        False,
        description="Let onnxruntime threads spin while idle: a little more peak throughput "
        "for much more idle CPU.",
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
        256, ge=1, description="Requests in progress before new ones get 429."
    )
    warmup: bool = Field(True, description="Run a warm-up inference per graph before ready.")
    openai_truncate: bool = Field(
        False,
        description="POST /v1/embeddings: cut texts longer than the model's max_seq_len instead "
        "of refusing them with 400 (OpenAI's API refuses them).",
    )
