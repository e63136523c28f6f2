"""The benchmarks' load client (``bench.lib.http``) against a real socket server.

The hand-written parsers it replaced disagreed: one read a chunked keep-alive answer
to EOF (hanging until the server closed, and keeping the chunk framing in the body).
Each answer here is framed by what the server sends, and the connection is reused.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from bench.lib.http import Closed, Connection, Malformed, Request

REQUEST = Request("/v1/encode", b'{"inputs": []}')
# Answers as a server writes them, by name: each a function of the request's number.
Script = Callable[[int], bytes]


def _chunked(n: int) -> bytes:
    body = f"answer {n}".encode()
    return (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (3, body[:3])
        + b"%x\r\n%s\r\n" % (len(body) - 3, body[3:])
        + b"0\r\n\r\n"
    )


def _sized(n: int) -> bytes:
    body = f"answer {n}".encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Id: %d\r\n\r\n%s" % (len(body), n, body)


def _serve(
    listener: socket.socket, script: Script, requests: list[bytes], close_after: int
) -> None:
    """One connection: each request read whole (its head, its Content-Length body), then
    ``script``'s bytes for it written; closed after ``close_after`` answers, or at once
    for an empty one."""
    conn, _ = listener.accept()
    with conn:
        data, n = b"", 0
        while True:
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, data = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(data) < length:
                data += conn.recv(65536)
            requests.append(head + b"\r\n\r\n" + data[:length])
            data = data[length:]
            answer = script(n)
            if not answer:
                return
            conn.sendall(answer)
            n += 1
            if n == close_after:
                return


@pytest.fixture
def server() -> Iterator[Callable[..., tuple[int, list[bytes]]]]:
    """Starts a one-connection server answering per a script: (its port, requests seen)."""
    threads: list[threading.Thread] = []
    listeners: list[socket.socket] = []

    def start(script: Script, close_after: int = 0) -> tuple[int, list[bytes]]:
        listener = socket.create_server(("127.0.0.1", 0))
        requests: list[bytes] = []
        args = (listener, script, requests, close_after)
        thread = threading.Thread(target=_serve, args=args, daemon=True)
        thread.start()
        threads.append(thread)
        listeners.append(listener)
        return listener.getsockname()[1], requests

    yield start
    for listener in listeners:
        listener.close()
    for thread in threads:
        thread.join(timeout=10)


def _answers(port: int, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    async def main() -> list[tuple[int, dict[str, str], bytes]]:
        connection = await Connection.open(port)
        try:
            out = []
            for _ in range(count):
                answer = await asyncio.wait_for(connection.request(REQUEST), timeout=10)
                out.append((answer.status, answer.headers, answer.body))
            return out
        finally:
            await connection.close()

    return asyncio.run(main())


@pytest.mark.parametrize("script", [_chunked, _sized], ids=["chunked", "content-length"])
def test_keep_alive_answers_are_framed_and_the_connection_reused(
    server: Callable[..., tuple[int, list[bytes]]], script: Script
) -> None:
    port, requests = server(script)
    answers = _answers(port, 3)
    assert [body for _, _, body in answers] == [b"answer 0", b"answer 1", b"answer 2"]
    assert all(status == 200 for status, _, _ in answers)
    assert len(requests) == 3  # one connection: the server script serves only one
    assert requests[0] == REQUEST.wire
    assert requests[0].startswith(b"POST /v1/encode HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    if script is _sized:
        assert [headers["x-id"] for _, headers, _ in answers] == ["0", "1", "2"]


def test_a_connection_closed_mid_answer_is_closed_not_a_short_answer(
    server: Callable[..., tuple[int, list[bytes]]],
) -> None:
    port, _ = server(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart", close_after=1)
    with pytest.raises(Closed, match="mid-answer"):
        _answers(port, 1)


def test_a_connection_closed_before_any_answer_is_closed(
    server: Callable[..., tuple[int, list[bytes]]],
) -> None:
    port, _ = server(lambda n: b"")
    with pytest.raises(Closed):
        _answers(port, 1)


def test_bytes_that_are_not_http_are_malformed(
    server: Callable[..., tuple[int, list[bytes]]],
) -> None:
    port, _ = server(lambda n: b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    with pytest.raises(Malformed):
        _answers(port, 1)


@pytest.mark.parametrize("twice", [True, False], ids=["answered-twice", "answered-once"])
def test_a_second_answer_to_one_request_is_seen(
    server: Callable[..., tuple[int, list[bytes]]], twice: bool
) -> None:
    port, _ = server(lambda n: _sized(n) + (_sized(n + 1) if twice else b""))

    async def main() -> tuple[bytes, bytes]:
        connection = await Connection.open(port)
        try:
            answer = await connection.request(REQUEST)
            return answer.body, await connection.extra(timeout=0.5)
        finally:
            await connection.close()

    body, extra = asyncio.run(main())
    assert body == b"answer 0"
    if twice:
        assert extra.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Id: 1")
    else:
        assert extra == b""
