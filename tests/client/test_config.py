"""Client configuration: API key header and base URL, from arguments or the environment.

Requests are captured with ``httpx.MockTransport`` (what is sent is the point,
not what a server answers); the last test reads the base URL from the
environment against the real server.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from attnserve_client import AsyncClient, Client
from tests.support.tiny import MODEL

ENV_KEY = "ATTNSERVE_API_KEY"
ENV_URL = "ATTNSERVE_BASE_URL"
DEFAULT_URL = "http://127.0.0.1:8000"
MODELS = {"data": []}


def sent_request(mode: str, **client_kwargs: str) -> httpx.Request:
    """The request ``models()`` sends with these constructor arguments."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=MODELS)

    transport = httpx.MockTransport(handler)
    if mode == "sync":
        with Client(transport=transport, **client_kwargs) as client:
            client.models()
    else:

        async def run() -> None:
            async with AsyncClient(transport=transport, **client_kwargs) as client:
                await client.models()

        asyncio.run(run())
    assert len(sent) == 1
    return sent[0]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test without the SDK's variables, whatever the shell has."""
    monkeypatch.delenv(ENV_KEY, raising=False)
    monkeypatch.delenv(ENV_URL, raising=False)


MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_api_key_argument_is_sent_as_bearer(mode: str) -> None:
    request = sent_request(mode, api_key="sk-argument")
    assert request.headers["authorization"] == "Bearer sk-argument"


@pytest.mark.parametrize("mode", MODES)
def test_api_key_from_environment(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KEY, "sk-environment")
    request = sent_request(mode)
    assert request.headers["authorization"] == "Bearer sk-environment"


@pytest.mark.parametrize("mode", MODES)
def test_api_key_argument_beats_environment(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_KEY, "sk-environment")
    request = sent_request(mode, api_key="sk-argument")
    assert request.headers["authorization"] == "Bearer sk-argument"


@pytest.mark.parametrize("mode", MODES)
def test_no_api_key_no_authorization_header(mode: str) -> None:
    request = sent_request(mode)
    assert "authorization" not in request.headers
    assert request.headers["accept"] == "application/json"


@pytest.mark.parametrize("mode", MODES)
def test_base_url_default_argument_and_environment(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert str(sent_request(mode).url) == f"{DEFAULT_URL}/v1/models"
    monkeypatch.setenv(ENV_URL, "http://from-env.test:9000/")  # trailing slash tolerated
    assert str(sent_request(mode).url) == "http://from-env.test:9000/v1/models"
    url = sent_request(mode, base_url="http://from-argument.test:9001").url
    assert str(url) == "http://from-argument.test:9001/v1/models"  # the argument wins


def test_base_url_with_path_prefix() -> None:
    """Behind a reverse proxy at /attnserve/, paths are appended to the prefix."""
    request = sent_request("sync", base_url="http://proxy.test/attnserve/")
    assert str(request.url) == "http://proxy.test/attnserve/v1/models"


def test_base_url_from_environment_on_real_server(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_URL, server_url)
    with Client() as client:
        assert client.base_url == server_url
        assert [card.name for card in client.models()] == [MODEL]
