"""Hostile clients never lock out real traffic (issue 10), through a real server on 127.0.0.1.

Slow bodies time out (408) and hold bytes, not request slots; a body announced
larger than the node's byte budget makes new work 429 and readiness 503 until it
goes; a client gone mid-upload is a 499, never a 500 or a traceback; headers are
bounded in size, count and time (431, 408) and silent sockets are closed; past
the connection cap new connections are closed at once, with a warning; malformed
HTTP is counted, and HEAD, trailing slashes and compressed bodies get their
answers; the server raises its soft descriptor limit to the hard one. Raw sockets
play the hostile clients, httpx the real ones (a new connection per request).

``test_unread_answers_count_in_the_memory_budget`` is an expected failure: it
shows a bug (answers a client does not read are held outside the memory budget).
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import re
import resource
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from service.protocols.wire import DECODED_PER_BYTE
from tests.conftest import ServerProcess, server_process
from tests.service.helpers import long_attention_body
from tests.service.raw_http import address, held_for, post_head
from tests.support.metrics import metric
from tests.support.tiny import D_MODEL
from tests.support.wait import wait_until

MiB = 1024 * 1024
BODY_TIMEOUT = 2.0
HEADER_TIMEOUT = 1.0
MARGIN = 3.0  # seconds allowed past a server timeout before a test gives up waiting
GOOD = {"inputs": [[[0.25] * D_MODEL] * 3]}
BUDGET = 16 * MiB


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[ServerProcess]:
    with server_process(
        model_repository,
        max_queued_requests="4",
        max_inflight_bytes=str(BUDGET),  # its minimum
        body_timeout=str(BODY_TIMEOUT),
        header_timeout=str(HEADER_TIMEOUT),
        log_level="info",
    ) as proc:
        yield proc


# -- raw sockets ----------------------------------------------------------------------------


@contextlib.contextmanager
def sockets(url: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections to the server, closed on exit."""
    with contextlib.ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(address(url), timeout=10))
            socks.append(sock)
        yield socks


def reset_on_close(sock: socket.socket) -> None:
    """Make close() send RST instead of FIN: a client that vanishes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def response(sock: socket.socket, method: str = "GET") -> tuple[http.client.HTTPResponse, bytes]:
    """The next HTTP response on ``sock`` and its body."""
    answer = http.client.HTTPResponse(sock, method=method)
    answer.begin()
    return answer, answer.read()


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """True once the server closed ``sock`` (EOF or reset) within ``timeout``, having sent
    nothing more; False if it stayed open."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes ``sock``; and whether it closed in time."""
    data = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data, True
        except TimeoutError:
            break
        if not chunk:
            return data, True
        data += chunk
    return data, False


# -- metrics and waiting --------------------------------------------------------------------


def refusals(url: str, reason: str) -> float:
    return metric(url, "attnserve_refusals_total", reason=reason)


def ready_status(url: str) -> int:
    return httpx.get(f"{url}/health/ready", timeout=10).status_code


def encode(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/encode", json=GOOD, timeout=10)


# -- slow bodies, byte budget, abandoned uploads --------------------------------------------

SLOW_CLIENTS = 30
SLOW_LENGTH = 1000


def test_slow_bodies_do_not_lock_out_real_traffic(server: ServerProcess) -> None:
    url = server.url
    timeouts_before = refusals(url, "body_timeout")
    with sockets(url, SLOW_CLIENTS) as slow:
        for sock in slow:
            sock.sendall(post_head("/v1/encode", SLOW_LENGTH) + b"{")
        held = SLOW_CLIENTS * held_for(b"{")
        # Let the server begin reading every slow body: each then holds what the one byte
        # it sent costs to parse (asserted below, after the real traffic), and no slot.
        wait_until(
            lambda: metric(url, "attnserve_in_flight_bytes") == held,
            "the slow bodies are not all being read",
            10.0,
        )
        # Far more slow bodies than request slots (4), and real traffic still flows.
        for _ in range(6):
            r = encode(url)
            assert r.status_code == 200, r.text
        assert ready_status(url) == 200
        # Still all held: the real requests were served beside them, not after them.
        assert metric(url, "attnserve_in_flight_bytes") == held
        for k, sock in enumerate(slow):
            sock.settimeout(BODY_TIMEOUT + MARGIN)
            answer, body = response(sock, "POST")
            assert answer.status == 408, (k, body)
            assert json.loads(body)["error_type"] == "request_timeout", body
            assert closed_by_server(sock, MARGIN), k
    assert refusals(url, "body_timeout") - timeouts_before == SLOW_CLIENTS
    assert encode(url).status_code == 200


def test_byte_budget_refuses_then_recovers(server: ServerProcess) -> None:
    url = server.url
    memory_before = refusals(url, "memory")
    # Part of a longer body whose parse cost (JsonCost) is the whole 16 MiB budget.
    spaces = (BUDGET - held_for(b"")) // DECODED_PER_BYTE
    assert held_for(b" " * spaces) == BUDGET  # exactly: 16 MiB - 40 is a multiple of 13
    with socket.create_connection(address(url), timeout=10) as hog:
        hog.sendall(post_head("/v1/encode", spaces + 1) + b" " * spaces)
        wait_until(lambda: ready_status(url) == 503, "the hog's bytes were not read", 5.0)
        r = encode(url)
        assert r.status_code == 429, r.text
        assert r.json()["error_type"] == "overloaded"
        assert float(r.headers["retry-after"]) > 0
        ready = httpx.get(f"{url}/health/ready", timeout=10)
        assert ready.status_code == 503, ready.text
        assert ready.json()["error"].startswith("saturated"), ready.text
        assert refusals(url, "memory") - memory_before >= 1
    # The hog is gone: its bytes are given back.
    wait_until(lambda: ready_status(url) == 200, "the hog's bytes were not given back", 5.0)
    assert encode(url).status_code == 200


PARTIAL_BODY = b'{"inputs": [[[0.5, '


def test_client_gone_mid_upload_is_499_not_500(server: ServerProcess) -> None:
    url = server.url
    log_start = len(server.log())
    route = "/v1/encode"
    requests_before = metric(url, "attnserve_requests_total", route=route)
    gone_before = metric(url, "attnserve_requests_total", route=route, status="499")
    clients = 6
    with sockets(url, clients) as socks:
        for k, sock in enumerate(socks):
            if k % 2:
                reset_on_close(sock)  # half vanish with RST, half close with FIN
            sock.sendall(post_head("/v1/encode", 10_000) + PARTIAL_BODY)
        # Let every upload begin (each then holds the bytes it sent) before leaving.
        held = clients * held_for(PARTIAL_BODY)
        wait_until(
            lambda: metric(url, "attnserve_in_flight_bytes") == held,
            "the uploads have not all begun",
            10.0,
        )

    def counted() -> bool:  # whatever their status
        return metric(url, "attnserve_requests_total", route=route) - requests_before >= clients

    wait_until(counted, "the requests were not all counted", 5.0)
    gone = metric(url, "attnserve_requests_total", route=route, status="499") - gone_before
    assert gone == clients
    assert metric(url, "attnserve_requests_total", status="500") == 0
    log = server.log()[log_start:]
    assert "Traceback" not in log and " ERROR " not in log, log
    assert log.count("the client closed the connection") == clients, log


# Answers of about 11.5 MB (16 sequences of 128 tokens with attention, base64), each
# holding ~31 MB of the budget: two unread ones fill 64 MiB, a third is refused.
UNREAD_ANSWERS = 3
UNREAD_BUDGET = 64 * MiB
# Seconds an unread answer may stall before its connection is dropped. The unread
# answers must still be held when the last request comes: with 2 s and 8 answers, a
# slower machine took longer than that to send them, the first readers were dropped in
# the meantime, and the request that should have been refused was a 200.
SEND_TIMEOUT = 6.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_unread_answers_count_in_the_memory_budget(model_repository: Path) -> None:
    body = long_attention_body(seed=7)
    with (
        server_process(
            model_repository,
            max_inflight_bytes=str(UNREAD_BUDGET),
            send_timeout=str(SEND_TIMEOUT),
        ) as server,
        contextlib.ExitStack() as stack,
    ):
        url = server.url
        rss_before = rss_mb(server.proc.pid)

        def done(sock: socket.socket, tokens_before: float) -> Callable[[], bool]:
            """Its answer was computed, or it was refused (an answer already arrived)."""

            def check() -> bool:
                if metric(url, "attnserve_tokens_total") > tokens_before:
                    return True
                ready_to_read, _, _ = select.select([sock], [], [], 0)
                return bool(ready_to_read)

            return check

        for _ in range(UNREAD_ANSWERS):
            tokens_before = metric(url, "attnserve_tokens_total")
            sock = stack.enter_context(socket.socket())
            # A small receive window: the kernel takes little of the answer off the server.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(address(url))
            sock.sendall(post_head("/v1/encode", len(body)) + body)
            wait_until(done(sock, tokens_before), "neither answered nor refused", 30.0)
        time.sleep(1.0)  # the last answer is built and handed to its connection
        grown = rss_mb(server.proc.pid) - rss_before
        # The answers nobody reads are still in this process, so they stay in the budget
        # (once, RSS grew +150 MB for the 64 MiB budget and the next request was a 200):
        # one more such request must not fit.
        r = httpx.post(
            f"{url}/v1/encode",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert r.status_code == 429, (
            f"answered {r.status_code} while RSS grew {grown:.0f} MB for a budget of "
            f"{UNREAD_BUDGET // MiB} MiB"
        )
        # Readers that stall for send_timeout are dropped and their answers freed.
        # (Some of the 8 were refused 429 up front: only the answers built can stall.)
        wait_until(
            lambda: metric(url, "attnserve_in_flight_bytes") == 0,
            "the unread answers were not freed",
            3 * SEND_TIMEOUT,
        )
        assert refusals(url, "send_timeout") >= 1
        again = httpx.post(
            f"{url}/v1/encode",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert again.status_code == 200, again.text


# -- headers and silent sockets ---------------------------------------------------------------


def test_huge_header_is_431_and_closed(server: ServerProcess) -> None:
    with socket.create_connection(address(server.url), timeout=10) as sock:

        def send() -> None:
            with contextlib.suppress(OSError):  # the server stops reading and closes
                sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MiB)

        sender = threading.Thread(target=send)
        sender.start()
        data, closed = read_until_closed(sock, 5.0)
        sender.join(timeout=5.0)
    assert closed
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), data[:200]
    assert b"content-type: text/plain" in head.lower()
    assert b"exceed" in body


def test_too_many_header_lines_is_431(server: ServerProcess) -> None:
    extra = "".join(f"X-Line-{i}: {i}\r\n" for i in range(150))  # max_headers is 100
    with socket.create_connection(address(server.url), timeout=10) as sock:
        sock.sendall(f"GET /health/live HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
        answer, body = response(sock)
        assert answer.status == 431, body
        assert answer.getheader("content-type", "").startswith("text/plain")
        assert closed_by_server(sock, MARGIN)
    assert httpx.get(f"{server.url}/health/live", timeout=10).status_code == 200


def test_trickling_headers_get_408_and_close(server: ServerProcess) -> None:
    request = b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40
    start = time.monotonic()
    with socket.create_connection(address(server.url), timeout=10) as sock:
        for byte in request[:20]:  # 1 byte per 0.3 s: 6 s at most, the timeout is 1 s
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            if select.select([sock], [], [], 0.3)[0]:
                break
        data, closed = read_until_closed(sock, MARGIN)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert closed
    assert time.monotonic() - start < HEADER_TIMEOUT + MARGIN


def test_silent_sockets_are_closed(server: ServerProcess) -> None:
    url = server.url
    before = refusals(url, "header_timeout")
    silent = 50
    with sockets(url, silent) as socks:
        deadline = time.monotonic() + HEADER_TIMEOUT + MARGIN
        assert all(closed_by_server(s, max(deadline - time.monotonic(), 0.01)) for s in socks)
    assert refusals(url, "header_timeout") - before >= silent
    assert httpx.get(f"{url}/health/live", timeout=10).status_code == 200


# -- connection cap ---------------------------------------------------------------------------

CAP = 16  # ATTNSERVE_MAX_CONNECTIONS at its minimum
CAPPED_HEADER_TIMEOUT = 3.0


@contextlib.contextmanager
def soft_fd_limit(soft: int) -> Iterator[None]:
    """Lower this process's soft RLIMIT_NOFILE (a child started meanwhile inherits it)."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, old_soft), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (old_soft, hard))


def open_files_limits(pid: int) -> tuple[str, str]:
    """(soft, hard) of "Max open files" in /proc/<pid>/limits."""
    text = Path(f"/proc/{pid}/limits").read_text()
    match = re.search(r"^Max open files\s+(\S+)\s+(\S+)", text, re.MULTILINE)
    assert match, text
    return match.group(1), match.group(2)


def test_fd_soft_limit_is_raised_to_hard(model_repository: Path) -> None:
    with contextlib.ExitStack() as stack:
        with soft_fd_limit(1024):  # started low: the server must raise it itself
            server = stack.enter_context(server_process(model_repository))
        soft, hard = open_files_limits(server.proc.pid)
        assert soft == hard, (soft, hard)


def test_connection_cap_closes_extra_connections(model_repository: Path) -> None:
    extra = 10
    with (
        server_process(
            model_repository,
            max_connections=str(CAP),
            header_timeout=str(CAPPED_HEADER_TIMEOUT),
        ) as server,
        contextlib.ExitStack() as stack,
    ):
        url = server.url
        idle = stack.enter_context(sockets(url, CAP))
        opened = time.monotonic()
        with sockets(url, extra) as extras:
            for sock in extras:
                with contextlib.suppress(OSError):  # it may be gone already
                    sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                data, closed = read_until_closed(sock, 1.0)
                assert closed and data == b"", data  # closed at once, no HTTP answer
        # All refused before the idle ones could time out: they were held meanwhile.
        assert time.monotonic() - opened < CAPPED_HEADER_TIMEOUT
        # Once the idle ones time out, the server answers again.
        deadline = time.monotonic() + CAPPED_HEADER_TIMEOUT + MARGIN
        assert all(closed_by_server(s, max(deadline - time.monotonic(), 0.01)) for s in idle)

        def alive() -> bool:
            try:
                return httpx.get(f"{url}/health/live", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(alive, "the server does not answer", MARGIN)
        assert refusals(url, "connections") >= extra
        # Warned, once: further refusals within WARN_EVERY_SECONDS (10 s) stay quiet.
        log = server.log()
        assert log.count("connection cap reached") == 1, log
        assert "Traceback" not in log, log


# -- malformed HTTP, HEAD, trailing slash, Content-Encoding ---------------------------------


def test_malformed_http_is_plain_400_and_counted(server: ServerProcess) -> None:
    before = refusals(server.url, "bad_http")
    with socket.create_connection(address(server.url), timeout=10) as sock:
        sock.sendall(b"GARBAGE\r\n\r\n")
        data, closed = read_until_closed(sock, MARGIN)
    assert closed
    head, _, _ = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), data
    assert b"content-type: text/plain" in head.lower()
    assert refusals(server.url, "bad_http") - before == 1


@pytest.mark.parametrize("path", ["/health/ready", "/health/live", "/metrics"])
def test_head_is_allowed(server: ServerProcess, path: str) -> None:
    r = httpx.head(f"{server.url}{path}", timeout=10)
    assert r.status_code == 200
    assert r.content == b""


def test_trailing_slash_is_404_without_redirect(server: ServerProcess) -> None:
    r = httpx.post(
        f"{server.url}/v1/encode/", json=GOOD, headers={"Host": "evil.example"}, timeout=10
    )
    assert r.status_code == 404
    assert "location" not in r.headers


def test_compressed_body_is_415(server: ServerProcess) -> None:
    body = gzip.compress(json.dumps(GOOD).encode())
    r = httpx.post(
        f"{server.url}/v1/encode",
        content=body,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        timeout=10,
    )
    assert r.status_code == 415, r.text
    assert r.json()["error_type"] == "unsupported_media_type"
    assert "Content-Encoding" in r.json()["error"]
