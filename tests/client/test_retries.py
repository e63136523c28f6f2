"""The retry policy, driven through ``httpx.MockTransport``.

A healthy server does not answer 500 or a chosen Retry-After on demand, so
these tests script the answers; everything else in this package runs against
real servers. ``time.sleep`` and ``asyncio.sleep`` (the standard library, not
our code) are replaced by recorders, so the tests see every delay the client
chose and wait for none.

Policy under test (attnserve_client._constants): connection errors, 408, 429
and 5xx are retried up to ``max_retries`` times; the delay is the server's
Retry-After when it gives one, else ``0.5 * 2**attempt`` seconds (at most 8)
times a jitter factor in [0.75, 1.0]; 4xx validation errors are never retried.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from attnserve_client import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncClient,
    BadRequestError,
    Client,
    DeadlineExceededError,
    InternalServerError,
    ModelCard,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    UnprocessableEntityError,
    UnsupportedMediaTypeError,
)

BASE = "http://attnserve.test"
INITIAL_DELAY = 0.5  # seconds before the first retry, without jitter
MAX_DELAY = 8.0
JITTER = (0.75, 1.0)
CARD = {
    "name": "tiny",
    "d_model": 32,
    "heads": 4,
    "layers": 2,
    "max_seq_len": 128,
    "tokenizer": False,
    "default": True,
}

Answer = httpx.Response | Exception


def error(status: int, error_type: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": f"scripted {status}", "error_type": error_type}, headers=headers
    )


def ok() -> httpx.Response:
    return httpx.Response(200, json={"data": [CARD]})


@dataclass
class Script:
    """Answers given in order (the last one repeats); records every request and sleep."""

    answers: list[Answer]
    requests: list[httpx.Request] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Script]]:
    """A scripted transport's answers, with time.sleep and asyncio.sleep recorded."""
    scripts: list[Script] = []
    real_async_sleep = asyncio.sleep

    def record(seconds: float) -> None:
        scripts[-1].sleeps.append(seconds)

    async def record_async(seconds: float) -> None:
        scripts[-1].sleeps.append(seconds)
        await real_async_sleep(0)

    monkeypatch.setattr(time, "sleep", record)
    monkeypatch.setattr(asyncio, "sleep", record_async)

    def make(*answers: Answer) -> Script:
        scripts.append(Script(list(answers)))
        return scripts[-1]

    yield make


def call_models(s: Script, mode: str, **client_kwargs: Any) -> list[ModelCard]:
    """``models()`` through the sync or the async client on the scripted transport."""
    transport = httpx.MockTransport(s.handler)
    if mode == "sync":
        with Client(BASE, transport=transport, **client_kwargs) as client:
            return client.models()

    async def run() -> list[ModelCard]:
        async with AsyncClient(BASE, transport=transport, **client_kwargs) as client:
            return await client.models()

    return asyncio.run(run())


MODES = ["sync", "async"]
RETRIED = [
    (429, "overloaded", OverloadedError),
    (503, "not_ready", ServiceUnavailableError),
    (500, "internal_error", InternalServerError),
    (502, "bad_gateway", InternalServerError),
    (504, "deadline_exceeded", DeadlineExceededError),
    (408, "request_timeout", APIStatusError),
]
NOT_RETRIED = [
    (400, "invalid_json", BadRequestError),
    (404, "model_not_found", NotFoundError),
    (413, "payload_too_large", PayloadTooLargeError),
    (415, "unsupported_media_type", UnsupportedMediaTypeError),
    (422, "invalid_input", UnprocessableEntityError),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("status", "error_type", "exc_type"), RETRIED)
@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_retried_statuses_give_up_after_max_retries(
    script: Callable[..., Script],
    mode: str,
    status: int,
    error_type: str,
    exc_type: type[APIStatusError],
    max_retries: int,
) -> None:
    s = script(error(status, error_type))
    with pytest.raises(exc_type) as info:
        call_models(s, mode, max_retries=max_retries)
    assert type(info.value) is exc_type
    assert (info.value.status_code, info.value.error_type) == (status, error_type)
    assert info.value.error == f"scripted {status}"
    assert len(s.requests) == max_retries + 1
    assert len(s.sleeps) == max_retries


@pytest.mark.parametrize("mode", MODES)
def test_retried_status_then_success(script: Callable[..., Script], mode: str) -> None:
    s = script(error(503, "not_ready"), error(429, "overloaded"), error(500, "x"), ok())
    cards = call_models(s, mode, max_retries=3)
    assert [c.name for c in cards] == ["tiny"]
    assert len(s.requests) == 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("status", "error_type", "exc_type"), NOT_RETRIED)
def test_caller_errors_are_never_retried(
    script: Callable[..., Script],
    mode: str,
    status: int,
    error_type: str,
    exc_type: type[APIStatusError],
) -> None:
    s = script(error(status, error_type), ok())
    with pytest.raises(exc_type) as info:
        call_models(s, mode, max_retries=5)
    assert type(info.value) is exc_type
    assert info.value.error_type == error_type
    assert len(s.requests) == 1  # exactly one request
    assert s.sleeps == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("failure", "exc_type"),
    [
        (httpx.ConnectError("refused"), APIConnectionError),
        (httpx.RemoteProtocolError("server hung up"), APIConnectionError),
        (httpx.ReadTimeout("slow"), APITimeoutError),
        (httpx.ConnectTimeout("slow"), APITimeoutError),
    ],
)
def test_connection_errors_are_retried_then_translated(
    script: Callable[..., Script], mode: str, failure: Exception, exc_type: type[Exception]
) -> None:
    s = script(failure)
    with pytest.raises(exc_type) as info:
        call_models(s, mode, max_retries=2)
    assert type(info.value) is exc_type
    assert info.value.__cause__ is failure  # raise ... from the httpx error
    assert len(s.requests) == 3
    assert len(s.sleeps) == 2


@pytest.mark.parametrize("mode", MODES)
def test_connection_error_then_success(script: Callable[..., Script], mode: str) -> None:
    s = script(httpx.ConnectError("refused"), ok())
    assert len(call_models(s, mode, max_retries=1)) == 1
    assert len(s.requests) == 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("retry_after", ["0", "1", "3", "2.5", "60"])
def test_retry_after_seconds_is_the_delay(
    script: Callable[..., Script], mode: str, retry_after: str
) -> None:
    s = script(error(429, "overloaded", **{"Retry-After": retry_after}), ok())
    call_models(s, mode, max_retries=1)
    assert s.sleeps == [float(retry_after)]


@pytest.mark.parametrize("mode", MODES)
def test_retry_after_http_date_is_the_delay(script: Callable[..., Script], mode: str) -> None:
    when = email.utils.formatdate(time.time() + 5, usegmt=True)  # whole seconds
    s = script(error(503, "not_ready", **{"Retry-After": when}), ok())
    call_models(s, mode, max_retries=1)
    assert len(s.sleeps) == 1
    assert 3.5 <= s.sleeps[0] <= 5.0  # 5 s ahead, less the rounding to seconds and run time


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("retry_after", ["-1", "61", "3600"])
def test_insane_retry_after_falls_back_to_backoff(
    script: Callable[..., Script], mode: str, retry_after: str
) -> None:
    s = script(error(429, "overloaded", **{"Retry-After": retry_after}), ok())
    call_models(s, mode, max_retries=1)
    assert len(s.sleeps) == 1
    assert JITTER[0] * INITIAL_DELAY <= s.sleeps[0] <= JITTER[1] * INITIAL_DELAY


@pytest.mark.parametrize("mode", MODES)
def test_unparsable_retry_after_falls_back_to_backoff(
    script: Callable[..., Script], mode: str
) -> None:
    s = script(error(429, "overloaded", **{"Retry-After": "soon"}), ok())
    call_models(s, mode, max_retries=1)
    assert len(s.sleeps) == 1
    assert JITTER[0] * INITIAL_DELAY <= s.sleeps[0] <= JITTER[1] * INITIAL_DELAY


def backoff(attempt: int) -> float:
    """The un-jittered delay before retry ``attempt`` (0-based)."""
    return min(INITIAL_DELAY * 2.0**attempt, MAX_DELAY)


@pytest.mark.parametrize("mode", MODES)
def test_backoff_grows_exponentially_with_jitter(script: Callable[..., Script], mode: str) -> None:
    s = script(error(503, "not_ready"))  # no Retry-After: the client's own backoff
    with pytest.raises(ServiceUnavailableError):
        call_models(s, mode, max_retries=7)
    assert len(s.sleeps) == 7
    for attempt, delay in enumerate(s.sleeps):
        low, high = JITTER[0] * backoff(attempt), JITTER[1] * backoff(attempt)
        assert low <= delay <= high, (attempt, delay)
    # Growth: every delay up to the cap is more than the one before (0.75 x 2 > 1).
    uncapped = [d for a, d in enumerate(s.sleeps) if backoff(a) < MAX_DELAY]
    assert uncapped == sorted(uncapped) and len(set(uncapped)) == len(uncapped)
    assert len(uncapped) == 4  # 0.5, 1, 2, 4; then capped at 8


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 1.0), (0.5, 0.875), (1.0, 0.75)])
def test_jitter_factor_spans_three_quarters_to_one(
    script: Callable[..., Script], monkeypatch: pytest.MonkeyPatch, draw: float, factor: float
) -> None:
    """random.random() (stdlib) pinned: the jitter factor is 1 - draw / 4, exactly."""
    monkeypatch.setattr(random, "random", lambda: draw)
    s = script(error(500, "internal_error"))
    with pytest.raises(InternalServerError):
        call_models(s, "sync", max_retries=6)
    assert s.sleeps == [factor * backoff(a) for a in range(6)]


def test_jitter_spreads_clients(script: Callable[..., Script]) -> None:
    """With the real random source, 20 clients do not all wait the same time."""
    firsts = []
    for _ in range(20):
        s = script(error(429, "overloaded"), ok())
        call_models(s, "sync", max_retries=1)
        firsts.append(s.sleeps[0])
    assert all(JITTER[0] * INITIAL_DELAY <= d <= JITTER[1] * INITIAL_DELAY for d in firsts)
    assert len(set(firsts)) > 10


def test_negative_max_retries_is_refused() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        Client(BASE, max_retries=-1)


@pytest.mark.parametrize("mode", MODES)
def test_the_read_timeout_travels_as_the_request_deadline(
    script: Callable[..., Script], mode: str
) -> None:
    """The server drops work still queued once this client has stopped waiting."""
    s = script(ok())
    call_models(s, mode, timeout=httpx.Timeout(10.0, read=2.5))
    assert s.requests[0].headers["x-request-timeout"] == "2.5"
