"""Session-wide fixtures: real models exported once per test session, real servers on
them, and onnxruntime on the same graphs for the tests' own expectations."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import onnxruntime as ort
import pytest

from bench.lib.server import ServerFailed as ServerFailed  # the tests import it from here
from bench.lib.server import wait_ready
from model_export import graph_io
from model_export.config import EncoderConfig, preset
from model_export.export import export_model
from model_export.model import Encoder
from tests.support.onnx_runs import new_session

TINY_SEED = 1234

# The session cache (service/prepacked_cache.py) writes under ~/.cache by default: the
# tests' servers and runtimes leave it off, and its own tests give it a directory.
os.environ.setdefault("ATTNSERVE_SESSION_CACHE_DIR", "")


# Fixtures that export a real pretrained checkpoint (MiniLM, the head models): a minute or
# more each on 2 cores, before their servers start. Tests that use one, directly or through
# another fixture, and every test under these folders are marked ``checkpoints``;
# `make test-quick` leaves them out (pyproject.toml's markers).
CHECKPOINT_FIXTURES = frozenset({"minilm_repository", "head_models"})
CHECKPOINT_FOLDERS = ("pretrained", "browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0]
        fixtures = set(getattr(item, "fixturenames", ()))
        if folder in CHECKPOINT_FOLDERS or fixtures & CHECKPOINT_FIXTURES:
            item.add_marker(pytest.mark.checkpoints)


@pytest.fixture(scope="session")
def tiny_config() -> EncoderConfig:
    return preset("tiny")


@pytest.fixture(scope="session")
def tiny_encoder(tiny_config: EncoderConfig) -> Encoder:
    return Encoder(tiny_config, seed=TINY_SEED)


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory, tiny_encoder: Encoder) -> Path:
    """A model repository holding ``tiny`` exported with the default (dynamo) exporter."""
    repo = tmp_path_factory.mktemp("models")
    export_model(tiny_encoder, repo / "tiny", name="tiny", seed=TINY_SEED)
    return repo


@pytest.fixture(scope="session")
def tiny_model_dir(model_repository: Path) -> Path:
    return model_repository / "tiny"


@pytest.fixture(scope="session")
def embeddings_session(tiny_model_dir: Path) -> ort.InferenceSession:
    """onnxruntime on tiny's ``model.onnx``, run by the tests (not through the service)."""
    return new_session(tiny_model_dir / graph_io.GRAPH_EMBEDDINGS)


@pytest.fixture(scope="session")
def attention_session(tiny_model_dir: Path) -> ort.InferenceSession:
    """onnxruntime on tiny's ``model_attn.onnx`` (+ attention weights and value norms)."""
    return new_session(tiny_model_dir / graph_io.GRAPH_ATTENTION)


@pytest.fixture(scope="session")
def hidden_session(tiny_model_dir: Path) -> ort.InferenceSession:
    """onnxruntime on tiny's ``model_hidden.onnx`` (hidden states, no attention)."""
    return new_session(tiny_model_dir / graph_io.GRAPH_HIDDEN_STATES)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    """A running ``python -m service``: its URL, process and combined stdout/stderr log."""

    url: str
    proc: subprocess.Popen[bytes]
    log_file: IO[str]

    def log(self) -> str:
        self.log_file.seek(0)
        return self.log_file.read()


@contextmanager
def server_process(
    repository: Path, *, wait_for: str = "ready", **settings: str
) -> Iterator[ServerProcess]:
    """Run ``python -m service`` on 127.0.0.1:<free port> until ready; stop it after.
    The wait is ``bench.lib.server.wait_ready``'s: to ATTNSERVE_TEST_READY_TIMEOUT
    (600 s), ServerFailed with its log as soon as the process exits.

    ``settings`` are ATTNSERVE_* values without the prefix, e.g. ``max_sequences="2"``.
    ``wait_for`` is "ready" (``/health/ready`` answers 200) or "up" (the server
    answers HTTP at all: for a server meant never to become ready). The drain on
    SIGTERM is 0 s unless asked for, so stopping a test server costs no time.
    """
    port = int(settings.pop("port", None) or free_port())  # a port asked for: a restart
    env = {
        **os.environ,
        "ATTNSERVE_MODEL_REPOSITORY": str(repository),
        "ATTNSERVE_HOST": "127.0.0.1",
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_LOG_LEVEL": "warning",
        "ATTNSERVE_INTRA_OP_THREADS": "1",
        "ATTNSERVE_DRAIN_SECONDS": "0",
        "ATTNSERVE_GRPC_PORT": "0",  # gRPC only where a test asks for it (a free port)
        # Every request computed (the tests of limits, deadlines and batching count runs);
        # the response cache has its own tests (tests/service/test_response_cache.py).
        "ATTNSERVE_RESPONSE_CACHE_BYTES": "0",
        **{f"ATTNSERVE_{k.upper()}": v for k, v in settings.items()},
    }
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        server = ServerProcess(url, proc, log)
        try:
            wait_ready(url, proc, server.log, wait_for=wait_for)
            yield server
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def running_server(repository: Path, *, wait_for: str = "ready", **settings: str) -> Iterator[str]:
    """``server_process``, yielding only its base URL."""
    with server_process(repository, wait_for=wait_for, **settings) as server:
        yield server.url


@pytest.fixture(scope="session")
def server_url(model_repository: Path) -> Iterator[str]:
    """A real server on the tiny model repository, shared by the session."""
    with running_server(model_repository) as url:
        yield url


@pytest.fixture(scope="session")
def minilm_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding the real all-MiniLM-L6-v2, exported as `make serve` does."""
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("minilm-models")
    assert main(["--preset", "minilm-l6", "--out", str(repo / "minilm-l6")]) == 0
    return repo


MINILM_GRPC: dict[str, str] = {}  # the MiniLM server's gRPC address, once it runs


@pytest.fixture(scope="session")
def minilm_server_url(minilm_repository: Path) -> Iterator[str]:
    grpc_port = free_port()
    with running_server(minilm_repository, intra_op_threads="2", grpc_port=str(grpc_port)) as url:
        MINILM_GRPC["address"] = f"127.0.0.1:{grpc_port}"
        yield url


@pytest.fixture(scope="session")
def minilm_grpc_address(minilm_server_url: str) -> str:
    """The gRPC address (host:port) of the session's MiniLM server."""
    return MINILM_GRPC["address"]


@pytest.fixture(scope="session")
def head_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """A model repository of models with heads (tests.support.heads.HEAD_MODELS: rerankers,
    a classifier, SPLADE) and each one's checkpoint folder, as its user saved it."""
    from tests.support.heads import head_repository

    return head_repository(tmp_path_factory.mktemp("heads"))
