"""SIGTERM drains (issue 10) and Ctrl-C does not, through a real server on 127.0.0.1.

On SIGTERM readiness and new work answer 503 ``shutting_down`` with
Retry-After while the listener stays open ATTNSERVE_DRAIN_SECONDS; every
request accepted before the signal is answered; then the process exits 0
within ATTNSERVE_SHUTDOWN_TIMEOUT, whatever slow, idle or silent clients do. A
second signal skips the rest of the drain. SIGINT (Ctrl-C) skips the drain: an
idle server exits at once, a busy one once what it accepted is answered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from model_export.config import EncoderConfig
from model_export.export import export_model
from model_export.manifest import Manifest
from model_export.model import Encoder
from tests.conftest import ServerProcess, free_port, server_process
from tests.service.helpers import as_array, b64_array
from tests.service.raw_http import address, held_for, post_head
from tests.support.inputs import sequences
from tests.support.metrics import metric
from tests.support.onnx_runs import ort_encode
from tests.support.tiny import D_MODEL, MODEL_MAX_SEQ_LEN, N_HEADS, N_LAYERS
from tests.support.wait import wait_until

DRAIN_SECONDS = 2.0
SHUTDOWN_TIMEOUT = 6.0
EXIT_MARGIN = 2.0  # seconds allowed past shutdown_timeout for the process to be reaped
ATOL = 1e-5  # same graph, different batch composition and padding: float32 noise only
GOOD = {"inputs": [[[0.25] * D_MODEL] * 3]}


# -- helpers --------------------------------------------------------------------------------


def ready_status(url: str) -> int | None:
    """GET /health/ready on a new connection; None if the connection was refused."""
    try:
        return httpx.get(f"{url}/health/ready", timeout=5).status_code
    except httpx.TransportError:
        return None


def assert_shutting_down(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["error_type"] == "shutting_down", r.text
    assert float(r.headers["retry-after"]) > 0


def exit_status(server: ServerProcess, timeout: float) -> int:
    """The server's exit status, waiting at most ``timeout`` seconds (AssertionError)."""
    deadline = time.monotonic() + timeout
    while server.proc.poll() is None:
        assert time.monotonic() < deadline, f"still running after {timeout} s:\n{server.log()}"
        time.sleep(0.05)
    return server.proc.returncode


# -- in-flight requests are answered --------------------------------------------------------

IN_FLIGHT = 6
SEQS_PER_REQUEST = 8


def test_sigterm_answers_in_flight_requests_and_drains(
    model_repository: Path, attention_session: ort.InferenceSession
) -> None:
    # Attention on the longest sequences the tiny model takes: ~6 MB answers.
    lengths = (MODEL_MAX_SEQ_LEN,) * SEQS_PER_REQUEST
    inputs = [sequences(lengths, seed=500 + k) for k in range(IN_FLIGHT)]
    bodies = [
        json.dumps(
            {
                "inputs": [b64_array(s) for s in seqs],
                "return_attention": True,
                "encoding_format": "base64",
            }
        ).encode()
        for seqs in inputs
    ]
    with (
        server_process(
            model_repository,
            drain_seconds=str(DRAIN_SECONDS),
            shutdown_timeout=str(SHUTDOWN_TIMEOUT),
            log_level="info",
        ) as server,
        contextlib.ExitStack() as stack,
    ):
        url = server.url
        socks = [
            stack.enter_context(socket.create_connection(address(url), timeout=10)) for _ in bodies
        ]
        # Each request is sent but for its last byte, so each is accepted (past admission,
        # holding its announced bytes) when the signal comes, and still in progress.
        for sock, body in zip(socks, bodies, strict=True):
            sock.sendall(post_head("/v1/encode", len(body)) + body[:-1])
        held = sum(held_for(body[:-1]) for body in bodies)
        wait_until(  # all of them are being read
            lambda: metric(url, "attnserve_in_flight_bytes") == held,
            "the bodies are not all being read",
            10.0,
        )

        server.proc.send_signal(signal.SIGTERM)
        for sock, body in zip(socks, bodies, strict=True):
            sock.sendall(body[-1:])

        # Draining: the listener is open, readiness and new work answer 503.
        wait_until(lambda: ready_status(url) != 200, "still ready", DRAIN_SECONDS)
        assert ready_status(url) == 503, "the listener closed at once"
        assert_shutting_down(httpx.get(f"{url}/health/ready", timeout=5))
        assert_shutting_down(httpx.post(f"{url}/v1/encode", json=GOOD, timeout=5))

        for k, (sock, seqs) in enumerate(zip(socks, inputs, strict=True)):
            answer = http.client.HTTPResponse(sock, method="POST")
            answer.begin()
            raw = answer.read()
            assert answer.status == 200, (k, raw[:300])
            data = json.loads(raw)["data"]
            assert len(data) == len(seqs)
            expected = ort_encode(attention_session, seqs)
            for item, seq, (hidden, attention) in zip(data, seqs, expected, strict=True):
                n = len(seq)
                emb, attn = as_array(item["embeddings"]), as_array(item["attention"])
                assert emb.shape == (n, D_MODEL)
                assert attn.shape == (N_LAYERS, N_HEADS, n, n)
                np.testing.assert_allclose(emb, hidden, rtol=0, atol=ATOL)
                assert attention is not None
                np.testing.assert_allclose(attn, attention, rtol=0, atol=ATOL)

        assert exit_status(server, SHUTDOWN_TIMEOUT + EXIT_MARGIN) == 0, server.log()
        assert "shutdown timeout reached" not in server.log()  # a graceful exit


# -- slow, idle and silent clients cannot hold the exit -------------------------------------


def trickle(sock: socket.socket, stop: threading.Event) -> None:
    """Send one body byte every 0.3 s (at most 60) until ``stop`` or the server closes."""
    for _ in range(60):
        if stop.wait(0.3):
            return
        try:
            sock.sendall(b" ")
        except OSError:
            return


def test_sigterm_exits_despite_slow_idle_and_silent_clients(model_repository: Path) -> None:
    with (
        server_process(
            model_repository,
            drain_seconds=str(DRAIN_SECONDS),
            shutdown_timeout=str(SHUTDOWN_TIMEOUT),
            # Defaults spelled out: each alone would outlast the shutdown timeout.
            body_timeout="30",
            header_timeout="10",
            keep_alive_timeout="5",
        ) as server,
        contextlib.ExitStack() as stack,
    ):
        url = server.url

        def connect() -> socket.socket:
            return stack.enter_context(socket.create_connection(address(url), timeout=10))

        slow = connect()
        slow.sendall(post_head("/v1/encode", 1000) + b"{")
        stop = threading.Event()
        stack.callback(stop.set)
        sender = threading.Thread(target=trickle, args=(slow, stop))
        sender.start()
        stack.callback(sender.join, 5.0)
        wait_until(
            lambda: metric(url, "attnserve_in_flight_bytes") >= held_for(b"{"),
            "its body is not being read",
            10.0,
        )

        idle = connect()  # keep-alive, between requests
        idle.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        live = http.client.HTTPResponse(idle)
        live.begin()
        live.read()
        assert live.status == 200 and not live.will_close
        for _ in range(5):
            connect()  # silent: connected, sent nothing

        server.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # The slow client is told (503) or cut off, not left hanging.
        slow.settimeout(SHUTDOWN_TIMEOUT + EXIT_MARGIN)
        try:
            data = slow.recv(65536)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            raise AssertionError(f"the slow client is still waiting:\n{server.log()}") from None
        assert data == b"" or data.startswith(b"HTTP/1.1 503 "), data
        left = SHUTDOWN_TIMEOUT + EXIT_MARGIN - (time.monotonic() - signalled)
        assert exit_status(server, left) == 0, server.log()


# -- a second signal ------------------------------------------------------------------------


def test_second_sigterm_skips_the_drain(model_repository: Path) -> None:
    with server_process(model_repository, drain_seconds="20", shutdown_timeout="30") as server:
        url = server.url
        server.proc.send_signal(signal.SIGTERM)

        wait_until(lambda: ready_status(url) != 200, "still ready", 5.0)
        assert ready_status(url) == 503, "the listener closed at once"
        assert_shutting_down(httpx.get(f"{url}/health/ready", timeout=5))
        server.proc.send_signal(signal.SIGTERM)
        # Well before the 20 s drain would have ended.
        assert exit_status(server, 5.0) == 0, server.log()


# -- work longer than the grace window is answered 503, in its protocol's shape ----------

# The tiny model with a wide feed-forward layer: ~25 ms per sequence here for the same
# 16 kB of input, so a request of a few megabytes runs for seconds.
SLOW_D_FF = 16384
SLOW_SEQUENCES = 256  # per request: ~6 s of runs here, several times the grace window
CTRL_C_SEQUENCES = 128  # ~3 s of runs here: longer than an idle server takes to exit
CUT_DRAIN = 0.5
CUT_SHUTDOWN = 4.0  # grace window: 4 - 0.5 drain - 0.5 answer - 2 lifespan = 1 s


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = EncoderConfig(
        d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, d_ff=SLOW_D_FF, max_seq_len=128
    )
    repo = tmp_path_factory.mktemp("slow-models")
    export_model(
        Encoder(config, seed=7), repo / "slow", name="slow", exporter="torchscript", optimize=False
    )
    return repo


def grpc_pooled_infer(address: str, embeds: np.ndarray) -> grpc.RpcError | pb.ModelInferResponse:
    """ModelInfer of ``embeds`` for pooled vectors, on a raw stub (its error's trailers)."""
    request = pb.ModelInferRequest(
        model_name="slow",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="inputs_embeds", datatype="FP32", shape=list(embeds.shape)
            )
        ],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="pooled")],
        raw_input_contents=[embeds.tobytes()],
    )
    request.parameters["pooling"].string_param = "mean"
    with grpc.insecure_channel(address) as channel:
        try:
            answer: pb.ModelInferResponse = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request, timeout=30
            )
            return answer
        except grpc.RpcError as exc:
            return exc


def test_work_past_the_grace_window_is_answered_503_not_cut(slow_repository: Path) -> None:
    lengths = (MODEL_MAX_SEQ_LEN,) * SLOW_SEQUENCES
    native = json.dumps(
        {
            "inputs": [b64_array(s) for s in sequences(lengths, seed=3)],
            "pooling": "mean",
            "encoding_format": "base64",
        }
    ).encode()
    embeds = np.ascontiguousarray(np.stack(sequences(lengths, seed=4)), dtype="<f4")
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "inputs_embeds",
                    "shape": list(embeds.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": embeds.nbytes},
                }
            ],
            "outputs": [{"name": "pooled"}],
            "parameters": {"pooling": "mean"},
        }
    ).encode()
    grpc_port = free_port()
    with server_process(
        slow_repository,
        drain_seconds=str(CUT_DRAIN),
        shutdown_timeout=str(CUT_SHUTDOWN),
        grpc_port=str(grpc_port),
        log_level="info",
    ) as server:
        url = server.url
        answers: dict[str, object] = {}

        def post(name: str, path: str, body: bytes, headers: dict[str, str]) -> None:
            try:
                answers[name] = httpx.post(
                    f"{url}{path}",
                    content=body,
                    headers={"content-type": "application/json", **headers},
                    timeout=30,
                )
            except httpx.TransportError as exc:  # a cut connection: what must not happen
                answers[name] = exc

        v2_headers = {"Inference-Header-Content-Length": str(len(header))}
        calls = [
            threading.Thread(target=post, args=("native", "/v1/encode", native, {})),
            threading.Thread(
                target=post,
                args=("v2", "/v2/models/slow/infer", header + embeds.tobytes(), v2_headers),
            ),
            threading.Thread(
                target=lambda: answers.update(
                    grpc=grpc_pooled_infer(f"127.0.0.1:{grpc_port}", embeds)
                )
            ),
        ]
        for call in calls:
            call.start()
        # All three accepted (bodies read, work queued) before the signal. CI's loaded
        # machine once took over 10 s to read the three bodies: the wait is generous and
        # says what it saw (the runs behind them take several times longer still).
        seen: list[float] = []

        def all_three_admitted() -> bool:
            seen.append(metric(url, "attnserve_in_flight_requests"))
            return seen[-1] == 3

        try:
            wait_until(all_three_admitted, "not 3 in flight", 30.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: counts seen {sorted(set(seen))}, {answers}") from exc
        server.proc.send_signal(signal.SIGTERM)
        for call in calls:
            call.join(CUT_SHUTDOWN + EXIT_MARGIN)
        assert exit_status(server, CUT_SHUTDOWN + EXIT_MARGIN) == 0, server.log()
        log = server.log()

    native_answer, v2_answer, grpc_answer = answers["native"], answers["v2"], answers["grpc"]
    assert isinstance(native_answer, httpx.Response), native_answer
    assert_shutting_down(native_answer)  # native: {"error", "error_type"}
    assert isinstance(v2_answer, httpx.Response), v2_answer
    assert_shutting_down(v2_answer)  # the Open Inference Protocol's {"error", ...}
    assert "shutting down" in v2_answer.json()["error"]
    assert isinstance(grpc_answer, grpc.RpcError), grpc_answer
    assert grpc_answer.code() == grpc.StatusCode.UNAVAILABLE, grpc_answer
    assert "shutting down" in (grpc_answer.details() or "")
    assert float(dict(grpc_answer.trailing_metadata() or ())["retry-after"]) > 0
    assert "shutdown timeout reached" not in log  # a graceful exit


# -- Ctrl-C: no drain, but what was accepted is answered -----------------------------------

IDLE_EXIT_SECONDS = 1.5  # SIGINT to exit, idle (measured ~0.4 s here)
LONG_DRAIN = "20"  # a drain no test waits for: seen only if a signal does not skip it


def test_ctrl_c_stops_an_idle_server_at_once_while_sigterm_drains(model_repository: Path) -> None:
    """SIGINT is a person at a terminal: no balancer to wait for, so no drain. SIGTERM on
    the same idle server still keeps listening for the drain (the control)."""
    with (
        server_process(
            model_repository, drain_seconds=LONG_DRAIN, shutdown_timeout="30"
        ) as terminal,
        server_process(
            model_repository, drain_seconds=LONG_DRAIN, shutdown_timeout="30"
        ) as orchestrated,
    ):
        orchestrated.proc.send_signal(signal.SIGTERM)
        terminal.proc.send_signal(signal.SIGINT)
        assert exit_status(terminal, IDLE_EXIT_SECONDS) == 0, terminal.log()
        assert "shutdown timeout reached" not in terminal.log()

        assert orchestrated.proc.poll() is None, "SIGTERM skipped the drain"
        assert_shutting_down(httpx.get(f"{orchestrated.url}/health/ready", timeout=5))
        orchestrated.proc.send_signal(signal.SIGTERM)  # a second one skips the rest
        assert exit_status(orchestrated, 5.0) == 0, orchestrated.log()


def encode_in_background(
    url: str, body: dict[str, object]
) -> tuple[threading.Thread, list[httpx.Response | httpx.TransportError]]:
    """``POST /v1/encode`` on a started thread; its answer, or the transport error that
    cut it (what these tests check does not happen), lands in the list."""
    answers: list[httpx.Response | httpx.TransportError] = []

    def post() -> None:
        try:
            answers.append(httpx.post(f"{url}/v1/encode", json=body, timeout=30))
        except httpx.TransportError as exc:
            answers.append(exc)

    call = threading.Thread(target=post)
    call.start()
    return call, answers


def test_ctrl_c_answers_the_work_in_progress_before_exiting(slow_repository: Path) -> None:
    lengths = (MODEL_MAX_SEQ_LEN,) * CTRL_C_SEQUENCES
    body = {
        "inputs": [b64_array(s) for s in sequences(lengths, seed=5)],
        "pooling": "mean",
        "encoding_format": "base64",
    }
    with server_process(
        slow_repository, drain_seconds=LONG_DRAIN, shutdown_timeout="40", log_level="info"
    ) as server:
        url = server.url
        call, answers = encode_in_background(url, body)
        wait_until(
            lambda: metric(url, "attnserve_in_flight_requests") == 1,
            "the request never started",
            10.0,
        )
        server.proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        time.sleep(IDLE_EXIT_SECONDS)
        # The control: an idle server would be gone by now; this one is still at work.
        assert not answers, "the request ended too soon to show the wait"
        assert server.proc.poll() is None, server.log()
        call.join(30)
        assert exit_status(server, 10.0) == 0, server.log()
        waited = time.monotonic() - signalled

    (answer,) = answers
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    assert len(data) == CTRL_C_SEQUENCES
    assert all(as_array(item["pooled"]).shape == (D_MODEL,) for item in data)
    assert waited < float(LONG_DRAIN), "the drain was not skipped"


# -- model loads: refused once draining, an accepted one answered -----------------------


def index_state(url: str, name: str) -> str:
    """The repository index's state of model ``name``."""
    r = httpx.post(f"{url}/v2/repository/index", json={}, timeout=5)
    return next(str(e.get("state", "")) for e in r.json() if e["name"] == name)


def test_draining_refuses_new_loads_at_once_and_answers_an_accepted_one(
    tmp_path: Path, model_repository: Path, long_run_repository: Path
) -> None:
    repo = tmp_path / "models"
    shutil.copytree(model_repository / "tiny", repo / "tiny")
    # The deep model takes seconds to load (its sessions made and warmed up); the slow one
    # took long only while calibration was part of a load, which now follows it.
    shutil.copytree(long_run_repository / "deep", repo / "slow")
    dataclasses.replace(Manifest.read(repo / "slow"), name="slow").write(repo / "slow")
    shutil.copytree(long_run_repository / "deep", repo / "slow2")
    dataclasses.replace(Manifest.read(repo / "slow2"), name="slow2").write(repo / "slow2")
    with server_process(
        repo,
        model_control="explicit",
        default_model="tiny",
        drain_seconds="2",
        shutdown_timeout="10",
        log_level="info",
    ) as server:
        url = server.url
        answers: dict[str, httpx.Response] = {}
        accepted = threading.Thread(
            target=lambda: answers.update(
                slow=httpx.post(f"{url}/v2/repository/models/slow/load", timeout=30)
            )
        )
        accepted.start()
        wait_until(
            lambda: index_state(url, "slow") == "LOADING", f"not loading: {server.log()}", 10.0
        )
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: ready_status(url) == 503, "still ready", 5.0)

        # A new load is refused at once, while the accepted one is still at work (it holds
        # the load lock: before, the new one waited for it, then did its own work).
        refused = httpx.post(f"{url}/v2/repository/models/slow2/load", timeout=30)
        still_loading = index_state(url, "slow") == "LOADING"
        assert_shutting_down(refused)
        assert still_loading, "the new load was answered only once the accepted one had ended"

        accepted.join(30)
        # The load accepted before the signal completes with its answer (it had begun).
        assert answers["slow"].status_code == 200, answers["slow"].text
        assert exit_status(server, 10 + EXIT_MARGIN) == 0, server.log()


# -- a run in progress at the end of the grace window is cut, not waited for ----------------

# The slow model's layers, deeper: one full batch (32 x 128 tokens) is one run of several
# seconds here, longer than the whole shutdown timeout below.
LONG_RUN_LAYERS = 16
LONG_RUN_SEQUENCES = 4096 // MODEL_MAX_SEQ_LEN  # one batch of ATTNSERVE_MAX_BATCH_TOKENS


@pytest.fixture(scope="module")
def long_run_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = EncoderConfig(
        d_model=D_MODEL,
        n_heads=N_HEADS,
        n_layers=LONG_RUN_LAYERS,
        d_ff=SLOW_D_FF,
        max_seq_len=MODEL_MAX_SEQ_LEN,
    )
    repo = tmp_path_factory.mktemp("long-run-models")
    export_model(
        Encoder(config, seed=7), repo / "deep", name="deep", exporter="torchscript", optimize=False
    )
    return repo


def test_a_run_outlasting_the_grace_window_is_cut_and_the_server_exits_in_time(
    long_run_repository: Path,
) -> None:
    """One onnxruntime run of several seconds is under way at SIGTERM: its request is
    answered 503 at the end of the grace window, the run is stopped there (onnxruntime's
    RunOptions.terminate), and the process exits gracefully within the shutdown timeout.
    It used to wait for the run, until the watchdog's forced exit."""
    lengths = (MODEL_MAX_SEQ_LEN,) * LONG_RUN_SEQUENCES
    body = {"inputs": [b64_array(s) for s in sequences(lengths, seed=6)], "pooling": "mean"}
    with server_process(
        long_run_repository,
        drain_seconds=str(CUT_DRAIN),
        shutdown_timeout=str(CUT_SHUTDOWN),
        warmup="false",  # no calibration: the first request's batch is the one long run
        log_level="info",
    ) as server:
        url = server.url
        call, answers = encode_in_background(url, body)
        wait_until(  # its one run has begun
            lambda: metric(url, "attnserve_queue_seconds_count") == 1, "no run began", 10.0
        )
        server.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        call.join(CUT_SHUTDOWN + EXIT_MARGIN)
        assert exit_status(server, CUT_SHUTDOWN + EXIT_MARGIN) == 0, server.log()
        exited = time.monotonic() - signalled
        log = server.log()

    (answer,) = answers
    assert isinstance(answer, httpx.Response), answer
    assert_shutting_down(answer)
    assert "shutdown timeout reached" not in log, log  # no forced exit
    assert "was cut" in log, log
    assert exited < CUT_SHUTDOWN, exited
