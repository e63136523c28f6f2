"""Every error class of the SDK, provoked on a real server.

Each status error carries the server's ``error`` message and ``error_type``.
The SDK always sends well-formed JSON, so 400 and 415 need a request the SDK
would never make: :class:`RewritingTransport` is a real HTTP transport (passed
through the public ``transport=`` argument) that rewrites the body or the
Content-Type on the way, as a broken proxy would. Unlike calling
``status_error`` on a hand-sent response, this drives the SDK's whole answer
path: retry decision, status check, exception mapping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from attnserve_client import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncClient,
    AttnserveError,
    BadRequestError,
    Client,
    DeadlineExceededError,
    EncodeResult,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    UnprocessableEntityError,
    UnsupportedMediaTypeError,
)
from tests.client.helpers import CountingTransport, RewritingTransport
from tests.conftest import running_server
from tests.support.inputs import sequences
from tests.support.tiny import D_MODEL, MODEL, MODEL_MAX_SEQ_LEN

OVERLOAD_ROUNDS = 10  # bursts of concurrent requests before giving up on seeing a 429
OVERLOAD_BURST = 16


@pytest.fixture(scope="module")
def one_queued_url(model_repository: Path) -> Iterator[str]:
    with running_server(model_repository, max_queued_requests="1") as url:
        yield url


def assert_server_error(exc: APIStatusError, status: int, error_type: str, *words: str) -> None:
    assert isinstance(exc, AttnserveError)
    assert exc.status_code == exc.response.status_code == status
    assert exc.error_type == error_type
    assert exc.error == exc.response.json()["error"]  # the server's own message
    assert exc.error
    for word in words:
        assert word.lower() in exc.error.lower(), exc.error


def test_unknown_model_is_not_found(sdk_client: Client) -> None:
    with pytest.raises(NotFoundError) as info:
        sdk_client.encode(sequences((3,), seed=1), model="nope")
    assert_server_error(info.value, 404, "model_not_found", "nope")
    with pytest.raises(NotFoundError) as info:
        sdk_client.model("nope")
    assert_server_error(info.value, 404, "model_not_found", "nope")


@pytest.mark.parametrize("wire_format", ["base64", "binary"])
def test_too_many_sequences_is_payload_too_large(two_sequence_url: str, wire_format: str) -> None:
    """The same error class and error_type over either transport."""
    transport = CountingTransport()
    with (
        Client(two_sequence_url, transport=transport) as client,
        pytest.raises(PayloadTooLargeError) as info,
    ):
        client.encode(sequences((2, 2, 2), seed=2), model=MODEL, wire_format=wire_format)  # type: ignore[arg-type]
    assert isinstance(info.value, BadRequestError)
    assert_server_error(info.value, 413, "payload_too_large", "3 sequences", "2")
    assert transport.sent == 1  # the caller's to fix: never retried


def test_too_long_sequence_is_payload_too_large(sdk_client: Client) -> None:
    with pytest.raises(PayloadTooLargeError) as info:
        sdk_client.encode(sequences((MODEL_MAX_SEQ_LEN + 1,), seed=3))
    assert_server_error(info.value, 413, "payload_too_large", str(MODEL_MAX_SEQ_LEN))


def test_wrong_content_type_is_unsupported_media_type(server_url: str) -> None:
    transport = RewritingTransport(content=b"{}", content_type="text/plain")
    with (
        Client(server_url, transport=transport) as client,
        pytest.raises(UnsupportedMediaTypeError) as info,
    ):
        client.encode(sequences((3,), seed=4), wire_format="base64")  # JSON is what is rewritten
    assert isinstance(info.value, BadRequestError)
    assert_server_error(info.value, 415, "unsupported_media_type", "application/json")
    assert transport.sent == 1


def test_malformed_json_is_bad_request(server_url: str) -> None:
    transport = RewritingTransport(content=b'{"inputs": [[', content_type="application/json")
    with Client(server_url, transport=transport) as client, pytest.raises(BadRequestError) as info:
        client.encode(sequences((3,), seed=5), wire_format="base64")
    assert type(info.value) is BadRequestError
    assert_server_error(info.value, 400, "invalid_json", "json")
    assert transport.sent == 1


@pytest.mark.parametrize("wire_format", ["base64", "binary"])
def test_wrong_width_is_unprocessable(server_url: str, wire_format: str) -> None:
    transport = CountingTransport()
    with (
        Client(server_url, transport=transport) as client,
        pytest.raises(UnprocessableEntityError) as info,
    ):
        client.encode(
            [np.zeros((3, D_MODEL - 1), np.float32)],
            model=MODEL,
            wire_format=wire_format,  # type: ignore[arg-type]
        )
    assert isinstance(info.value, BadRequestError)
    assert_server_error(info.value, 422, "invalid_input", "width", str(D_MODEL))
    assert transport.sent == 1


def test_text_without_tokenizer_is_unprocessable(sdk_client: Client) -> None:
    with pytest.raises(UnprocessableEntityError) as info:
        sdk_client.encode(["the tiny model has no tokenizer"])
    assert_server_error(info.value, 422, "unsupported_by_model", "tokenizer")
    with pytest.raises(UnprocessableEntityError) as info:
        sdk_client.tokenize("no tokenizer")
    assert_server_error(info.value, 422, "unsupported_by_model", "tokenizer")


def test_full_queue_is_overloaded(one_queued_url: str) -> None:
    """Bursts of concurrent requests at a server that queues one: some get 429."""
    seqs = sequences((MODEL_MAX_SEQ_LEN,) * 8, seed=6)

    async def burst(client: AsyncClient) -> list[object]:
        return await asyncio.gather(
            *(client.encode(seqs) for _ in range(OVERLOAD_BURST)), return_exceptions=True
        )

    async def run() -> list[object]:
        async with AsyncClient(one_queued_url, max_retries=0) as client:
            outcomes: list[object] = []
            for _ in range(OVERLOAD_ROUNDS):
                outcomes += await burst(client)
                if any(isinstance(o, OverloadedError) for o in outcomes):
                    break
            return outcomes

    outcomes = asyncio.run(run())
    overloaded = [o for o in outcomes if isinstance(o, OverloadedError)]
    assert overloaded, f"no 429 in {len(outcomes)} requests"
    answered = [o for o in outcomes if not isinstance(o, OverloadedError)]
    assert all(isinstance(o, EncodeResult) and len(o) == 8 for o in answered), answered
    assert_server_error(overloaded[0], 429, "overloaded", "retry")
    assert overloaded[0].response.headers["retry-after"] == "1"


def test_not_ready_is_service_unavailable(not_ready_url: str) -> None:
    with (
        Client(not_ready_url, max_retries=0) as client,
        pytest.raises(ServiceUnavailableError) as info,
    ):
        client.encode(sequences((3,), seed=7))
    assert_server_error(info.value, 503, "not_ready", "warming up")
    assert info.value.response.headers["retry-after"] == "1"


@pytest.mark.parametrize("wire_format", ["base64", "binary"])
def test_not_ready_is_retried_after_the_servers_retry_after(
    not_ready_url: str, monkeypatch: pytest.MonkeyPatch, wire_format: str
) -> None:
    """The real server's Retry-After (1 s) is what the client waits between attempts."""
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)  # record instead of waiting
    transport = CountingTransport()
    with (
        Client(not_ready_url, max_retries=2, transport=transport) as client,
        pytest.raises(ServiceUnavailableError),
    ):
        client.encode(sequences((3,), seed=8), model=MODEL, wire_format=wire_format)  # type: ignore[arg-type]
    assert transport.sent == 3
    assert waits == [1.0, 1.0]


def test_nothing_listening_is_connection_error(closed_port_url: str) -> None:
    with (
        Client(closed_port_url, max_retries=0) as client,
        pytest.raises(APIConnectionError) as info,
    ):
        client.models()
    assert type(info.value) is APIConnectionError  # refused, not timed out
    assert isinstance(info.value, AttnserveError)


def test_async_nothing_listening_is_connection_error(closed_port_url: str) -> None:
    async def run() -> None:
        async with AsyncClient(closed_port_url, max_retries=0) as client:
            await client.models()

    with pytest.raises(APIConnectionError) as info:
        asyncio.run(run())
    assert type(info.value) is APIConnectionError


# A client that waits 0.1 ms gives up itself (APITimeoutError, a connection error) or,
# as its timeout travels as X-Request-Timeout, hears the server's 504 first.
GAVE_UP = (APITimeoutError, DeadlineExceededError)


@pytest.mark.parametrize("where", ["per call", "client"])
def test_slow_answer_is_timeout(server_url: str, where: str) -> None:
    seqs = sequences((MODEL_MAX_SEQ_LEN,) * 4, seed=9)
    client_timeout = 1e-4 if where == "client" else None
    call_timeout = 1e-4 if where == "per call" else None
    with Client(server_url, timeout=client_timeout, max_retries=0) as client:
        start = time.monotonic()
        with pytest.raises(GAVE_UP) as info:
            client.encode(seqs, return_attention=True, timeout=call_timeout)
        assert time.monotonic() - start < 5.0
        if isinstance(info.value, DeadlineExceededError):
            assert info.value.error_type == "deadline_exceeded"
        else:
            assert isinstance(info.value, APIConnectionError)  # a timeout is a connection error
        # The same client still works with a sane timeout.
        assert len(client.encode(seqs[:1], timeout=30.0)) == 1


def test_async_slow_answer_is_timeout(server_url: str) -> None:
    seqs = sequences((MODEL_MAX_SEQ_LEN,) * 4, seed=10)

    async def run() -> None:
        async with AsyncClient(server_url, max_retries=0) as client:
            await client.encode(seqs, return_attention=True, timeout=1e-4)

    with pytest.raises(GAVE_UP):
        asyncio.run(run())
