"""ATTNSERVE_API_KEY guards /v1/*; health and metrics stay open for probes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from attnserve_client import AuthenticationError, Client
from service.settings import Settings
from tests.conftest import running_server

KEY = "s3cret-key"
SECOND_KEY = "rotated-key"  # ATTNSERVE_API_KEY is a comma-separated list


@pytest.fixture(scope="module")
def guarded_url(model_repository: Path) -> Iterator[str]:
    with running_server(model_repository, api_key=f"{KEY}, {SECOND_KEY}") as url:
        yield url


def test_requests_without_the_key_get_401(guarded_url: str) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": "Bearer s\u00e9kret".encode("latin-1")},  # non-ASCII: 401, not 500
    ):
        r = httpx.get(f"{guarded_url}/v1/models", headers=headers)
        assert r.status_code == 401
        assert r.json()["error_type"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        assert KEY not in r.text


def test_health_and_metrics_need_no_key(guarded_url: str) -> None:
    assert httpx.get(f"{guarded_url}/health/ready").status_code == 200
    assert httpx.get(f"{guarded_url}/health").status_code == 200  # TEI's probe
    assert httpx.get(f"{guarded_url}/metrics").status_code == 200


def test_every_key_of_the_list_is_accepted_and_the_list_itself_is_not(guarded_url: str) -> None:
    for key in (KEY, SECOND_KEY):
        r = httpx.get(f"{guarded_url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, (key, r.text)
    for wrong in (f"{KEY},{SECOND_KEY}", f"{KEY}, {SECOND_KEY}", ","):
        r = httpx.get(f"{guarded_url}/v1/models", headers={"Authorization": f"Bearer {wrong}"})
        assert r.status_code == 401, (wrong, r.text)


def test_tei_info_needs_the_key(guarded_url: str) -> None:
    """What the server serves is guarded, like /v1/models."""
    r = httpx.get(f"{guarded_url}/info")
    assert r.status_code == 401, r.text
    assert set(r.json()) == {"error", "error_type"}  # TEI's shape
    assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.get(f"{guarded_url}/info", headers={"Authorization": f"Bearer {SECOND_KEY}"})
    assert r.status_code == 200, r.text
    assert r.json()["model_id"]


def test_the_sdk_sends_the_key(guarded_url: str) -> None:
    x = np.linspace(-1, 1, 5 * 32, dtype=np.float32).reshape(1, 5, 32)
    with Client(guarded_url, api_key=KEY) as client:
        assert client.encode(x).stack().shape == (1, 5, 32)
    with (
        Client(guarded_url, api_key="nope", max_retries=0) as client,
        pytest.raises(AuthenticationError) as info,
    ):
        client.models()
    assert info.value.status_code == 401 and info.value.error_type == "unauthorized"


def test_an_empty_key_means_no_key() -> None:
    """ATTNSERVE_API_KEY="" must not turn on auth that any Bearer token passes."""
    assert Settings(api_key="").api_key is None  # type: ignore[arg-type]
    assert Settings(api_key=KEY).api_key is not None  # type: ignore[arg-type]


def test_viewer_page_needs_no_key_but_its_api_calls_do(guarded_url: str) -> None:
    # A browser cannot send a header when it opens a page: the page is public and asks
    # for the key, which it then sends on every API call (tests/browser).
    assert httpx.get(f"{guarded_url}/viewer").status_code == 200
    assert httpx.get(f"{guarded_url}/viewer/static/viewer.js").status_code == 200
    assert httpx.get(f"{guarded_url}/v1/models").status_code == 401
