"""Fixtures of the service tests: an HTTP client on the session's shared server."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.service.helpers import TIMEOUT


@pytest.fixture(scope="session")
def http_client(server_url: str) -> Iterator[httpx.Client]:
    """httpx on the session's real server (``python -m service`` on the tiny model)."""
    with httpx.Client(base_url=server_url, timeout=TIMEOUT) as c:
        yield c
