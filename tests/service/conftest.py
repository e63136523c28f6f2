"""Fixtures of the service tests: an HTTP client on the session's shared server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from model_export.config import EncoderConfig
from model_export.export import export_model
from model_export.model import Encoder
from tests.service.helpers import TIMEOUT

# The seeds of the tiny model's two versions (``exports``).
VERSION_SEEDS = {"1": 1234, "2": 98765}


@pytest.fixture(scope="session")
def http_client(server_url: str) -> Iterator[httpx.Client]:
    """httpx on the session's real server (``python -m service`` on the tiny model)."""
    with httpx.Client(base_url=server_url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory, tiny_config: EncoderConfig) -> Path:
    """The tiny model's two versions, exported once for the session (the model-control
    and response-cache tests): ``<dir>/<version>/`` (without the compact attention
    graphs: versions are told apart by their embeddings)."""
    root = tmp_path_factory.mktemp("versions")
    for version, seed in VERSION_SEEDS.items():
        encoder = Encoder(tiny_config, seed=seed)
        export_model(encoder, root / version, name="tiny", seed=seed, compact_attention=False)
    return root
