"""``Client`` and ``AsyncClient``: the same methods, blocking and awaitable."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any
from urllib.parse import quote

import httpx

from attnserve_client import _constants as C
from attnserve_client._base import (
    BaseClient,
    Inputs,
    Pooling,
    Reduce,
    SequenceInput,
    WireFormat,
    binary_answer,
    binary_plan,
    checked_json,
    chunks,
    default_model,
    encode_body,
    parse_body,
    retry_delay,
    should_retry,
    tokenize_body,
    translate_transport_error,
)
from attnserve_client._exceptions import APITimeoutError
from attnserve_client._types import EncodeResult, ModelCard, TokenizeResult


def _progress(total: int | None, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError as exc:  # pragma: no cover - tqdm ships with the client extra
        raise ImportError("progress=True needs tqdm: pip install tqdm") from exc
    return tqdm(total=total, unit="seq", desc="encode")


class Client(BaseClient):
    """Blocking client.

    Example::

        import numpy as np
        from attnserve_client import Client

        with Client("http://127.0.0.1:8000") as client:
            result = client.encode(np.random.rand(2, 5, 384).astype("float32"))
            result.stack().shape  # (2, 5, 384)
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = C.DEFAULT_MAX_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=self.timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(
        self, method: str, path: str, *, json: Any = None, timeout: float | None = None
    ) -> Any:
        """Send with retries; the JSON answer, or a typed error."""
        return checked_json(self._send(method, path, json=json, timeout=timeout))

    def _send(
        self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        """Send with retries on connection errors, 408, 429 and 5xx; the last answer."""
        self._deadline(kwargs, timeout)
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise translate_transport_error(exc) from exc
                time.sleep(retry_delay(attempt, None))
                continue
            if should_retry(response) and not last:
                time.sleep(retry_delay(attempt, response))
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _binary_target(self, model: str | None, *, ask: bool) -> str | None:
        """The model to send binary requests to; None when the server offers no binary
        (``ask``: find out once; else assume it does)."""
        if self._offers_binary is None and not ask:
            self._offers_binary = True
        if self._offers_binary is None:
            # One attempt: on any doubt this call goes as JSON and a later one asks again.
            with contextlib.suppress(httpx.TransportError):
                self._offers_binary = binary_answer(self._http.get("/v2"))
        if not self._offers_binary:
            return None
        if model is None and self._default_model is None:
            self._default_model = default_model(self.models())
        return model or self._default_model

    def encode(
        self,
        inputs: Inputs,
        *,
        model: str | None = None,
        return_attention: bool = False,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        reduce: Reduce | None = None,
        pooling: Pooling | None = None,
        normalize: bool = False,
        return_embeddings: bool | None = None,
        truncate: bool = False,
        return_hidden_states: bool = False,
        hidden_layers: Sequence[int] | None = None,
        wire_format: WireFormat | None = None,
        timeout: float | None = None,
    ) -> EncodeResult:
        """Contextualized embeddings of ``inputs``: [batch, seq, d] array, or a list of
        [seq_i, d] arrays (ragged) or texts (models with a tokenizer).

        ``wire_format``: None sends arrays as raw float32 over the binary transport
        when the server offers it and the request needs no texts, no selection or
        reduction of attention or hidden states and no truncation, else as base64
        JSON; "binary", "base64" and "float" choose."""
        plan = binary_plan(inputs, wire_format, locals())
        target = None if plan is None else self._binary_target(model, ask=wire_format is None)
        if plan is not None and target is not None:
            answer = self._send(
                "POST", plan.path(target), content=plan.body, headers=plan.headers, timeout=timeout
            )
            return plan.result(answer)
        body = encode_body(
            inputs,
            model=model,
            return_attention=return_attention,
            layers=layers,
            heads=heads,
            reduce=reduce,
            pooling=pooling,
            normalize=normalize,
            return_embeddings=return_embeddings,
            truncate=truncate,
            wire_format="float" if wire_format == "float" else "base64",
            return_hidden_states=return_hidden_states,
            hidden_layers=hidden_layers,
        )
        return parse_body(
            EncodeResult.from_json, self._request("POST", "/v1/encode", json=body, timeout=timeout)
        )

    def encode_many(
        self,
        sequences: Iterable[SequenceInput],
        *,
        batch_size: int = C.DEFAULT_BATCH_SIZE,
        concurrency: int = C.DEFAULT_CONCURRENCY,
        progress: bool = False,
        **encode_kwargs: Any,
    ) -> EncodeResult:
        """Encode many sequences in requests of ``batch_size``, ``concurrency`` at a time,
        keeping their order."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        batches = list(chunks(sequences, batch_size))
        bar = _progress(sum(len(b) for b in batches), progress)
        try:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                futures = [pool.submit(self.encode, b, **encode_kwargs) for b in batches]
                try:
                    for future in as_completed(futures):  # the first failure ends the run
                        done = future.result()
                        if bar is not None:
                            bar.update(len(done))
                except BaseException:
                    pool.shutdown(cancel_futures=True)  # batches not started are not sent
                    raise
        finally:
            if bar is not None:
                bar.close()
        return EncodeResult.concat([f.result() for f in futures])  # in the input's order

    def tokenize(
        self,
        text: str | Sequence[str],
        *,
        model: str | None = None,
        return_embeddings: bool = False,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> TokenizeResult:
        """Tokens, ids and optionally the encoder's input embeddings of ``text``."""
        body = tokenize_body(
            text, model=model, return_embeddings=return_embeddings, truncate=truncate
        )
        return parse_body(
            TokenizeResult.from_json,
            self._request("POST", "/v1/tokenize", json=body, timeout=timeout),
        )

    def models(self) -> list[ModelCard]:
        return parse_body(ModelCard.list_from_json, self._request("GET", "/v1/models"))

    def model(self, name: str) -> ModelCard:
        return parse_body(
            ModelCard.from_json, self._request("GET", f"/v1/models/{quote(name, safe='')}")
        )

    def ready(self) -> bool:
        """True when the server has loaded and warmed up its models (no retries)."""
        try:
            return self._http.get("/health/ready", timeout=C.DEFAULT_CONNECT_TIMEOUT).is_success
        except httpx.TransportError:
            return False

    def wait_until_ready(self, timeout: float = 60.0, *, interval: float = 0.2) -> None:
        """Poll readiness; APITimeoutError if the server is not ready within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() >= deadline:
                raise APITimeoutError(f"server at {self.base_url} not ready after {timeout}s")
            time.sleep(interval)


class AsyncClient(BaseClient):
    """Awaitable twin of :class:`Client`.

    Example::

        async with AsyncClient("http://127.0.0.1:8000") as client:
            result = await client.encode(["A sentence.", "Another one."], pooling="mean")
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = C.DEFAULT_MAX_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=self.timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self, method: str, path: str, *, json: Any = None, timeout: float | None = None
    ) -> Any:
        """Send with retries; the JSON answer, or a typed error."""
        return checked_json(await self._send(method, path, json=json, timeout=timeout))

    async def _send(
        self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        """Send with retries on connection errors, 408, 429 and 5xx; the last answer."""
        self._deadline(kwargs, timeout)
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = await self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise translate_transport_error(exc) from exc
                await asyncio.sleep(retry_delay(attempt, None))
                continue
            if should_retry(response) and not last:
                await asyncio.sleep(retry_delay(attempt, response))
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _binary_target(self, model: str | None, *, ask: bool) -> str | None:
        """See :meth:`Client._binary_target`."""
        if self._offers_binary is None and not ask:
            self._offers_binary = True
        if self._offers_binary is None:
            with contextlib.suppress(httpx.TransportError):
                self._offers_binary = binary_answer(await self._http.get("/v2"))
        if not self._offers_binary:
            return None
        if model is None and self._default_model is None:
            self._default_model = default_model(await self.models())
        return model or self._default_model

    async def encode(
        self,
        inputs: Inputs,
        *,
        model: str | None = None,
        return_attention: bool = False,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        reduce: Reduce | None = None,
        pooling: Pooling | None = None,
        normalize: bool = False,
        return_embeddings: bool | None = None,
        truncate: bool = False,
        return_hidden_states: bool = False,
        hidden_layers: Sequence[int] | None = None,
        wire_format: WireFormat | None = None,
        timeout: float | None = None,
    ) -> EncodeResult:
        """See :meth:`Client.encode`."""
        plan = binary_plan(inputs, wire_format, locals())
        target = None if plan is None else await self._binary_target(model, ask=wire_format is None)
        if plan is not None and target is not None:
            answer = await self._send(
                "POST", plan.path(target), content=plan.body, headers=plan.headers, timeout=timeout
            )
            return plan.result(answer)
        body = encode_body(
            inputs,
            model=model,
            return_attention=return_attention,
            layers=layers,
            heads=heads,
            reduce=reduce,
            pooling=pooling,
            normalize=normalize,
            return_embeddings=return_embeddings,
            truncate=truncate,
            wire_format="float" if wire_format == "float" else "base64",
            return_hidden_states=return_hidden_states,
            hidden_layers=hidden_layers,
        )
        return parse_body(
            EncodeResult.from_json,
            await self._request("POST", "/v1/encode", json=body, timeout=timeout),
        )

    async def encode_many(
        self,
        sequences: Iterable[SequenceInput],
        *,
        batch_size: int = C.DEFAULT_BATCH_SIZE,
        concurrency: int = C.DEFAULT_CONCURRENCY,
        progress: bool = False,
        **encode_kwargs: Any,
    ) -> EncodeResult:
        """See :meth:`Client.encode_many`."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        batches = list(chunks(sequences, batch_size))
        bar = _progress(sum(len(b) for b in batches), progress)
        gate = asyncio.Semaphore(concurrency)

        async def one(batch: list[SequenceInput]) -> EncodeResult:
            async with gate:
                result = await self.encode(batch, **encode_kwargs)
            if bar is not None:
                bar.update(len(result))
            return result

        try:
            # A TaskGroup cancels the other batches as soon as one fails.
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(b)) for b in batches]
        except* Exception as errors:  # callers see the first error, as with Client
            first = errors.exceptions[0]
            raise first from first.__cause__  # e.g. the httpx error under APIConnectionError
        finally:
            if bar is not None:
                bar.close()
        parts = [t.result() for t in tasks]
        return EncodeResult.concat(list(parts))

    async def tokenize(
        self,
        text: str | Sequence[str],
        *,
        model: str | None = None,
        return_embeddings: bool = False,
        truncate: bool = False,
        timeout: float | None = None,
    ) -> TokenizeResult:
        """See :meth:`Client.tokenize`."""
        body = tokenize_body(
            text, model=model, return_embeddings=return_embeddings, truncate=truncate
        )
        return parse_body(
            TokenizeResult.from_json,
            await self._request("POST", "/v1/tokenize", json=body, timeout=timeout),
        )

    async def models(self) -> list[ModelCard]:
        return parse_body(ModelCard.list_from_json, await self._request("GET", "/v1/models"))

    async def model(self, name: str) -> ModelCard:
        return parse_body(
            ModelCard.from_json, await self._request("GET", f"/v1/models/{quote(name, safe='')}")
        )

    async def ready(self) -> bool:
        """True when the server has loaded and warmed up its models (no retries)."""
        try:
            response = await self._http.get("/health/ready", timeout=C.DEFAULT_CONNECT_TIMEOUT)
        except httpx.TransportError:
            return False
        return response.is_success

    async def wait_until_ready(self, timeout: float = 60.0, *, interval: float = 0.2) -> None:
        """Poll readiness; APITimeoutError if the server is not ready within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not await self.ready():
            if time.monotonic() >= deadline:
                raise APITimeoutError(f"server at {self.base_url} not ready after {timeout}s")
            await asyncio.sleep(interval)
