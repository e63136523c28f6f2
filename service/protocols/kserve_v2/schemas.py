"""The Open Inference Protocol's wire contract, as pydantic models (OpenAPI and metadata).

Infer bodies are parsed by the codec (binary framing, tensors straight to numpy);
these models describe them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Datatype = Literal["FP32", "INT64", "INT32", "BOOL", "BYTES"]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int] = Field(description="-1 marks a dynamic axis.")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class RepositoryModel(BaseModel):
    """One model directory in ``POST /v2/repository/index`` (Triton's repository extension)."""

    name: str
    version: str = Field(description="The serving version, or the one a load would serve.")
    state: Literal["READY", "UNAVAILABLE", "LOADING"]
    reason: str = Field(description="Why it does not serve ('unloaded', a failed load...).")


class RepositoryIndexRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    ready: bool = Field(False, description="Only the models that serve.")


class ModelReady(BaseModel):
    name: str
    ready: bool


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: dict[str, Any] | None = Field(
        None, description="binary_data_size: its bytes follow the JSON header."
    )
    data: list[Any] | None = Field(None, description="Row-major values, flat or nested.")


class RequestOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = Field(
        None, description="binary_data: answer this output as raw bytes after the header."
    )


class InferRequest(BaseModel):
    """``POST /v2/models/{model}/infer``. With the binary extension the body is this JSON
    (its length in the ``Inference-Header-Content-Length`` header) followed by the raw
    little-endian bytes of the inputs that declare ``binary_data_size``, in order."""

    id: str | None = None
    parameters: dict[str, Any] | None = Field(
        None,
        description="pooling (mean, cls, max, last) for the pooled output; normalize (bool); "
        "truncate (bool, text input); binary_data_output (bool: every output as raw bytes).",
    )
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = Field(None, description="Default: every output.")


class ResponseOutput(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[ResponseOutput]


class ErrorBody(BaseModel):
    """Every /v2 error; tritonclient reads ``error`` only."""

    model_config = ConfigDict(extra="forbid")  # the schema says exactly these two
    error: str
    error_type: str
