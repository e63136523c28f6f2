"""``encode_many``: order kept under concurrency, requests of ``batch_size``, progress bar,
the first failure ends the run (sync and async alike).

Order: a real transport delays the request that carries the first batch, so
that batch is answered last; the result must still start with it.
Tolerance: against a direct onnxruntime run, ``ATOL_ORT`` (1e-5).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from attnserve_client import (
    APIConnectionError,
    AsyncClient,
    Client,
    EncodeResult,
    PayloadTooLargeError,
    UnprocessableEntityError,
)
from model_export import graph_io
from tests.client.helpers import CountingTransport
from tests.support.inputs import sequences
from tests.support.onnx_runs import ATOL_ORT, ort_run
from tests.support.tiny import D_MODEL

# Distinct lengths, so a sequence's length tells where it went.
LENGTHS = (12, 3, 7, 1, 9, 5, 2, 11, 4)
DELAY = 0.3  # seconds the first batch is held back


def first_length(request: httpx.Request) -> int:
    """Length of the first sequence in an encode request body (a base64 array)."""
    return int(json.loads(request.content)["inputs"][0]["shape"][0])


class SlowFirstBatch(CountingTransport):
    """A real transport that holds back the request whose first sequence has ``length``."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def held(self, request: httpx.Request) -> bool:
        return first_length(request) == self.length

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.held(request):
            time.sleep(DELAY)
        return super().handle_request(request)


class AsyncSlowFirstBatch(httpx.AsyncHTTPTransport):
    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length
        self.sent = 0

    def held(self, request: httpx.Request) -> bool:
        return first_length(request) == self.length

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        if self.held(request):
            await asyncio.sleep(DELAY)
        return await super().handle_async_request(request)


class SlowButOne(SlowFirstBatch):
    """Holds back every request but the one whose first sequence has ``length``."""

    def held(self, request: httpx.Request) -> bool:
        return not super().held(request)


class AsyncSlowButOne(AsyncSlowFirstBatch):
    def held(self, request: httpx.Request) -> bool:
        return not super().held(request)


def assert_in_order(
    result: EncodeResult, seqs: list[np.ndarray], session: ort.InferenceSession
) -> None:
    assert len(result) == len(seqs)
    assert result.usage.tokens == sum(len(s) for s in seqs)
    assert result.embeddings is not None
    assert [len(e) for e in result.embeddings] == [len(s) for s in seqs]
    for seq, hidden in zip(seqs, result.embeddings, strict=True):
        np.testing.assert_allclose(
            hidden, ort_run(session, seq)[graph_io.OUTPUT_HIDDEN], rtol=0, atol=ATOL_ORT
        )


def test_sync_keeps_order_with_concurrency(
    server_url: str, embeddings_session: ort.InferenceSession
) -> None:
    seqs = sequences(LENGTHS, seed=1)
    transport = SlowFirstBatch(LENGTHS[0])
    with Client(server_url, transport=transport) as client:
        # JSON: the transport reads each batch's body to hold the first one back.
        result = client.encode_many(seqs, batch_size=2, concurrency=4, wire_format="base64")
    assert transport.sent == 5  # ceil(9 / 2)
    assert_in_order(result, seqs, embeddings_session)


def test_async_keeps_order_with_concurrency(
    server_url: str, embeddings_session: ort.InferenceSession
) -> None:
    seqs = sequences(LENGTHS, seed=2)
    transport = AsyncSlowFirstBatch(LENGTHS[0])

    async def run() -> EncodeResult:
        async with AsyncClient(server_url, transport=transport) as client:
            return await client.encode_many(seqs, batch_size=2, concurrency=4, wire_format="base64")

    result = asyncio.run(run())
    assert transport.sent == 5
    assert_in_order(result, seqs, embeddings_session)


def test_batch_size_splits_requests(
    two_sequence_url: str, embeddings_session: ort.InferenceSession
) -> None:
    """The server takes at most two sequences per request; batch_size=2 makes five fit."""
    seqs = sequences((4, 6, 1, 3, 2), seed=3)
    transport = CountingTransport()
    with Client(two_sequence_url, transport=transport) as client:
        with pytest.raises(PayloadTooLargeError):
            client.encode(seqs)
        with pytest.raises(PayloadTooLargeError):
            client.encode_many(seqs, batch_size=3)
        transport.sent = 0
        result = client.encode_many(seqs, batch_size=2, concurrency=2, return_attention=True)
    assert transport.sent == 3
    assert_in_order(result, seqs, embeddings_session)
    assert result.attention is not None  # encode options pass through to every request
    assert [a.shape[-1] for a in result.attention] == [4, 6, 1, 3, 2]


def test_batch_array_and_generator_inputs(sdk_client: Client) -> None:
    batch = np.stack(sequences((3,) * 5, seed=4))  # (B, T, d)
    from_array = sdk_client.encode_many(batch, batch_size=2)
    from_generator = sdk_client.encode_many((row for row in batch), batch_size=4)
    assert from_array.stack().shape == from_generator.stack().shape == (5, 3, D_MODEL)
    np.testing.assert_array_equal(from_array.stack(), from_generator.stack())  # atol 0


def test_sync_progress_bar(sdk_client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    result = sdk_client.encode_many(sequences(LENGTHS, seed=5), batch_size=4, progress=True)
    assert len(result) == len(LENGTHS)
    err = capsys.readouterr().err  # tqdm writes to stderr
    assert f"{len(LENGTHS)}/{len(LENGTHS)}" in err, err


def test_async_progress_bar(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def run() -> EncodeResult:
        async with AsyncClient(server_url) as client:
            return await client.encode_many(
                sequences(LENGTHS, seed=6), batch_size=4, concurrency=2, progress=True
            )

    assert len(asyncio.run(run())) == len(LENGTHS)
    err = capsys.readouterr().err
    assert f"{len(LENGTHS)}/{len(LENGTHS)}" in err, err


@pytest.mark.parametrize(("batch_size", "concurrency"), [(0, 1), (1, 0)])
def test_bad_batch_size_or_concurrency(
    sdk_client: Client, batch_size: int, concurrency: int
) -> None:
    with pytest.raises(ValueError, match=r"batch_size|concurrency"):
        sdk_client.encode_many(
            sequences((2,), seed=7), batch_size=batch_size, concurrency=concurrency
        )


MODES = ["sync", "async"]
BAD_LENGTH = 13  # the one sequence of the wrong width: a 422, answered at once


@pytest.mark.parametrize("mode", MODES)
def test_first_failure_stops_the_queued_batches(server_url: str, mode: str) -> None:
    """A 422 on the first batch is raised without sending the batches queued behind it
    (the sync client used to send all of them, then raise)."""
    bad = np.zeros((BAD_LENGTH, D_MODEL - 1), np.float32)
    seqs = [bad, *sequences((2,) * 11, seed=8)]
    if mode == "sync":
        transport = SlowButOne(BAD_LENGTH)
        with (
            Client(server_url, transport=transport) as client,
            pytest.raises(UnprocessableEntityError),
        ):
            client.encode_many(seqs, batch_size=1, concurrency=2, wire_format="base64")
        sent = transport.sent
    else:
        async_transport = AsyncSlowButOne(BAD_LENGTH)

        async def run() -> None:
            async with AsyncClient(server_url, transport=async_transport) as client:
                await client.encode_many(seqs, batch_size=1, concurrency=2, wire_format="base64")

        with pytest.raises(UnprocessableEntityError):
            asyncio.run(run())
        sent = async_transport.sent
    # The failed batch, the one beside it, at most one more each worker took meanwhile.
    assert sent <= 4, sent


@pytest.mark.parametrize("mode", MODES)
def test_connection_error_keeps_its_cause(closed_port_url: str, mode: str) -> None:
    """encode_many raises encode's own error: APIConnectionError from the httpx error
    (the async client used to drop the cause)."""
    seqs = sequences((2, 3), seed=9)
    if mode == "sync":
        with (
            Client(closed_port_url, max_retries=0) as client,
            pytest.raises(APIConnectionError) as info,
        ):
            client.encode_many(seqs, batch_size=1, wire_format="base64")
    else:

        async def run() -> None:
            async with AsyncClient(closed_port_url, max_retries=0) as client:
                await client.encode_many(seqs, batch_size=1, wire_format="base64")

        with pytest.raises(APIConnectionError) as info:
            asyncio.run(run())
    assert isinstance(info.value.__cause__, httpx.ConnectError)
