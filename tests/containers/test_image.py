"""The image as `docker run` starts it: answers, user, contents, size and cold start."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from attnserve_client import Client
from model_export.graph_io import GRAPH_EMBEDDINGS, INPUT_EMBEDS, INPUT_MASK, OUTPUT_HIDDEN
from tests.conftest import free_port
from tests.containers.conftest import EMBEDDING_ATOL, ROOT, SENTENCES, ok, record
from tests.containers.podman import Podman
from tests.support.onnx_runs import new_session
from tests.support.wait import wait_until

CONTAINER = "attnserve-check-image"


@pytest.fixture(scope="module")
def served(podman: Podman, image: str) -> Iterator[str]:
    """``docker run -p 127.0.0.1:PORT:8000 attnserve``; yields its URL."""
    podman.run("image run", "rm", "--force", "--ignore", CONTAINER)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    podman.run("image run", "run", "--detach", "--name", CONTAINER,
               "--publish", f"127.0.0.1:{port}:8000", image)  # fmt: skip
    try:
        wait_until(lambda: ok(f"{url}/health/ready"), "image: /health/ready", 120, interval=0.2)
        record(image_cold_start_seconds=round(time.monotonic() - started, 2))
        yield url
    finally:
        podman.run("image stop", "rm", "--force", "--time", "10", CONTAINER)


def test_image_answers_text_like_the_host(served: str, reference: np.ndarray) -> None:
    with Client(served) as client:
        result = client.encode(SENTENCES, pooling="mean", normalize=True)
    assert result.tokens is not None and result.tokens[0][:3] == ["[CLS]", "a", "man"]
    # The image exported its own copy of the weights at build time: same numbers.
    np.testing.assert_allclose(result.stack("pooled"), reference, atol=EMBEDDING_ATOL, rtol=0)


def test_image_answers_embeddings_like_onnxruntime_on_the_host(served: str) -> None:
    inputs = np.random.default_rng(0).normal(size=(2, 7, 384)).astype(np.float32)
    with Client(served) as client:
        got = client.encode(inputs).stack()  # raw float32 over /v2 binary tensors
    session = new_session(ROOT / "models" / "minilm-l6" / GRAPH_EMBEDDINGS)
    (want,) = session.run(
        [OUTPUT_HIDDEN], {INPUT_EMBEDS: inputs, INPUT_MASK: np.ones((2, 7), dtype=np.int64)}
    )
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)  # export parity bound


def test_image_runs_as_non_root_without_torch(podman: Podman, served: str) -> None:
    assert podman.run("id", "exec", CONTAINER, "id", "-u").stdout.strip() == "10001"
    no_torch = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
    podman.run("no torch", "exec", CONTAINER, "python", "-c", no_torch)


def test_image_healthcheck_is_kept_and_passes(podman: Podman, served: str) -> None:
    # --format docker keeps HEALTHCHECK (OCI images drop it); it probes liveness.
    test = podman.inspect(CONTAINER, "{{.Config.Healthcheck.Test}}")
    assert "attnserve-healthcheck live" in test
    podman.run("healthcheck", "healthcheck", "run", CONTAINER)
