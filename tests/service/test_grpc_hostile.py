"""gRPC against clients that do not play by the rules (a raw HTTP/2 client, ``raw_h2``).

A real server with its gRPC port on 127.0.0.1; the well-behaved calls beside
the hostile ones go through grpc's own client on connections of their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from model_export import graph_io
from tests.service.raw_h2 import RawH2, grpc_message
from tests.service.test_kserve_grpc import Servers, serving
from tests.support.metrics import metric
from tests.support.tiny import D_MODEL, MODEL
from tests.support.wait import wait_until

INFER = "/inference.GRPCInferenceService/ModelInfer"
# Options that give a channel a connection of its own (grpc shares them by target).
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)
GRPC_MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def servers(model_repository: Path) -> Iterator[Servers]:
    with serving(
        model_repository,
        body_timeout="2",
        send_timeout="3",
        grpc_max_connections=str(GRPC_MAX_CONNECTIONS),
        log_level="info",
    ) as running:
        yield running


def infer_request(
    sequences: int = 1, tokens: int = 4, outputs: tuple[str, ...] = (), seed: int = 0
) -> bytes:
    rng = np.random.default_rng(seed)
    embeds = rng.standard_normal((sequences, tokens, D_MODEL)).astype(np.float32)
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name=graph_io.INPUT_EMBEDS, datatype="FP32", shape=embeds.shape)
    request.raw_input_contents.append(embeds.tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    return bytes(request.SerializeToString())


def health_and_infer(address: str) -> tuple[int, tuple[int, ...]]:
    """Health's status and a normal call's answer shape, each on a fresh connection."""
    with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
    with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(pb.ModelInferRequest.FromString(infer_request()), timeout=10)
    return status, tuple(answer.outputs[0].shape)


def test_silent_calls_on_one_connection_lock_out_nobody(servers: Servers) -> None:
    """1,000 ModelInfer streams that send headers and never their message, on one
    connection: health still answers SERVING and a normal call is answered; those
    streams hold no admission slot, and their wait ends at ATTNSERVE_BODY_TIMEOUT."""
    host, port = servers.grpc.split(":")
    timeouts = metric(servers.url, "attnserve_refusals_total", reason="body_timeout")
    silent = RawH2(host, int(port))
    try:
        streams = [silent.open(INFER) for _ in range(1000)]
        assert not silent.closed.wait(0.5)  # the connection is open, the calls held
        status, shape = health_and_infer(servers.grpc)
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert shape == (1, 4, D_MODEL)
        assert metric(servers.url, "attnserve_in_flight_requests") == 0
        # The streams the server took wait for their message 2 s at most.
        wait_until(
            lambda: (
                metric(servers.url, "attnserve_refusals_total", reason="body_timeout") > timeouts
            ),
            "no body_timeout refusal",
            timeout=15,
        )
        assert len(streams) == 1000
    finally:
        silent.close()
    status, shape = health_and_infer(servers.grpc)
    assert status == health_pb2.HealthCheckResponse.SERVING and shape == (1, 4, D_MODEL)


def test_an_unread_answer_counts_in_the_budget_until_send_timeout(servers: Servers) -> None:
    """Six answers of 128 KiB on a connection that grants no flow-control window: once
    computed they stay in attnserve_in_flight_bytes while unread; after
    ATTNSERVE_SEND_TIMEOUT (3 s) the server drops the connection, the bytes are given
    back and the calls count as 499 (six [1, 64] requests, different so none is a
    cache hit: within the server's initial connection window)."""
    host, port = servers.grpc.split(":")
    url = servers.url
    cut = metric(url, "attnserve_requests_total", route=INFER, status="499")
    stalls = metric(url, "attnserve_refusals_total", reason="send_timeout")
    tokens = metric(url, "attnserve_tokens_total", model=MODEL)
    answer = 2 * 4 * 64 * 64 * 4  # [1, 2 layers, 4 heads, 64, 64] float32
    reader = RawH2(host, int(port), window=0)
    try:
        for seed in range(6):
            message = infer_request(1, 64, (graph_io.OUTPUT_ATTENTIONS,), seed=100 + seed)
            reader.send(reader.open(INFER), grpc_message(message))
        # All six computed; their answers wait for a window the client never grants.
        wait_until(
            lambda: metric(url, "attnserve_tokens_total", model=MODEL) >= tokens + 6 * 64,
            "the six answers were not computed",
            15,
        )
        wait_until(
            lambda: metric(url, "attnserve_in_flight_bytes") >= 6 * answer,
            "the six unread answers are not held",
            2,
        )
        assert reader.closed.wait(15)  # dropped by the server
        assert not reader.data_bytes  # nothing of an answer was sent
    finally:
        reader.close()
    # Each of the six calls has its own send timer; the first to fire drops the
    # connection, and the others fire within the same milliseconds or are cancelled
    # first (a full run saw 3), so from one to six are counted.
    assert 1 <= metric(url, "attnserve_refusals_total", reason="send_timeout") - stalls <= 6
    wait_until(
        lambda: metric(url, "attnserve_in_flight_bytes") == 0, "bytes still held", timeout=10
    )
    wait_until(
        lambda: metric(url, "attnserve_requests_total", route=INFER, status="499") == cut + 6,
        "not six 499s",
        timeout=10,
    )
    assert health_and_infer(servers.grpc) == (
        health_pb2.HealthCheckResponse.SERVING,
        (1, 4, D_MODEL),
    )


def test_a_malformed_message_is_invalid_argument_counted_and_logged_once(
    servers: Servers,
) -> None:
    """Bytes that are no ModelInferRequest: INVALID_ARGUMENT (not UNKNOWN), counted in the
    request metrics (422, as a /v2 body of bad content) and one log line, no traceback."""
    refused = metric(servers.url, "attnserve_requests_total", route=INFER, status="422")
    log_before = servers.process.log()
    with grpc.insecure_channel(servers.grpc, options=OWN_CONNECTION) as channel:
        raw_call = channel.unary_unary(INFER)  # bytes in and out, unserialized
        with pytest.raises(grpc.RpcError) as caught:
            raw_call(b"\xff\xff\xff", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid inference.ModelInferRequest message" in str(caught.value.details())
    wait_until(  # counted as the call ends, just after its status went out
        lambda: (
            metric(servers.url, "attnserve_requests_total", route=INFER, status="422")
            == refused + 1
        ),
        "the 422 was not counted",
        timeout=5,
    )
    wait_until(lambda: f"{INFER} 422" in servers.process.log()[len(log_before) :], "no log line", 5)
    new_lines = servers.process.log()[len(log_before) :]
    assert "Traceback" not in new_lines and new_lines.count(INFER) == 1


def test_a_deadline_beyond_a_day_is_capped_not_refused(servers: Servers) -> None:
    """A call's deadline of two days is the longest a request may ask (a day, then
    ATTNSERVE_REQUEST_TIMEOUT): answered, not refused with an HTTP header's name."""
    with grpc.insecure_channel(servers.grpc, options=OWN_CONNECTION) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest.FromString(infer_request())
        answer = stub.ModelInfer(request, timeout=2 * 86400)
    assert tuple(answer.outputs[0].shape) == (1, 4, D_MODEL)


def test_a_slow_reader_of_a_large_answer_is_cut_at_send_timeout(servers: Servers) -> None:
    """A client that reads its answer (128 KiB) but slowly, 8 KiB every 0.5 s, would
    hold it for 8 s: the whole answer must be taken within ATTNSERVE_SEND_TIMEOUT
    (3 s), a minimum read rate of answer / send_timeout, so its connection is dropped
    then, having read part of it, and the answer's bytes are given back."""
    host, port = servers.grpc.split(":")
    url = servers.url
    cut = metric(url, "attnserve_requests_total", route=INFER, status="499")
    answer = 2 * 4 * 64 * 64 * 4  # [1, 2 layers, 4 heads, 64, 64] float32
    reader = RawH2(host, int(port), window=0)
    try:
        stream = reader.open(INFER)
        message = infer_request(1, 64, (graph_io.OUTPUT_ATTENTIONS,), seed=200)
        reader.send(stream, grpc_message(message))
        started = time.monotonic()
        while not reader.closed.wait(0.5) and time.monotonic() - started < 30:
            try:
                reader.grant(stream, 8192)
            except OSError:  # cut between the wait and the grant: what is tested
                reader.closed.wait(5)
                break
        assert reader.closed.is_set(), "a slow reader was never cut"
        assert 0 < reader.data_bytes[stream] < answer  # it read, too slowly
    finally:
        reader.close()
    wait_until(
        lambda: metric(url, "attnserve_in_flight_bytes") == 0, "bytes still held", timeout=10
    )
    wait_until(
        lambda: metric(url, "attnserve_requests_total", route=INFER, status="499") == cut + 1,
        "the cut answer is not a 499",
        timeout=10,
    )


def test_connections_beyond_the_cap_are_closed_at_once(servers: Servers) -> None:
    """ATTNSERVE_GRPC_MAX_CONNECTIONS (4 here) open connections: a fifth is closed as
    soon as it is accepted, and a real client's call on one fails UNAVAILABLE; the four
    held are served, and once they close new connections are served again."""
    host, port = servers.grpc.split(":")
    held = [RawH2(host, int(port)) for _ in range(GRPC_MAX_CONNECTIONS)]
    try:
        assert not any(h.closed.wait(0.5) for h in held)  # within the cap: kept
        extra = RawH2(host, int(port))
        try:
            assert extra.closed.wait(5), "a connection beyond the cap was kept"
        finally:
            extra.close()
        with grpc.insecure_channel(servers.grpc, options=OWN_CONNECTION) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        # A connection held within the cap still takes calls.
        stream = held[0].open(INFER)
        held[0].send(stream, grpc_message(infer_request()))
        wait_until(lambda: stream in held[0].ended, "a held connection was not answered", 10)
        assert held[0].data_bytes[stream] > 0
    finally:
        for h in held:
            h.close()
    wait_until(
        lambda: health_and_infer(servers.grpc)[1] == (1, 4, D_MODEL),
        "not served once the held connections closed",
        timeout=10,
    )
