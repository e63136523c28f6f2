"""Fixtures of the service tests: an HTTP client on the shared server, direct ORT sessions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import onnxruntime as ort
import pytest

from model_export import graph_io
from tests.service.helpers import TIMEOUT, new_session


@pytest.fixture(scope="session")
def client(server_url: str) -> Iterator[httpx.Client]:
    """A client on the session's real server (``python -m service`` on the tiny model)."""
    with httpx.Client(base_url=server_url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="session")
def embeddings_session(tiny_model_dir: Path) -> ort.InferenceSession:
    """onnxruntime on ``model.onnx``, run by the tests directly (not through the service)."""
    return new_session(str(tiny_model_dir / graph_io.GRAPH_EMBEDDINGS))


@pytest.fixture(scope="session")
def attention_session(tiny_model_dir: Path) -> ort.InferenceSession:
    """onnxruntime on ``model_attn.onnx``, run by the tests directly."""
    return new_session(str(tiny_model_dir / graph_io.GRAPH_ATTENTION))


@pytest.fixture(scope="session")
def hidden_session(tiny_model_dir: Path) -> ort.InferenceSession:
    """onnxruntime on ``model_hidden.onnx`` (hidden states, no attention), run directly."""
    return new_session(str(tiny_model_dir / graph_io.GRAPH_HIDDEN_STATES))
