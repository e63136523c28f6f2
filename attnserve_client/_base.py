"""What the sync and async clients share: configuration, request bodies, retry policy.

The two clients differ only in how they wait (``time.sleep`` vs
``asyncio.sleep``) and send; everything decidable without I/O lives here.
"""

from __future__ import annotations

import email.utils
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

import httpx
import numpy as np

from attnserve_client import _binary
from attnserve_client import _constants as C
from attnserve_client._exceptions import (
    APIConnectionError,
    APIResponseError,
    APITimeoutError,
    status_error,
)
from attnserve_client._types import ModelCard, encode_array

T = TypeVar("T")
Reduce = Literal["none", "mean", "max", "rollout"]
Pooling = Literal["none", "mean", "cls", "max"]
# How arrays travel: "binary" raw float32 (the Open Inference Protocol's binary tensors),
# "base64" or "float" in JSON; None: binary when the server offers it, else base64.
WireFormat = Literal["binary", "base64", "float"]
SequenceInput = np.ndarray | str
Inputs = np.ndarray | Sequence[SequenceInput]


def split_inputs(inputs: Inputs) -> list[SequenceInput]:
    """[batch, seq, d] array, or a list of [seq_i, d] arrays / texts -> a list of sequences."""
    if isinstance(inputs, np.ndarray):
        if inputs.ndim == 2:
            raise ValueError("inputs is one [seq, d_model] array: pass [it] or inputs[None]")
        if inputs.ndim != 3:
            raise ValueError(f"inputs must be [batch, seq, d_model], got shape {inputs.shape}")
        return list(inputs)
    if isinstance(inputs, str):
        return [inputs]
    return list(inputs)


def encode_body(
    inputs: Inputs,
    *,
    model: str | None,
    return_attention: bool,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    reduce: Reduce | None,
    pooling: Pooling | None,
    normalize: bool,
    return_embeddings: bool | None,
    truncate: bool,
    wire_format: Literal["base64", "float"],
    return_hidden_states: bool = False,
    hidden_layers: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/encode``; arrays go as base64 unless asked otherwise."""
    sequences: list[Any] = []
    for item in split_inputs(inputs):
        if isinstance(item, str):
            sequences.append(item)
            continue
        array = np.asarray(item, dtype=np.float32)
        sequences.append(encode_array(array) if wire_format == "base64" else array.tolist())
    if not sequences:
        raise ValueError("inputs is empty")
    body: dict[str, Any] = {"inputs": sequences, "encoding_format": wire_format}
    if model is not None:
        body["model"] = model
    if return_attention:
        body["return_attention"] = True
        attention: dict[str, Any] = {}
        if layers is not None:
            attention["layers"] = list(layers)
        if heads is not None:
            attention["heads"] = list(heads)
        if reduce is not None:
            attention["reduce"] = reduce
        body["attention"] = attention
    if return_hidden_states:
        body["return_hidden_states"] = True
        if hidden_layers is not None:
            body["hidden_states"] = {"layers": list(hidden_layers)}
    if pooling is not None:
        body["pooling"] = pooling
    if normalize:
        body["normalize"] = True
    if return_embeddings is not None:
        body["return_embeddings"] = return_embeddings
    if truncate:
        body["truncate"] = True
    return body


def tokenize_body(
    text: str | Sequence[str], *, model: str | None, return_embeddings: bool, truncate: bool
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/tokenize``."""
    return {
        "text": text if isinstance(text, str) else list(text),
        "model": model,
        "return_embeddings": return_embeddings,
        "truncate": truncate,
        "encoding_format": "base64",
    }


def chunks(items: Iterable[SequenceInput], size: int) -> Iterable[list[SequenceInput]]:
    if size < 1:
        raise ValueError("batch_size must be >= 1")
    chunk: list[SequenceInput] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def retry_after_seconds(response: httpx.Response | None) -> float | None:
    """The server's Retry-After (seconds or HTTP date), when it is sane."""
    if response is None:
        return None
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (ValueError, TypeError):  # neither seconds nor an HTTP date: use the backoff
            return None
    return seconds if 0 <= seconds <= C.MAX_RETRY_AFTER else None


def retry_delay(attempt: int, response: httpx.Response | None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): Retry-After, else backoff."""
    server = retry_after_seconds(response)
    if server is not None:
        return server
    backoff = min(C.INITIAL_RETRY_DELAY * 2.0**attempt, C.MAX_RETRY_DELAY)
    return backoff * (1.0 - 0.25 * random.random())  # jitter: spread synchronized clients


def should_retry(response: httpx.Response) -> bool:
    return response.status_code in C.RETRY_STATUSES


def translate_transport_error(exc: httpx.TransportError) -> APIConnectionError:
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"the request timed out: {exc}")
    return APIConnectionError(f"could not reach the server: {exc}")


def checked_json(response: httpx.Response) -> Any:
    """The body of a successful response; an APIStatusError for any error status."""
    if not response.is_success:
        raise status_error(response)
    try:
        return response.json()
    except ValueError as exc:  # e.g. an HTML page from a proxy
        raise APIResponseError(f"the server's answer is not JSON: {response.text[:200]!r}") from exc


def binary_plan(
    inputs: Inputs, wire_format: WireFormat | None, options: dict[str, Any]
) -> _binary.Plan | None:
    """The binary form of an encode call when its wire format allows it; ValueError when
    "binary" is asked for what only JSON can say."""
    if wire_format not in (None, "binary"):
        return None
    plan = _binary.plan(split_inputs(inputs), options)
    if plan is None and wire_format == "binary":
        raise ValueError(
            "wire_format='binary' carries array inputs with every attention map and hidden "
            "state: use JSON for texts, layer/head selection, reduce or truncate"
        )
    return plan


def binary_answer(response: httpx.Response) -> bool | None:
    """What ``GET /v2`` says of the binary transport: True (offered), False (no such
    protocol here: 404, or no extension), None (no answer now: ask again later)."""
    if response.status_code == 404:
        return False
    if not response.is_success:
        return None
    try:
        extensions = response.json().get("extensions")
    except (ValueError, AttributeError):
        return False
    return isinstance(extensions, list) and _binary.EXTENSION in extensions


def default_model(cards: Sequence[ModelCard]) -> str:
    """The model the server uses when a request names none."""
    return next((c.name for c in cards if c.default), cards[0].name)


def parse_body(factory: Callable[[Any], T], body: Any) -> T:
    """Build a typed result; a body that does not fit the contract is an APIResponseError."""
    try:
        return factory(body)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise APIResponseError(f"unexpected response shape: {exc!r}") from exc


class BaseClient:
    """Configuration shared by :class:`Client` and :class:`AsyncClient`."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout | None,
        max_retries: int,
    ) -> None:
        self.base_url = (base_url or os.environ.get(C.ENV_BASE_URL) or C.DEFAULT_BASE_URL).rstrip(
            "/"
        )
        self.api_key = api_key if api_key is not None else os.environ.get(C.ENV_API_KEY)
        if self.api_key is not None and not self.api_key.isascii():
            raise ValueError("api_key must be ASCII: it travels in an HTTP header")
        self.timeout = (
            timeout
            if isinstance(timeout, httpx.Timeout)
            else httpx.Timeout(
                C.DEFAULT_TIMEOUT if timeout is None else timeout, connect=C.DEFAULT_CONNECT_TIMEOUT
            )
        )
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.max_retries = max_retries
        # Whether the server offers the binary transport: asked once (GET /v2), when needed.
        self._offers_binary: bool | None = None
        self._default_model: str | None = None

    def _deadline(self, kwargs: dict[str, Any], timeout: float | None) -> None:
        """Set a request's timeout and send it as X-Request-Timeout: the server then drops
        work still queued once this client has stopped waiting."""
        if timeout is not None:
            kwargs["timeout"] = timeout
        wait = timeout if timeout is not None else self.timeout.read
        if wait is not None:
            kwargs["headers"] = {**kwargs.get("headers", {}), "X-Request-Timeout": f"{wait:g}"}

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "attnserve-client/0.1"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers
