"""Fixtures of the SDK tests: the SDK and real servers (onnxruntime sessions: tests/conftest.py).

The SDK is tested against real ``python -m service`` processes. The only fake
is ``httpx.MockTransport`` in the retry and configuration tests, which need
answers (a 503 on demand, a Retry-After) that no healthy server gives when asked.
Extra servers are module-scoped: each starts in about two seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from attnserve_client import Client
from tests.client.helpers import poison_model
from tests.conftest import free_port, running_server
from tests.support.tiny import MODEL


@pytest.fixture(scope="module")
def sdk_client(server_url: str) -> Iterator[Client]:
    """The SDK on the session's real server (tiny model)."""
    with Client(server_url) as c:
        yield c


@pytest.fixture(scope="module")
def two_sequence_url(model_repository: Path) -> Iterator[str]:
    """A second real server on tiny that refuses requests of more than two sequences (413)."""
    with running_server(model_repository, max_sequences="2") as url:
        yield url


@pytest.fixture(scope="module")
def not_ready_url(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[str]:
    """A real server that answers but is never ready (its model's warm-up fails): 503s."""
    repo = tmp_path_factory.mktemp("poisoned-models")
    poison_model(tiny_model_dir, repo / MODEL)
    # Warm-up fails on the poisoned model, so the server answers but is never ready;
    # "critical" keeps that expected traceback out of the test log.
    with running_server(repo, wait_for="up", log_level="critical") as url:
        yield url


@pytest.fixture
def closed_port_url() -> str:
    """A URL where nothing listens: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"
