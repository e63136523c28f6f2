"""`make container-check`: the image, compose and Kubernetes files run for real in podman.

These tests build and run containers, so they take minutes and need root and
podman: they are collected only when ``ATTNSERVE_CONTAINER_CHECK=1`` (set by
`make container-check`), and then fail, naming the step, if the engine cannot
run. What they measure (image size, cold start, failover counts) goes to
``test-artifacts/container-report.json`` and the end of pytest's output.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from attnserve_client import Client
from tests.conftest import running_server
from tests.containers.podman import ROOT, Compose, HealthChecks, Podman
from tests.support.wait import wait_until

ENABLED = os.environ.get("ATTNSERVE_CONTAINER_CHECK") == "1"
collect_ignore_glob = [] if ENABLED else ["test_*.py"]

IMAGE = "attnserve:0.1.0"  # the tag docker-compose.yml and deploy/k8s use
PROJECT = "attnserve-check"
WORKDIR = ROOT / ".container-check"
ARTIFACTS = Path(os.environ.get("ATTNSERVE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
# Sentences every deployment must embed exactly as the code does on the host.
SENTENCES = ["A man is playing a guitar.", "Someone plays the guitar.", "Stock markets fell."]
EMBEDDING_ATOL = 1e-5  # same weights and graph; only batching and threads differ

REPORT = ARTIFACTS / "container-report.json"


def record(**values: Any) -> None:
    """Add measurements to the report kept in test-artifacts and printed at the end.

    Kept in the file, not a dict: pytest may import this conftest under two names.
    """
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    REPORT.write_text(json.dumps({**report, **values}, indent=2) + "\n")


def pytest_sessionstart(session: pytest.Session) -> None:
    if ENABLED:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        REPORT.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Only for a container check: a plain `make test` must not print an old report.
    if ENABLED and REPORT.exists():
        terminalreporter.section("container check")
        for key, value in json.loads(REPORT.read_text()).items():
            terminalreporter.write_line(f"{key}: {value}")


@pytest.fixture(scope="session")
def podman() -> Podman:
    return Podman(WORKDIR)


@pytest.fixture(scope="session")
def image(podman: Podman) -> str:
    """The project's image, built from the Dockerfile as it is (bases first)."""
    bases = podman.ensure_bases()
    seconds = podman.build(IMAGE, ROOT)
    size = int(podman.run("image size", "image", "inspect", IMAGE, "--format", "{{.Size}}").stdout)
    record(bases=bases, build_seconds=round(seconds, 1), image_size_mb=round(size / 1e6))
    return IMAGE


@pytest.fixture(scope="session")
def reference() -> Iterator[np.ndarray]:
    """SENTENCES embedded by a server run from this checkout on the host (./models)."""
    models = ROOT / "models"
    if not (models / "minilm-l6" / "config.json").exists():
        raise RuntimeError("container check: ./models/minilm-l6 is missing (make export-default)")
    with running_server(models) as url, Client(url) as client:
        yield client.encode(SENTENCES, pooling="mean", normalize=True).stack("pooled")


@pytest.fixture(scope="session")
def health_checks(podman: Podman) -> Iterator[HealthChecks]:
    with HealthChecks(podman, PROJECT) as checks:
        yield checks


@pytest.fixture(scope="module")
def compose_stack(podman: Podman, image: str, health_checks: HealthChecks) -> Iterator[Compose]:
    """`docker compose up` of docker-compose.yml: 2 replicas, nginx on :8000, Prometheus.

    Down again after its module: `podman kube play` (test_kube) binds the pod's
    containerPort, 8000, on the host as well.
    """
    for port in (8000, 9090):
        if not port_is_free(port):
            raise RuntimeError(f"compose: 127.0.0.1:{port} is taken; the compose file needs it")
    with podman.docker_api() as env:
        compose = Compose(env, PROJECT)
        compose("compose down", "down", "--remove-orphans", "--timeout", "5")
        try:
            started = time.monotonic()
            # --wait would also wait for Prometheus; up returns once nginx has started,
            # which depends_on holds back until both replicas are healthy.
            compose("compose up", "up", "--detach", "--no-build", timeout=300)
            wait_until(
                lambda: ok("http://127.0.0.1:8000/health/ready"),
                "nginx → replicas",
                120,
                interval=0.2,
            )
            record(compose_up_seconds=round(time.monotonic() - started, 1))
            yield compose
        finally:
            compose("compose down", "down", "--remove-orphans", "--timeout", "10")


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
