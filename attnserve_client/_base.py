"""What the sync and async clients share: configuration, requests, answers, retries.

Every method of the clients is written once here, as a *flow*: a generator that
yields each :class:`Call` (an HTTP request, and how long to wait before sending
it), receives the answer (a transport error is thrown in at the ``yield``) and
returns the method's result. ``Client`` drives a flow with ``httpx.Client`` and
``time.sleep``, ``AsyncClient`` with ``httpx.AsyncClient`` and ``asyncio.sleep``;
how they send and sleep is all that differs. httpx drives its ``Auth.auth_flow``
generators the same way.
"""

from __future__ import annotations

import contextlib
import email.utils
import os
import random
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypeVar
from urllib.parse import quote

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
from attnserve_client._types import (
    ClassifyResult,
    EncodeResult,
    ModelCard,
    MultiVectorResult,
    RerankResult,
    SimilarityResult,
    SparseResult,
    TokenizeResult,
    encode_array,
)

T = TypeVar("T")
Reduce = Literal["none", "mean", "max", "rollout"]
Pooling = Literal["none", "mean", "cls", "max", "last"]
# How arrays travel: "binary" raw float32 (the Open Inference Protocol's binary tensors),
# "base64" or "float" in JSON; None: binary when the server offers it, else base64.
WireFormat = Literal["binary", "base64", "float"]
SequenceInput = np.ndarray | str
Inputs = np.ndarray | Sequence[SequenceInput]


@dataclass(frozen=True)
class Call:
    """One HTTP request a flow asks its client to send."""

    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)  # httpx's: json, content, headers...
    wait: float | None = None  # seconds to sleep before sending (a retry's delay, a poll's)


# Yields the calls, receives their answers (or has their transport error thrown in),
# returns the result.
Flow: TypeAlias = Generator[Call, httpx.Response, T]


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


@dataclass(frozen=True, kw_only=True)
class EncodeOptions:
    """What an ``encode`` call asks for besides its inputs: the clients' keywords."""

    model: str | None
    return_attention: bool
    layers: Sequence[int] | None
    heads: Sequence[int] | None
    reduce: Reduce | None
    pooling: Pooling | None
    normalize: bool
    return_embeddings: bool | None
    truncate: bool
    return_hidden_states: bool
    hidden_layers: Sequence[int] | None
    wire_format: WireFormat | None
    timeout: float | None
    # Late chunking: per input, its character spans [(start, end), ...] or None.
    spans: Sequence[Sequence[tuple[int, int]] | None] | None = None
    # Pooled vectors quantized (int8, uint8, binary, ubinary), with optional ranges.
    embedding_type: str = "float"
    quantization_ranges: Any = None
    # More of /v1/encode's attention object: top_k, threshold, dtype, maps, summaries...
    attention_options: Mapping[str, Any] | None = None


def merged_attention_options(
    options: Mapping[str, Any] | None, **keywords: Any
) -> Mapping[str, Any] | None:
    """``attention_options`` with the keyword forms of its entries (``top_k=``,
    ``dtype=``...) merged in; an entry given both ways is a ValueError."""
    given = {k: v for k, v in keywords.items() if v is not None}
    both = sorted(given.keys() & (options or {}).keys())
    if both:
        raise ValueError(
            f"{', '.join(both)} given both as a keyword and in attention_options: give it once"
        )
    if not given:
        return options
    listed = {k: list(v) if k in ("summaries", "maps") else v for k, v in given.items()}
    return {**(options or {}), **listed}


def encode_body(inputs: Inputs, options: EncodeOptions) -> dict[str, Any]:
    """The JSON body of ``POST /v1/encode``; arrays go as base64 unless "float" is asked."""
    wire_format = "float" if options.wire_format == "float" else "base64"
    items = split_inputs(inputs)
    spans = list(options.spans) if options.spans is not None else [None] * len(items)
    if len(spans) != len(items):
        raise ValueError(f"spans has {len(spans)} entries for {len(items)} inputs (None: no spans)")
    sequences: list[Any] = []
    for item, item_spans in zip(items, spans, strict=True):
        if item_spans is not None:
            if not isinstance(item, str):
                raise ValueError("spans apply to texts only")
            sequences.append({"text": item, "spans": [[int(a), int(b)] for a, b in item_spans]})
            continue
        if isinstance(item, str):
            sequences.append(item)
            continue
        array = np.asarray(item, dtype=np.float32)
        sequences.append(encode_array(array) if wire_format == "base64" else array.tolist())
    if not sequences:
        raise ValueError("inputs is empty")
    body: dict[str, Any] = {"inputs": sequences, "encoding_format": wire_format}
    if options.model is not None:
        body["model"] = options.model
    if options.return_attention:
        body["return_attention"] = True
        attention: dict[str, Any] = {}
        if options.layers is not None:
            attention["layers"] = list(options.layers)
        if options.heads is not None:
            attention["heads"] = list(options.heads)
        if options.reduce is not None:
            attention["reduce"] = options.reduce
        attention.update(options.attention_options or {})
        body["attention"] = attention
    if options.return_hidden_states:
        body["return_hidden_states"] = True
        if options.hidden_layers is not None:
            body["hidden_states"] = {"layers": list(options.hidden_layers)}
    if options.pooling is not None:
        body["pooling"] = options.pooling
    if options.embedding_type != "float":
        body["embedding_type"] = options.embedding_type
        body["encoding_format"] = "base64"  # integers keep their dtype as raw bytes
        if options.quantization_ranges is not None:
            body["quantization_ranges"] = np.asarray(options.quantization_ranges).tolist()
    if options.normalize:
        body["normalize"] = True
    if options.return_embeddings is not None:
        body["return_embeddings"] = options.return_embeddings
    if options.truncate:
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


def batches(
    sequences: Iterable[SequenceInput], batch_size: int, concurrency: int, progress: bool
) -> tuple[list[list[SequenceInput]], Any]:
    """``encode_many``'s requests, and its progress bar (None unless asked for)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    parts = list(chunks(sequences, batch_size))
    if not progress:
        return parts, None
    try:
        from tqdm import tqdm
    except ImportError as exc:  # pragma: no cover - tqdm ships with the client extra
        raise ImportError("progress=True needs tqdm: pip install tqdm") from exc
    return parts, tqdm(total=sum(len(p) for p in parts), unit="seq", desc="encode")


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


def trace_context(kwargs: dict[str, Any]) -> None:
    """The caller's current trace (W3C ``traceparent``/``tracestate``), when OpenTelemetry
    is installed and a span is active: the server's span of the request becomes its child."""
    try:
        from opentelemetry import propagate
    except ImportError:  # optional: the SDK needs only httpx and numpy
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if carrier:
        kwargs["headers"] = {**kwargs.get("headers", {}), **carrier}


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


def binary_plan(inputs: Inputs, options: EncodeOptions) -> _binary.Plan | None:
    """The binary form of an encode call when its wire format allows it; ValueError when
    "binary" is asked for what only JSON can say."""
    if options.wire_format not in (None, "binary") or options.embedding_type != "float":
        return None  # quantized vectors come as JSON (base64 of their bytes)
    plan = _binary.plan(split_inputs(inputs), vars(options))
    if plan is None and options.wire_format == "binary":
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
    """Configuration and flows shared by :class:`Client` and :class:`AsyncClient`."""

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

    def _http_options(self) -> dict[str, Any]:
        """What ``httpx.Client`` and ``httpx.AsyncClient`` are made with, but the transport."""
        headers = {"Accept": "application/json", "User-Agent": C.USER_AGENT}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return {"base_url": self.base_url, "headers": headers, "timeout": self.timeout}

    def _deadline(self, kwargs: dict[str, Any], timeout: float | None) -> None:
        """Set a request's timeout and send it as X-Request-Timeout: the server then drops
        work still queued once this client has stopped waiting."""
        if timeout is not None:
            kwargs["timeout"] = timeout
        wait = timeout if timeout is not None else self.timeout.read
        if wait is not None:
            kwargs["headers"] = {**kwargs.get("headers", {}), "X-Request-Timeout": f"{wait:g}"}

    # The flows: one per method of the clients, and the pieces they share.

    def _send(
        self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any
    ) -> Flow[httpx.Response]:
        """Send with retries on connection errors, 408, 429 and 5xx; the last answer.
        The one place the retry policy is applied."""
        self._deadline(kwargs, timeout)
        trace_context(kwargs)
        wait: float | None = None
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = yield Call(method, path, kwargs, wait)
            except httpx.TransportError as exc:
                if last:
                    raise translate_transport_error(exc) from exc
                wait = retry_delay(attempt, None)
                continue
            if should_retry(response) and not last:
                wait = retry_delay(attempt, response)
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(
        self, method: str, path: str, *, json: Any = None, timeout: float | None = None
    ) -> Flow[Any]:
        """Send with retries; the JSON answer, or a typed error."""
        return checked_json((yield from self._send(method, path, json=json, timeout=timeout)))

    def _binary_target(self, model: str | None, *, ask: bool) -> Flow[str | None]:
        """The model to send binary requests to; None when the server offers no binary
        (``ask``: find out once; else assume it does)."""
        if self._offers_binary is None and not ask:
            self._offers_binary = True
        if self._offers_binary is None:
            # One attempt: on any doubt this call goes as JSON and a later one asks again.
            with contextlib.suppress(httpx.TransportError):
                self._offers_binary = binary_answer((yield Call("GET", "/v2")))
        if not self._offers_binary:
            return None
        if model is None and self._default_model is None:
            self._default_model = default_model((yield from self._models()))
        return model or self._default_model

    def _encode(self, inputs: Inputs, options: EncodeOptions) -> Flow[EncodeResult]:
        plan = binary_plan(inputs, options)
        target = None
        if plan is not None:
            target = yield from self._binary_target(options.model, ask=options.wire_format is None)
        if plan is not None and target is not None:
            answer = yield from self._send(
                "POST",
                plan.path(target),
                content=plan.body,
                headers=plan.headers,
                timeout=options.timeout,
            )
            return plan.result(answer)
        body = encode_body(inputs, options)
        answer = yield from self._request("POST", "/v1/encode", json=body, timeout=options.timeout)
        return parse_body(EncodeResult.from_json, answer)

    def _tokenize(
        self,
        text: str | Sequence[str],
        *,
        model: str | None,
        return_embeddings: bool,
        truncate: bool,
        timeout: float | None,
    ) -> Flow[TokenizeResult]:
        body = tokenize_body(
            text, model=model, return_embeddings=return_embeddings, truncate=truncate
        )
        answer = yield from self._request("POST", "/v1/tokenize", json=body, timeout=timeout)
        return parse_body(TokenizeResult.from_json, answer)

    def _embed_sparse(
        self,
        texts: str | Sequence[str],
        *,
        model: str | None,
        kind: str | None,
        top_k: int | None,
        threshold: float | None,
        alpha: float | None,
        return_text: bool,
        truncate: bool,
        timeout: float | None,
    ) -> Flow[SparseResult]:
        body: dict[str, Any] = {
            "inputs": [texts] if isinstance(texts, str) else list(texts),
            "return_text": return_text,
        }
        optional = {"model": model, "kind": kind, "top_k": top_k, "threshold": threshold}
        body.update({k: v for k, v in optional.items() if v is not None})
        if alpha is not None:
            body["alpha"] = float(alpha)
        if truncate:
            body["truncate"] = True
        answer = yield from self._request("POST", "/v1/embed_sparse", json=body, timeout=timeout)
        return parse_body(SparseResult.from_json, answer)

    def _multi_vector(
        self,
        texts: str | Sequence[str],
        options: dict[str, Any],
        timeout: float | None,
    ) -> Flow[MultiVectorResult]:
        body: dict[str, Any] = {"input": [texts] if isinstance(texts, str) else list(texts)}
        body.update({k: v for k, v in options.items() if v is not None})
        answer = yield from self._request("POST", "/v1/multi-vector", json=body, timeout=timeout)
        return parse_body(MultiVectorResult.from_json, answer)

    def _rerank(
        self,
        query: str,
        documents: Sequence[str],
        options: dict[str, Any],
        timeout: float | None,
    ) -> Flow[RerankResult]:
        body = {"query": query, "documents": list(documents)}
        body.update({k: v for k, v in options.items() if v is not None})
        answer = yield from self._request("POST", "/v1/rerank", json=body, timeout=timeout)
        return parse_body(RerankResult.from_json, answer)

    def _explain_similarity(
        self,
        query: str,
        documents: Sequence[str],
        options: dict[str, Any],
        timeout: float | None,
    ) -> Flow[SimilarityResult]:
        body = {"query": query, "documents": list(documents), "encoding_format": "base64"}
        body.update({k: v for k, v in options.items() if v is not None})
        answer = yield from self._request(
            "POST", "/v1/explain/similarity", json=body, timeout=timeout
        )
        return parse_body(SimilarityResult.from_json, answer)

    def _classify(
        self,
        inputs: str | Sequence[str | tuple[str, str]],
        options: dict[str, Any],
        timeout: float | None,
    ) -> Flow[ClassifyResult]:
        listed = [inputs] if isinstance(inputs, str) else list(inputs)
        body: dict[str, Any] = {"inputs": [x if isinstance(x, str) else list(x) for x in listed]}
        body.update({k: v for k, v in options.items() if v is not None})
        answer = yield from self._request("POST", "/v1/classify", json=body, timeout=timeout)
        return parse_body(ClassifyResult.from_json, answer)

    def _models(self) -> Flow[list[ModelCard]]:
        return parse_body(ModelCard.list_from_json, (yield from self._request("GET", "/v1/models")))

    def _model(self, name: str) -> Flow[ModelCard]:
        answer = yield from self._request("GET", f"/v1/models/{quote(name, safe='')}")
        return parse_body(ModelCard.from_json, answer)

    def _ready(self, wait: float | None = None) -> Flow[bool]:
        """One readiness probe, no retries (after ``wait`` seconds)."""
        try:
            response = yield Call(
                "GET", "/health/ready", {"timeout": C.DEFAULT_CONNECT_TIMEOUT}, wait
            )
        except httpx.TransportError:
            return False
        return response.is_success

    def _wait_until_ready(self, timeout: float, interval: float) -> Flow[None]:
        deadline = time.monotonic() + timeout
        wait: float | None = None
        while not (yield from self._ready(wait)):
            if time.monotonic() >= deadline:
                raise APITimeoutError(f"server at {self.base_url} not ready after {timeout}s")
            wait = interval
