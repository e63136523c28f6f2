"""Hostile inputs get a clear 4xx, never a 500 or a silent acceptance (issue 22).

Through a real server on the tiny model over raw sockets and httpx: header blocks
complete in one write but over the 64 KiB bound, request lines over it, a good
request pipelined before garbage, ``Transfer-Encoding: gzip, chunked``,
``Inference-Header-Content-Length: ²``, zero-size tensors declaring huge
dimensions, unknown keys of a megabyte, deeply nested tensor data, and answers
cut at the send timeout (counted as cut, not as 200).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerProcess, server_process
from tests.service.helpers import long_attention_body
from tests.service.raw_http import address, post_head
from tests.support.metrics import metric
from tests.support.tiny import D_MODEL, MODEL, MODEL_MAX_SEQ_LEN
from tests.support.wait import wait_until

KiB = 1024
MAX_HEADER_BYTES = 64 * KiB  # the server's default ATTNSERVE_MAX_HEADER_BYTES
INFER = f"/v2/models/{MODEL}/infer"
MiB = 1024 * KiB
GOOD_BODY = {"inputs": [[[0.25] * D_MODEL] * 3]}
EMBEDS = {"name": "inputs_embeds", "datatype": "FP32"}
# The longest error body any of these may produce: messages are capped at 1,000
# characters, field names at 64.
MAX_ERROR_BYTES = 2 * KiB


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[ServerProcess]:
    with server_process(model_repository, log_level="info") as proc:
        yield proc


def exchange(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` in one write; everything the server answers until it closes."""
    with socket.create_connection(address(url), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            received += chunk
        return received


def statuses(data: bytes) -> list[int]:
    """The status of every response in ``data``, in order."""
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


# -- headers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [66_000, 70_000, 100_000, 128_000])
def test_a_complete_header_block_over_the_bound_is_431(server: ServerProcess, size: int) -> None:
    """Sent in one write, the block is complete before the old check ran: it got 200."""
    head = b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size
    answer = exchange(server.url, head + b"\r\nConnection: close\r\n\r\n")
    assert statuses(answer) == [431], answer[:200]
    assert b"exceed" in answer


def test_a_header_block_under_the_bound_is_answered(server: ServerProcess) -> None:
    head = b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000
    assert statuses(exchange(server.url, head + b"\r\nConnection: close\r\n\r\n")) == [200]


@pytest.mark.parametrize("size", [MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1, 100_000])
def test_a_request_line_over_the_bound_is_431(server: ServerProcess, size: int) -> None:
    """It was 400: the parser's URL offsets are 16-bit, so such a URL failed to parse."""
    line = b"GET /health/live?q=" + b"a" * size + b" HTTP/1.1\r\n"
    answer = exchange(server.url, line + b"Host: x\r\nConnection: close\r\n\r\n")
    assert statuses(answer) == [431], answer[:200]


def test_a_good_request_pipelined_before_garbage_is_answered(server: ServerProcess) -> None:
    """Both in one write: the good one's answer comes first, then the 400 and the close."""
    before = metric(server.url, "attnserve_refusals_total", reason="bad_http")
    good = b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = exchange(server.url, good + b"GARBAGE\x00\x01 nonsense\r\n\r\n")
    assert statuses(answer) == [200, 400], answer
    assert b'{"status":"alive"}' in answer
    assert metric(server.url, "attnserve_refusals_total", reason="bad_http") == before + 1


def test_two_good_requests_pipelined_before_garbage_are_answered(server: ServerProcess) -> None:
    good = b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = exchange(server.url, good + good + b"GARBAGE\r\n\r\n")
    assert statuses(answer) == [200, 200, 400], answer


def test_transfer_codings_other_than_chunked_are_415(server: ServerProcess) -> None:
    """Only chunked is undone by the server: a gzip-coded body is no JSON to parse."""
    body = json.dumps({"inputs": [[[0.5] * D_MODEL]]}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    for coding in ("gzip, chunked", "deflate,chunked"):
        head = (
            "POST /v1/encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: {coding}\r\nConnection: close\r\n\r\n"
        ).encode()
        answer = exchange(server.url, head + chunked)
        assert statuses(answer) == [415], answer[:300]
        assert b"Transfer-Encoding" in answer
    plain = head.replace(b"deflate,chunked", b"chunked")
    assert statuses(exchange(server.url, plain + chunked)) == [200]


# -- /v2 framing and shapes -------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"\xb2", b"12\xb3", b"\xb9", b"+5", b"1_0"])
def test_a_non_ascii_header_length_is_422(server: ServerProcess, value: bytes) -> None:
    """Header bytes are latin-1: ``"\xb2"`` is "²", for which ``str.isdigit`` holds but
    ``int`` fails: that gave a 500."""
    body = json.dumps({"inputs": [{**EMBEDS, "shape": [1, 1, D_MODEL], "data": [0.0] * D_MODEL}]})
    head = (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\nInference-Header-Content-Length: "
    ).encode()
    answer = exchange(server.url, head + value + b"\r\n\r\n" + body.encode())
    assert statuses(answer) == [422], answer[-300:]
    assert b"Inference-Header-Content-Length" in answer


@pytest.mark.parametrize(
    "shape",
    [[0, 2**40, D_MODEL], [2**40, 0, D_MODEL], [1, 2**40, 0], [0, 2**62, 2**62], [2**62, 2**62, 0]],
)
def test_a_zero_size_tensor_with_huge_dimensions_is_4xx(
    server: ServerProcess, shape: list[int]
) -> None:
    """No data to send, yet a mask of ones or the rows' lengths for 2**40 rows was built:
    a MemoryError and a 500."""
    r = httpx.post(
        f"{server.url}{INFER}",
        json={"inputs": [{**EMBEDS, "shape": shape, "data": []}]},
        timeout=10,
    )
    assert r.status_code in (413, 422), r.text
    assert r.json()["error_type"] in ("payload_too_large", "invalid_input")


@pytest.mark.parametrize("depth", [4, 480, 481, 900])
def test_deeply_nested_tensor_data_is_422(server: ServerProcess, depth: int) -> None:
    data = "[" * depth + "0.5" + "]" * depth
    body = f'{{"inputs":[{{"name":"inputs_embeds","datatype":"FP32","shape":[1,1,{D_MODEL}],'
    body += f'"data":{data}}}]}}'
    r = httpx.post(f"{server.url}{INFER}", content=body.encode(), timeout=10)
    assert r.status_code == 422, r.text


# -- bounded errors ---------------------------------------------------------------------------

MiB_KEY = "k" * (1024 * 1024)
UNKNOWN_KEY_BODIES = {
    "/v1/encode": {"inputs": [[[0.5] * D_MODEL]], MiB_KEY: 1},
    "/v1/embeddings": {"input": "a text", "model": MODEL, MiB_KEY: 1},
    "/v1/tokenize": {"text": "a text", MiB_KEY: 1},
    INFER: {"inputs": [{"name": MiB_KEY, "datatype": "FP32", "shape": [1], "data": [0.0]}]},
}


@pytest.mark.parametrize("path", list(UNKNOWN_KEY_BODIES))
def test_an_unknown_key_of_a_megabyte_gives_a_small_error(server: ServerProcess, path: str) -> None:
    """The key was echoed whole: a 1 MB error body (2 MB on /v1/embeddings)."""
    r = httpx.post(f"{server.url}{path}", json=UNKNOWN_KEY_BODIES[path], timeout=30)
    assert r.status_code in (400, 422), r.text[:300]
    assert len(r.content) < MAX_ERROR_BYTES, len(r.content)
    assert "kkkk" in r.text  # still says which key


def test_a_long_nested_field_path_is_cut(server: ServerProcess) -> None:
    body: dict[str, Any] = {"inputs": [[[0.5] * D_MODEL]], "attention": {MiB_KEY: 1}}
    r = httpx.post(f"{server.url}/v1/encode", json=body, timeout=30)
    assert r.status_code == 422, r.text[:300]
    assert len(r.content) < MAX_ERROR_BYTES
    assert r.json()["error"].startswith("attention.kkk")


# -- answers cut at the send timeout ----------------------------------------------------------

SEND_TIMEOUT = 2.0


def test_an_answer_cut_at_the_send_timeout_is_not_counted_as_200(model_repository: Path) -> None:
    """A reader that stalls is dropped after send_timeout: its answer never arrived, so it
    is counted (and logged) as cut, 499, not as the 200 it began as."""
    body = long_attention_body(seed=3)
    with (
        server_process(
            model_repository, send_timeout=str(SEND_TIMEOUT), log_level="info"
        ) as server,
        socket.socket() as sock,
    ):
        url = server.url

        def count(status: str) -> float:
            return metric(url, "attnserve_requests_total", route="/v1/encode", status=status)

        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(address(url))
        sock.sendall(post_head("/v1/encode", len(body)) + body)
        wait_until(
            lambda: metric(url, "attnserve_refusals_total", reason="send_timeout") >= 1,
            "the stalled reader was not dropped",
            SEND_TIMEOUT + 30.0,
        )
        wait_until(lambda: count("499") == 1, f"no 499: {server.log()[-2000:]}", 5.0)
        assert count("200") == 0
        assert "answer was cut" in server.log()


# Bodies of millions of tiny elements: refused by what their first chunks hold.
TINY_FLOODS = {
    "/v1/encode": (b'{"inputs":[', b"[],"),
    "/v1/embeddings": (b'{"input":[', b'"",'),
    INFER: (b'{"inputs":[{"name":"inputs_embeds","datatype":"FP32","shape":[1],"data":[', b"[],"),
}


def whole_answer(sock: socket.socket) -> bytes:
    """One HTTP answer read from ``sock``: its head, then as many bytes as it announces."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


@pytest.mark.parametrize("path", list(TINY_FLOODS))
def test_a_body_of_millions_of_tiny_elements_is_413_before_it_has_arrived(
    server: ServerProcess, path: str
) -> None:
    """Only 1 MiB of a 30 MiB body is sent: it already holds more arrays or strings than
    any valid request, so the 413 comes without the rest (it never waits to parse)."""
    head, element = TINY_FLOODS[path]
    sent = head + element * (MiB // len(element))
    with socket.create_connection(address(server.url), timeout=10) as sock:
        sock.sendall(post_head(path, 30 * MiB) + sent)
        answer = whole_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"arrays, objects and strings" in answer
    # The budget was never spent on it: a good request still runs.
    assert httpx.post(f"{server.url}/v1/encode", json=GOOD_BODY, timeout=10).status_code == 200


def test_a_valid_body_with_as_many_rows_as_tokens_is_accepted(server: ServerProcess) -> None:
    """The bound leaves room for the most arrays a valid request holds: one row per token."""
    rows = [[0.0] * D_MODEL] * MODEL_MAX_SEQ_LEN
    r = httpx.post(f"{server.url}/v1/encode", json={"inputs": [rows, rows]}, timeout=30)
    assert r.status_code == 200, r.text
