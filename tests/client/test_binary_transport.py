"""The SDK's binary transport: chosen when the server offers it, equal to JSON, else JSON.

Against the session's real server (tiny), whose /v2 offers binary tensors; a
server without /v2 or with a failing /v2 is an ``httpx.MockTransport``: no healthy
server gives those answers when asked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest

from attnserve_client import AsyncClient, Client
from tests.support.inputs import sequences
from tests.support.tiny import MODEL

ATOL = 1e-6  # the same graphs on the same sequences; batch composition aside, float32 noise

OPTIONS: list[dict[str, Any]] = [
    {},
    {"return_attention": True},
    {"return_hidden_states": True, "return_attention": True},
    {"pooling": "mean", "normalize": True},
    {"pooling": "cls", "return_embeddings": True},
]


class PathTransport(httpx.HTTPTransport):
    """A real transport that records the method and path of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(f"{request.method} {request.url.path}")
        return super().handle_request(request)


def assert_same(a: Any, b: Any) -> None:
    for field in ("embeddings", "attention", "hidden_states", "pooled"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), field
        for p, q in zip(x or [], y or [], strict=True):
            assert p.dtype == q.dtype == np.float32 and p.shape == q.shape, field
            np.testing.assert_allclose(p, q, rtol=0, atol=ATOL, err_msg=field)
    assert (a.usage, a.model) == (b.usage, b.model)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "default")
def test_binary_by_default_and_equal_to_json(server_url: str, options: dict[str, Any]) -> None:
    seqs = sequences((6, 1, 3), seed=11)
    transport = PathTransport()
    with Client(server_url, transport=transport) as client:
        binary = client.encode(seqs, **options)
        again = client.encode(seqs, **options)
        as_json = client.encode(seqs, wire_format="base64", **options)
    infer = f"POST /v2/models/{MODEL}/infer"
    # Asked once whether binary is offered, and which model is the default; then binary.
    assert transport.paths == ["GET /v2", "GET /v1/models", infer, infer, "POST /v1/encode"]
    assert_same(binary, as_json)
    assert_same(again, as_json)


def test_what_only_json_can_say_goes_as_json(server_url: str) -> None:
    transport = PathTransport()
    with Client(server_url, transport=transport) as client:
        client.encode(sequences((4,), seed=12), return_attention=True, reduce="mean")
        client.encode(sequences((4,), seed=12), return_hidden_states=True, hidden_layers=[-1])
        with pytest.raises(ValueError, match="binary"):
            client.encode(sequences((4,), seed=12), reduce="rollout", wire_format="binary")
    assert transport.paths == ["POST /v1/encode", "POST /v1/encode"]  # nothing else sent


def test_async_client_uses_binary_too(server_url: str) -> None:
    seqs = sequences((2, 5), seed=13)
    transport = httpx.AsyncHTTPTransport()
    paths: list[str] = []

    class Recording(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            paths.append(request.url.path)
            return await transport.handle_async_request(request)

        async def aclose(self) -> None:
            await transport.aclose()

    async def run() -> tuple[Any, Any]:
        async with AsyncClient(server_url, transport=Recording()) as client:
            binary = await client.encode(seqs, return_hidden_states=True, model=MODEL)
            as_json = await client.encode(seqs, return_hidden_states=True, wire_format="float")
        return binary, as_json

    binary, as_json = asyncio.run(run())
    assert paths == ["/v2", f"/v2/models/{MODEL}/infer", "/v1/encode"]
    assert_same(binary, as_json)


ENCODE_ANSWER = {
    "model": MODEL,
    "data": [{"index": 0, "tokens": None, "embeddings": [[0.5] * 2], "attention": None,
              "pooled": None}],
    "usage": {"sequences": 1, "tokens": 1},
}  # fmt: skip


@pytest.mark.parametrize(
    ("v2_status", "asks"),
    [(404, 1), (503, 2)],
    ids=["no-protocol-remembered", "unavailable-asked-again"],
)
def test_a_server_without_binary_gets_json(v2_status: int, asks: int) -> None:
    """404 on /v2 means JSON from then on; a failing /v2 is asked again next time,
    never retried, and the call itself still goes (as JSON)."""
    paths: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/v2":
            return httpx.Response(v2_status, json={"error": "no", "error_type": "x"})
        return httpx.Response(200, json=ENCODE_ANSWER)

    with Client("http://test", transport=httpx.MockTransport(answer), max_retries=0) as client:
        for _ in range(2):
            result = client.encode([np.ones((1, 2), np.float32)])
            assert result.embeddings is not None and result.embeddings[0].shape == (1, 2)
    assert paths.count("/v2") == asks and paths.count("/v1/encode") == 2
