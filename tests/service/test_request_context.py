"""Request ids, timing headers, JSON logs, strict inputs, short errors and start-up checks."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.server import warn_if_exposed
from service.settings import Settings
from tests.conftest import ServerFailed, running_server, server_process
from tests.service.helpers import TIMEOUT
from tests.support.inputs import sequences
from tests.support.tiny import D_MODEL

# An error about a 1 MB value stays this short (its message is cut at 1,000 characters).
MAX_ERROR_BODY = 2_000


def _seq(n: int = 3) -> list[list[float]]:
    rows: list[list[float]] = sequences((n,), seed=5)[0].tolist()
    return rows


def test_every_response_carries_request_id_and_timings(http_client: httpx.Client) -> None:
    r = http_client.post(
        "/v1/encode", json={"inputs": [_seq()]}, headers={"x-request-id": "job-42"}
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "job-42"
    queue, compute = float(r.headers["x-queue-time"]), float(r.headers["x-compute-time"])
    assert queue >= 0 and compute > 0  # it ran: onnxruntime time is never zero
    for response in (
        http_client.get("/health/live"),
        http_client.get("/nowhere"),
        http_client.get("/metrics"),
    ):
        generated = response.headers["x-request-id"]
        assert len(generated) == 32 and int(generated, 16) >= 0  # a fresh uuid4 hex
        assert float(response.headers["x-compute-time"]) == 0.0  # no inference
    # An id that is too long or not visible ASCII is replaced, never echoed.
    r = http_client.get("/health/live", headers={"x-request-id": "x" * 200})
    assert r.headers["x-request-id"] != "x" * 200


def test_strict_booleans_numbers_and_indices(http_client: httpx.Client) -> None:
    """JSON true is not 1.0, "yes" is not a boolean, "0" and true are not indices."""
    row = [0.5] * D_MODEL
    cases = [
        {"inputs": [[[True, *row[1:]]]]},
        {"inputs": [_seq()], "return_attention": "yes"},
        {"inputs": [_seq()], "return_attention": 1},
        {"inputs": [_seq()], "return_attention": True, "attention": {"heads": ["0"]}},
        {"inputs": [_seq()], "return_attention": True, "attention": {"layers": [True]}},
        {"inputs": [_seq()], "return_attention": True, "attention": {"heads": [0.0]}},
    ]
    for body in cases:
        r = http_client.post("/v1/encode", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error_type"] == "invalid_input"
    assert http_client.post("/v1/encode", json={"inputs": [[row]]}).status_code == 200


def test_repeated_attention_indices_are_refused_not_multiplied(http_client: httpx.Client) -> None:
    """200,000 repeats of head 0 once asked numpy for 293 GiB (a 500); now a short 422."""
    body = {
        "inputs": [_seq(8)],
        "return_attention": True,
        "attention": {"heads": [0] * 200_000, "reduce": "mean"},
    }
    r = http_client.post("/v1/encode", json=body)
    assert r.status_code == 422, r.text
    assert "heads [0] repeated" in r.json()["error"]
    assert len(r.content) < MAX_ERROR_BODY


def test_errors_do_not_echo_huge_values(http_client: httpx.Client) -> None:
    r = http_client.post("/v1/encode", json={"inputs": [_seq()], "model": "m" * 1_000_000})
    assert r.status_code == 404 and r.json()["error_type"] == "model_not_found"
    assert len(r.content) < MAX_ERROR_BODY
    r = http_client.post(
        "/v1/encode", content=b"{}", headers={"content-type": "text/" + "x" * 5000}
    )
    assert r.status_code == 415 and len(r.content) < MAX_ERROR_BODY


def test_bad_request_timeout_header_is_400(http_client: httpx.Client) -> None:
    for value in ("soon", "-1", "0", "nan", "inf", "1e9"):
        r = http_client.post(
            "/v1/encode", json={"inputs": [_seq()]}, headers={"x-request-timeout": value}
        )
        assert r.status_code == 400, (value, r.text)
        assert r.json()["error_type"] == "invalid_header"


def test_deadline_already_passed_is_504_with_retry_after(http_client: httpx.Client) -> None:
    r = http_client.post(
        "/v1/encode", json={"inputs": [_seq()]}, headers={"x-request-timeout": "0.000001"}
    )
    assert r.status_code == 504 and r.json()["error_type"] == "deadline_exceeded"
    assert int(r.headers["retry-after"]) >= 1
    ok = http_client.post(
        "/v1/encode", json={"inputs": [_seq()]}, headers={"x-request-timeout": "30"}
    )
    assert ok.status_code == 200


def test_json_logs_carry_the_request_id(model_repository: Path) -> None:
    with server_process(model_repository, log_format="json", log_level="info") as server:
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
            r = c.post("/v1/encode", json={"inputs": [_seq()]}, headers={"x-request-id": "trace-7"})
            assert r.status_code == 200
        server.proc.terminate()
        assert server.proc.wait(timeout=30) == 0
        lines = [line for line in server.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message", "request_id"} <= set(r) for r in records)
    access = [
        r for r in records if r["logger"] == "uvicorn.access" and "/v1/encode" in r["message"]
    ]
    assert access and access[0]["request_id"] == "trace-7"


def test_a_non_ascii_api_key_refuses_to_start(model_repository: Path) -> None:
    """Such a key could never match a header, so every request would be a 401."""
    with (
        pytest.raises(ServerFailed) as failed,
        running_server(model_repository, api_key="clé-secrète"),
    ):
        pytest.fail("the server started")  # pragma: no cover
    assert failed.value.returncode != 0
    assert "printable ASCII" in failed.value.log


def test_drain_must_be_shorter_than_the_shutdown_timeout() -> None:
    with pytest.raises(ValueError, match="drain_seconds"):
        Settings(drain_seconds=30, shutdown_timeout=10)


@pytest.mark.parametrize(
    ("host", "key", "warned"),
    [("0.0.0.0", None, True), ("10.1.2.3", None, True), ("127.0.0.1", None, False),
     ("localhost", None, False), ("::1", None, False), ("0.0.0.0", "k3y", False)],
)  # fmt: skip
def test_warns_when_exposed_without_a_key(
    caplog: pytest.LogCaptureFixture, host: str, key: str | None, warned: bool
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.server"):
        warn_if_exposed(Settings(host=host, api_key=key))  # type: ignore[arg-type]
    assert ("no API key" in caplog.text) == warned


def test_booleans_in_kserve_fp32_data_are_refused(http_client: httpx.Client) -> None:
    data = np.zeros((1, 2, D_MODEL), np.float32).tolist()
    data[0][0][0] = True
    body = {"inputs": [{"name": "inputs_embeds", "datatype": "FP32", "shape": [1, 2, D_MODEL],
                        "data": data}]}  # fmt: skip
    r = http_client.post("/v2/models/tiny/infer", json=body)
    assert r.status_code == 422 and "FP32 values" in r.json()["error"], r.text
    data[0][0][0] = 1.0
    assert http_client.post("/v2/models/tiny/infer", json=body).status_code == 200


def test_an_early_answer_is_the_only_answer(server_url: str) -> None:
    """A 413 sent from the headers alone; the rest of that body is still body, dropped,
    never read as the next request's headers (it once drew a second, 431, answer)."""
    host, port = server_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 40000000\r\n\r\n"
        )
        first = _read_response(sock)
        assert first.startswith(b"HTTP/1.1 413 "), first[:100]
        sock.sendall(b" " * 200_000)  # beyond the 64 KiB header limit
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):  # nothing more comes: no second answer
            extra = sock.recv(65536)
            pytest.fail(f"a second answer: {extra[:100]!r}")


def _read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body
