"""docker-compose.yml as `docker compose up` runs it: 2 replicas behind nginx, Prometheus.

Load goes through nginx on 127.0.0.1:8000 with the SDK (its default retries),
bounded in time; every answer is checked against the host's own embedding of the
same sentence, so a wrong answer fails as surely as a lost one.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from attnserve_client import AttnserveError, Client
from tests.containers.conftest import EMBEDDING_ATOL, SENTENCES, record
from tests.containers.podman import Compose, Podman
from tests.support.wait import wait_until

BALANCER = "http://127.0.0.1:8000"
PROMETHEUS = "http://127.0.0.1:9090"
CLIENTS = 4


class CountingTransport(httpx.HTTPTransport):
    """httpx's transport, counting the status of every attempt the SDK makes."""

    def __init__(self, statuses: Counter[str], lock: threading.Lock) -> None:
        super().__init__()
        self.statuses = statuses
        self.lock = lock

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = super().handle_request(request)
        except httpx.TransportError as exc:
            with self.lock:
                self.statuses[type(exc).__name__] += 1
            raise
        with self.lock:
            self.statuses[str(response.status_code)] += 1
        return response


@dataclass
class LoadResult:
    answered: int = 0
    wrong: int = 0
    failed: list[str] = field(default_factory=list)
    attempts: Counter[str] = field(default_factory=Counter)


def under_load(reference: np.ndarray, seconds: float, event: Callable[[], None]) -> LoadResult:
    """CLIENTS threads send single sentences for ``seconds``; ``event`` runs 1/3 of the way."""
    result = LoadResult()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client_loop(worker: int) -> None:
        transport = CountingTransport(result.attempts, lock)
        with Client(BALANCER, transport=transport, timeout=30) as client:
            i = worker
            while time.monotonic() < stop_at:
                k = i % len(SENTENCES)
                i += 1
                try:
                    pooled = client.encode([SENTENCES[k]], pooling="mean", normalize=True)
                except AttnserveError as exc:
                    with lock:
                        result.failed.append(f"{type(exc).__name__}: {exc}")
                    continue
                close = np.allclose(pooled.stack("pooled")[0], reference[k], atol=EMBEDDING_ATOL)
                with lock:
                    result.answered += 1
                    result.wrong += not close

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 3)
    event()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    return result


def wait_ready(podman: Podman, container: str, seconds: float = 120) -> float:
    """Seconds until the replica answers its readiness probe (model loaded, warmed up)."""
    return wait_until(
        lambda: (
            podman.run(
                "ready probe", "exec", container, "attnserve-healthcheck", "ready", check=False
            ).returncode
            == 0
        ),
        f"{container} ready",
        seconds,
        interval=0.5,
    )


def upstreams_in_balancer_log(podman: Podman, compose: Compose) -> Counter[str]:
    (balancer,) = compose.containers("balancer")
    log = podman.run("balancer log", "logs", balancer).stdout
    return Counter(
        part.removeprefix("upstream=")
        for line in log.splitlines()
        if "/v1/encode" in line
        for part in line.split()
        if part.startswith("upstream=")
    )


def test_requests_through_nginx_reach_both_replicas(
    podman: Podman, compose_stack: Compose, reference: np.ndarray
) -> None:
    replicas = compose_stack.containers("attnserve")
    assert len(replicas) == 2  # deploy.replicas
    # Compose starts nginx once both are live; one may still be warming up. Its 503
    # (to the fixture's readiness polls) is retried on the other replica and also marks
    # it failed for nginx.conf's fail_timeout (2 s, max_fails=1), so right after both
    # are ready nginx may still send everything to one. Requests go on, every answer
    # checked, until both replicas have served three or 30 s have passed.
    for replica in replicas:
        wait_ready(podman, replica)
    upstreams: Counter[str] = Counter()
    deadline = time.monotonic() + 30
    with Client(BALANCER) as client:
        while time.monotonic() < deadline:
            for _ in range(10):
                got = client.encode(SENTENCES, pooling="mean", normalize=True).stack("pooled")
                np.testing.assert_allclose(got, reference, atol=EMBEDDING_ATOL, rtol=0)
            upstreams = upstreams_in_balancer_log(podman, compose_stack)
            if len(upstreams) == 2 and min(upstreams.values()) >= 3:
                break
            time.sleep(0.5)
    assert len(upstreams) == 2 and min(upstreams.values()) >= 3, upstreams


def test_prometheus_scrapes_both_replicas(compose_stack: Compose) -> None:
    def both_up() -> bool:
        try:
            targets = httpx.get(f"{PROMETHEUS}/api/v1/targets", timeout=2).json()
        except (httpx.TransportError, ValueError):
            return False
        active = targets["data"]["activeTargets"]
        return len(active) == 2 and all(t["health"] == "up" for t in active)

    record(
        prometheus_targets_up_after_seconds=round(
            wait_until(both_up, "Prometheus", 90, interval=0.2), 1
        )
    )


def test_sigkill_of_a_replica_under_load_loses_nothing(
    podman: Podman, compose_stack: Compose, reference: np.ndarray
) -> None:
    victim = compose_stack.containers("attnserve")[0]
    # The replica's process dies as in a crash or an OOM kill: SIGKILL from the host.
    # (`podman kill` would count as an operator's stop, which no restart policy undoes.)
    pid = int(podman.inspect(victim, "{{.State.Pid}}"))
    result = under_load(reference, 9.0, lambda: os.kill(pid, signal.SIGKILL))
    record(
        sigkill_answered=result.answered,
        sigkill_attempts=dict(result.attempts),
        sigkill_failed=len(result.failed),
    )
    assert result.failed == [] and result.wrong == 0
    assert result.answered > 20
    # restart: unless-stopped brings it back.
    wait_until(
        lambda: podman.inspect(victim, "{{.RestartCount}}") != "0", "restart", 60, interval=0.2
    )
    wait_until(
        lambda: podman.inspect(victim, "{{.State.Running}}") == "true", "restart", 60, interval=0.2
    )
    record(sigkill_restart_ready_seconds=round(wait_ready(podman, victim), 1))


def test_sigterm_drains_a_replica_under_load(
    podman: Podman, compose_stack: Compose, reference: np.ndarray
) -> None:
    # Draining one replica loses nothing only if another can take its load: the one
    # the SIGKILL test restarted may still be loading (it answered 502 in CI).
    replicas = compose_stack.containers("attnserve")
    for replica in replicas:
        wait_ready(podman, replica)
    victim = replicas[1]
    result = under_load(reference, 12.0, lambda: podman.run("stop", "stop", victim, timeout=60))
    exit_code = podman.inspect(victim, "{{.State.ExitCode}}")
    record(
        sigterm_answered=result.answered,
        sigterm_attempts=dict(result.attempts),
        sigterm_exit_code=exit_code,
    )
    assert exit_code == "0"
    assert result.failed == [] and result.wrong == 0
    assert result.answered > 20
