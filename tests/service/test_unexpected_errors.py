"""A bug of ours (an exception no handler knows) is a complete 500 on a connection that
stays usable (issue 44, item 5).

It was answered by Starlette's outermost handler, which re-raises after sending;
uvicorn then closed the keep-alive connection with no ``Connection: close``, and a
client's next request on it failed with ECONNRESET.

The server is the real one (``build_server`` around ``create_app``, as ``python -m
service`` runs it) on 127.0.0.1, in a thread of this process so that the test can
add the one route that fails as a bug would: no part of the service fails on
purpose. A raw keep-alive socket plays the client.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from bench.lib.server import ready_timeout
from service.app import create_app
from service.engine.scope import request_id_var
from service.server import DrainingServer, build_server
from service.settings import Settings
from tests.conftest import free_port
from tests.service.raw_http import address
from tests.support.metrics import metric
from tests.support.wait import wait_until

BUG = "/test/bug"


@dataclass
class InProcessServer:
    url: str
    server: DrainingServer


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[InProcessServer]:
    port = free_port()
    settings = Settings(
        _env_file=None,
        model_repository=model_repository,
        host="127.0.0.1",
        port=port,
        grpc_port=0,
        drain_seconds=0,
        intra_op_threads=1,
        log_level="warning",
    )
    app = create_app(settings)

    @app.get(BUG)
    async def bug() -> dict[str, str]:
        raise RuntimeError("a bug of ours")

    server = build_server(settings, app, app.state.engine)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: ready(url), "the server is ready", timeout=ready_timeout())
    try:
        yield InProcessServer(url, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health/ready", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def read_answer(reader: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length: status, headers, body (whatever
    follows it stays in ``reader``)."""
    status_line = reader.readline()
    if not status_line:
        raise ConnectionError("closed before an answer")
    headers = {}
    while (line := reader.readline().decode("latin-1").strip()) != "":
        name, value = line.split(":", 1)
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def test_a_500_leaves_the_keep_alive_connection_usable(
    server: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 500, then a second request on the same connection: answered 200. The 500 is
    the native error body with the request's id, and the traceback is logged once,
    with that id."""
    before = metric(server.url, "attnserve_requests_total", status="500")
    caplog.handler.addFilter(lambda record: setattr(record, "rid", request_id_var.get()) or True)
    with (
        caplog.at_level(logging.ERROR),
        socket.create_connection(address(server.url), 30) as sock,
        sock.makefile("rb") as reader,
    ):
        sock.sendall(get(BUG))
        status, headers, body = read_answer(reader)
        assert status == 500
        assert json.loads(body) == {
            "error": "internal server error",
            "error_type": "internal_error",
        }
        assert headers.get("connection") != "close"
        request_id = headers.get("x-request-id")
        time.sleep(0.2)  # the server had time to close it, had it meant to
        sock.sendall(get("/health/live"))
        status, headers, _ = read_answer(reader)  # ECONNRESET before the fix
        assert status == 200
    assert request_id is not None
    assert metric(server.url, "attnserve_requests_total", status="500") == before + 1
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
    assert tracebacks[0].rid == request_id  # type: ignore[attr-defined]
    assert "a bug of ours" in caplog.text


def test_pipelined_requests_after_a_500_are_answered(server: InProcessServer) -> None:
    """Sent together, a failing request and a good one: both answered, in order."""
    with (
        socket.create_connection(address(server.url), 30) as sock,
        sock.makefile("rb") as reader,
    ):
        sock.sendall(get(BUG) + get("/health/live"))
        assert read_answer(reader)[0] == 500
        assert read_answer(reader)[0] == 200
