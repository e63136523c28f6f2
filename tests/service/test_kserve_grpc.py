"""The Open Inference Protocol over gRPC, through tritonclient.grpc (sync and aio).

A real server with its gRPC port on 127.0.0.1; every answer is compared with the
same request over HTTP ``/v2`` (binary tensors) on the same server: the same
numbers, bitwise (both run one engine; tolerance 0).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.grpc.aio as tgrpc_aio
import tritonclient.http as thttp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from model_export import graph_io
from service.version import VERSION
from tests.conftest import ServerProcess, free_port, server_process
from tests.support.inputs import ragged_batch
from tests.support.tiny import D_MODEL, MODEL

HIDDEN, ATTENTIONS, STATES = (
    graph_io.OUTPUT_HIDDEN,
    graph_io.OUTPUT_ATTENTIONS,
    graph_io.OUTPUT_HIDDEN_STATES,
)
EVERY_OUTPUT = (HIDDEN, ATTENTIONS, STATES, "pooled", graph_io.INPUT_MASK)
KEY = "grpc-test-key"


class Servers:
    """One running server: its HTTP URL and its gRPC address."""

    def __init__(self, url: str, grpc_address: str, process: ServerProcess) -> None:
        self.url, self.grpc, self.process = url, grpc_address, process
        self.proc = process.proc

    def http(self) -> thttp.InferenceServerClient:
        return thttp.InferenceServerClient(self.url.removeprefix("http://"))

    def client(self) -> tgrpc.InferenceServerClient:
        return tgrpc.InferenceServerClient(self.grpc)


@contextmanager
def serving(repository: Path, **settings: str) -> Iterator[Servers]:
    port = free_port()
    with server_process(repository, grpc_port=str(port), **settings) as server:
        yield Servers(server.url, f"127.0.0.1:{port}", server)


@pytest.fixture(scope="module")
def servers(model_repository: Path) -> Iterator[Servers]:
    with serving(model_repository) as running:
        yield running


def grpc_inputs(embeds: np.ndarray, mask: np.ndarray) -> list[tgrpc.InferInput]:
    tensors = [
        tgrpc.InferInput(graph_io.INPUT_EMBEDS, list(embeds.shape), "FP32"),
        tgrpc.InferInput(graph_io.INPUT_MASK, list(mask.shape), "INT64"),
    ]
    tensors[0].set_data_from_numpy(embeds)
    tensors[1].set_data_from_numpy(mask)
    return tensors


def http_answer(
    servers: Servers, embeds: np.ndarray, mask: np.ndarray, outputs: tuple[str, ...], **params: Any
) -> dict[str, np.ndarray]:
    tensors = [
        thttp.InferInput(graph_io.INPUT_EMBEDS, list(embeds.shape), "FP32"),
        thttp.InferInput(graph_io.INPUT_MASK, list(mask.shape), "INT64"),
    ]
    tensors[0].set_data_from_numpy(embeds, binary_data=True)
    tensors[1].set_data_from_numpy(mask, binary_data=True)
    client = servers.http()
    try:
        result = client.infer(
            MODEL,
            tensors,
            outputs=[thttp.InferRequestedOutput(n, binary_data=True) for n in outputs],
            parameters=params or None,
        )
    finally:
        client.close()
    return {name: result.as_numpy(name) for name in outputs}


def test_metadata_and_health_match_http(servers: Servers) -> None:
    client = servers.client()
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "attnserve" and "binary_tensor_data" in server["extensions"]
    assert server["version"] == VERSION  # as /v2 says it (tests/service/test_version.py)
    grpc_meta = client.get_model_metadata(MODEL, as_json=True)
    http = servers.http()
    http_meta = http.get_model_metadata(MODEL)
    http.close()
    for kind in ("inputs", "outputs"):
        as_grpc = [
            (t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in grpc_meta[kind]
        ]
        as_http = [(t["name"], t["datatype"], t["shape"]) for t in http_meta[kind]]
        assert as_grpc == as_http
    assert grpc_meta["versions"] == http_meta["versions"] == ["1"]
    client.close()
    with grpc.insecure_channel(servers.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_every_output_kind_equals_http_bitwise(servers: Servers) -> None:
    embeds, mask = ragged_batch(1)
    want = http_answer(servers, embeds, mask, EVERY_OUTPUT, pooling="mean", normalize=True)
    client = servers.client()
    result = client.infer(
        MODEL,
        grpc_inputs(embeds, mask),
        outputs=[tgrpc.InferRequestedOutput(n) for n in EVERY_OUTPUT],
        parameters={"pooling": "mean", "normalize": True},
        request_id="req-7",
        headers={"x-request-id": "grpc-id-1"},
    )
    client.close()
    answer = result.get_response()
    assert (answer.model_name, answer.model_version, answer.id) == (MODEL, "1", "req-7")
    assert [o.name for o in answer.outputs] == list(EVERY_OUTPUT)  # only those asked, in order
    for name in EVERY_OUTPUT:
        np.testing.assert_array_equal(result.as_numpy(name), want[name], err_msg=name)
    assert result.as_numpy(ATTENTIONS).shape == (3, 2, 4, 7, 7)


def test_only_the_outputs_asked_for(servers: Servers) -> None:
    embeds, mask = ragged_batch(2)
    client = servers.client()
    result = client.infer(
        MODEL, grpc_inputs(embeds, mask), outputs=[tgrpc.InferRequestedOutput(HIDDEN)]
    )
    client.close()
    assert [o.name for o in result.get_response().outputs] == [HIDDEN]
    want = http_answer(servers, embeds, mask, (HIDDEN,))
    np.testing.assert_array_equal(result.as_numpy(HIDDEN), want[HIDDEN])


def test_typed_contents_equal_raw_contents(servers: Servers) -> None:
    """Inputs as InferTensorContents (not raw_input_contents): the same answer."""
    from tritonclient.grpc import service_pb2 as pb

    embeds, mask = ragged_batch(3)
    request = pb.ModelInferRequest(model_name=MODEL)
    first = request.inputs.add(name=graph_io.INPUT_EMBEDS, datatype="FP32", shape=embeds.shape)
    first.contents.fp32_contents.extend(embeds.ravel().tolist())
    second = request.inputs.add(name=graph_io.INPUT_MASK, datatype="INT64", shape=mask.shape)
    second.contents.int64_contents.extend(mask.ravel().tolist())
    request.outputs.add(name=HIDDEN)
    with grpc.insecure_channel(servers.grpc) as channel:
        stub = tgrpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(request, timeout=30)
    got = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(answer.outputs[0].shape)
    np.testing.assert_array_equal(got, http_answer(servers, embeds, mask, (HIDDEN,))[HIDDEN])


def status_of(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_errors_map_to_grpc_codes_with_the_http_messages(servers: Servers) -> None:
    client = servers.client()
    embeds, mask = ragged_batch(4)
    error = status_of(lambda: client.infer("nope", grpc_inputs(embeds, mask)))
    assert error.status() == "StatusCode.NOT_FOUND" and "'nope' is not served here" in str(error)
    wrong = tgrpc.InferInput("embeds", [1, 2, D_MODEL], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 2, D_MODEL), np.float32))
    error = status_of(lambda: client.infer(MODEL, [wrong]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unknown input 'embeds'" in str(error)
    bad_mask = mask.copy()
    bad_mask[0, 1] = 0  # a hole: not ones then zeros
    error = status_of(lambda: client.infer(MODEL, grpc_inputs(embeds, bad_mask)))
    http = status_of(lambda: http_answer(servers, embeds, bad_mask, (HIDDEN,)))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == http.message()  # the same words as HTTP /v2
    error = status_of(
        lambda: client.infer(
            MODEL, grpc_inputs(embeds, mask), outputs=[tgrpc.InferRequestedOutput("x")]
        )
    )
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "unknown output 'x'" in str(error)
    # Still serving after every refusal.
    assert client.infer(MODEL, grpc_inputs(embeds, mask)).as_numpy(HIDDEN).shape == (3, 7, D_MODEL)
    client.close()


def test_a_deadline_that_expires_is_deadline_exceeded(servers: Servers) -> None:
    """A call whose deadline passes while its work is queued: DEADLINE_EXCEEDED, and the
    server goes on serving (its queued work was dropped, not run for nobody)."""
    rng = np.random.default_rng(5)
    embeds = rng.standard_normal((8, 128, D_MODEL)).astype(np.float32)
    mask = np.ones((8, 128), np.int64)
    client = servers.client()
    error = status_of(
        lambda: client.infer(
            MODEL,
            grpc_inputs(embeds, mask),
            outputs=[tgrpc.InferRequestedOutput(ATTENTIONS)],
            client_timeout=0.001,
        )
    )
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    small, small_mask = ragged_batch(6)
    assert client.infer(MODEL, grpc_inputs(small, small_mask)).as_numpy(HIDDEN) is not None
    client.close()


def test_64_concurrent_calls_through_the_aio_client(servers: Servers) -> None:
    batches = [ragged_batch(100 + i) for i in range(64)]

    async def scenario() -> list[np.ndarray]:
        client = tgrpc_aio.InferenceServerClient(servers.grpc)
        try:
            results = await asyncio.gather(
                *(
                    client.infer(
                        MODEL,
                        grpc_inputs(e, m),
                        outputs=[tgrpc.InferRequestedOutput(HIDDEN)],
                    )
                    for e, m in batches
                )
            )
        finally:
            await client.close()
        return [r.as_numpy(HIDDEN) for r in results]

    answers = asyncio.run(scenario())
    for k in (0, 31, 63):  # a sample, each against its own HTTP answer
        e, m = batches[k]
        np.testing.assert_array_equal(answers[k], http_answer(servers, e, m, (HIDDEN,))[HIDDEN])
    assert len(answers) == 64


def test_text_equals_http(minilm_repository: Path) -> None:
    texts = np.array([b"A man is playing a guitar.", b"Hello"], dtype=object)
    with serving(minilm_repository) as servers:
        text = tgrpc.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(texts)
        client = servers.client()
        result = client.infer(
            "minilm-l6",
            [text],
            outputs=[tgrpc.InferRequestedOutput(n) for n in ("pooled", HIDDEN, "attention_mask")],
            parameters={"pooling": "mean", "normalize": True},
        )
        client.close()
        http_text = thttp.InferInput("text", [2], "BYTES")
        http_text.set_data_from_numpy(texts, binary_data=True)
        http = servers.http()
        want = http.infer(
            "minilm-l6",
            [http_text],
            outputs=[thttp.InferRequestedOutput(n, binary_data=True) for n in ("pooled", HIDDEN)],
            parameters={"pooling": "mean", "normalize": True},
        )
        http.close()
        for name in ("pooled", HIDDEN):
            np.testing.assert_array_equal(result.as_numpy(name), want.as_numpy(name))
        assert result.as_numpy("attention_mask").sum(axis=1).tolist()[1] == 3  # [CLS] hello [SEP]


def test_api_key_in_metadata(model_repository: Path) -> None:
    embeds, mask = ragged_batch(7)
    with serving(model_repository, api_key=KEY) as servers:
        client = servers.client()
        assert client.is_server_live()  # health stays open
        for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
            error = status_of(
                lambda h=headers: client.infer(MODEL, grpc_inputs(embeds, mask), headers=h)
            )
            assert error.status() == "StatusCode.UNAUTHENTICATED", headers
        error = status_of(lambda: client.get_model_metadata(MODEL))
        assert error.status() == "StatusCode.UNAUTHENTICATED"
        good = {"authorization": f"Bearer {KEY}"}
        result = client.infer(MODEL, grpc_inputs(embeds, mask), headers=good)
        assert result.as_numpy(HIDDEN).shape == (3, 7, D_MODEL)
        client.close()


def test_an_oversized_message_is_refused_and_the_server_goes_on(model_repository: Path) -> None:
    embeds = np.zeros((4, 100, D_MODEL), np.float32)  # 51 KB of floats
    with serving(model_repository, max_body_bytes="32768") as servers:
        client = servers.client()
        error = status_of(
            lambda: client.infer(MODEL, grpc_inputs(embeds, np.ones((4, 100), np.int64)))
        )
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        small, small_mask = ragged_batch(8)
        assert client.infer(MODEL, grpc_inputs(small, small_mask)).as_numpy(HIDDEN) is not None
        client.close()


def test_admission_refusal_is_resource_exhausted_with_a_retry_hint(model_repository: Path) -> None:
    """One request at a time: of 12 concurrent heavy calls some are refused with
    RESOURCE_EXHAUSTED and retry-after in the trailing metadata; none is lost."""
    rng = np.random.default_rng(9)
    embeds = rng.standard_normal((4, 128, D_MODEL)).astype(np.float32)
    mask = np.ones((4, 128), np.int64)
    with serving(model_repository, max_queued_requests="1") as servers:
        request_inputs = grpc_inputs(embeds, mask)
        with grpc.insecure_channel(servers.grpc) as channel:
            stub = tgrpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
            from tritonclient.grpc import service_pb2 as pb

            request = pb.ModelInferRequest(model_name=MODEL)
            for tensor in request_inputs:
                request.inputs.append(tensor._get_tensor())
                request.raw_input_contents.append(tensor._get_content())
            request.outputs.add(name=ATTENTIONS)
            calls = [stub.ModelInfer.future(request, timeout=60) for _ in range(12)]
            refused = done = 0
            for call in calls:
                try:
                    call.result()
                    done += 1
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    trailers = dict(exc.trailing_metadata() or ())
                    assert int(trailers["retry-after"]) >= 1
                    refused += 1
        assert done >= 1 and refused >= 1 and done + refused == 12


def test_sigterm_finishes_calls_in_flight_then_refuses_and_exits_0(
    minilm_repository: Path,
) -> None:
    """MiniLM, so that six [4, 128] attention calls are still running at SIGTERM."""
    rng = np.random.default_rng(10)
    embeds = rng.standard_normal((4, 128, 384)).astype(np.float32)
    mask = np.ones((4, 128), np.int64)
    model = "minilm-l6"
    with serving(minilm_repository, drain_seconds="1.5", shutdown_timeout="20") as servers:
        results: list[Any] = []

        def call() -> None:
            client = servers.client()
            try:
                got = client.infer(
                    model,
                    grpc_inputs(embeds, mask),
                    outputs=[tgrpc.InferRequestedOutput(ATTENTIONS)],
                )
                results.append(got.as_numpy(ATTENTIONS).shape)
            except InferenceServerException as exc:
                results.append(exc.status())
            finally:
                client.close()

        threads = [threading.Thread(target=call) for _ in range(6)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # the calls are in
        servers.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # inside the drain: new work refused, health NOT_SERVING
        client = servers.client()
        error = status_of(lambda: client.infer(model, grpc_inputs(embeds[:1], mask[:1])))
        assert error.status() == "StatusCode.UNAVAILABLE" and "shutting down" in str(error)
        client.close()
        with grpc.insecure_channel(servers.grpc) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        for thread in threads:
            thread.join(timeout=30)
        assert results == [(4, 6, 12, 128, 128)] * 6  # every accepted call answered
        assert servers.proc.wait(timeout=30) == 0


def test_rpcs_not_served_answer_unimplemented(servers: Servers) -> None:
    from tritonclient.grpc import service_pb2 as pb

    with grpc.insecure_channel(servers.grpc) as channel:
        stub = tgrpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for call, request in (
            (stub.ModelStatistics, pb.ModelStatisticsRequest(name=MODEL)),
            (stub.ModelConfig, pb.ModelConfigRequest(name=MODEL)),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call(request, timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED, call
        # And the server is unharmed.
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live


def test_calls_are_logged_as_json_with_protocol_and_request_id(model_repository: Path) -> None:
    with serving(model_repository, log_format="json", log_level="info") as servers:
        client = servers.client()
        client.infer(MODEL, grpc_inputs(*ragged_batch(12)), headers={"x-request-id": "grpc-log-1"})
        client.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            lines = [json.loads(x) for x in servers.process.log().splitlines() if x.startswith("{")]
            calls = [x for x in lines if x.get("protocol") == "grpc"]
            if calls:
                break
            time.sleep(0.05)
        (call,) = calls
        assert call["request_id"] == "grpc-log-1"
        assert "/inference.GRPCInferenceService/ModelInfer 200" in call["message"]
