"""deploy/nginx/nginx.conf with the real nginx binary in front of two real replicas.

The file is the one the compose deployment mounts; only its listen port and
upstream servers are replaced by 127.0.0.1 ports. .ci/run installs Debian's nginx.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import ServerProcess, free_port, server_process
from tests.support.metrics import metric

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "nginx" / "nginx.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
pytestmark = pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed")


def render(
    tmp: Path,
    listen: int,
    upstreams: list[str],
    grpc_listen: int | None = None,
    grpc_upstreams: tuple[str, ...] = ("127.0.0.1:1",),
) -> Path:
    """The deployed config, listening on 127.0.0.1:``listen``, balancing ``upstreams``
    (and gRPC on ``grpc_listen`` over ``grpc_upstreams``)."""
    text = CONFIG.read_text()
    text, listens = re.subn(r"listen \d+;", f"listen 127.0.0.1:{listen};", text)
    grpc_port = grpc_listen or free_port()
    text, grpc_listens = re.subn(r"listen \d+ http2;", f"listen 127.0.0.1:{grpc_port} http2;", text)
    for name, targets in (("8000", upstreams), ("8001", grpc_upstreams)):
        servers = "\n".join(f"        server {u} max_fails=1 fail_timeout=2s;" for u in targets)
        text, replaced = re.subn(rf"^\s*server attnserve:{name}[^\n]*$", servers, text, flags=re.M)
        assert replaced == 1, "the config's upstream lines moved"
    assert (listens, grpc_listens) == (1, 1), "the config's listen lines moved"
    text = text.replace("/tmp/nginx", str(tmp / "nginx"))
    path = tmp / "nginx.conf"
    path.write_text(text)
    return path


def test_config_passes_nginx_t(tmp_path: Path) -> None:
    conf = render(tmp_path, free_port(), ["127.0.0.1:1"])
    check = subprocess.run(
        [NGINX, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    assert "test is successful" in check.stderr


@contextlib.contextmanager
def running_nginx(tmp: Path, upstreams: list[str], **grpc: Any) -> Iterator[str]:
    port = free_port()
    conf = render(tmp, port, upstreams, **grpc)
    errors = tmp / "nginx.err"
    with errors.open("wb") as err:
        proc = subprocess.Popen(
            [NGINX, "-c", str(conf), "-p", str(tmp), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60  # a hung nginx, not a measure
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, errors.read_text()
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def encodes_answered(url: str) -> float:
    """``attnserve_requests_total`` of /v1/encode with status 200, from one replica."""
    return metric(
        url, "attnserve_requests_total", protocol="native", route="/v1/encode", status="200"
    )


BODY = {"inputs": [np.ones((5, 32), dtype=np.float32).tolist()]}


@pytest.mark.slow  # about 11 s on 2 cores, more under load: two replicas under load
def test_two_replicas_share_the_load_and_a_sigterm_mid_load_loses_nothing(
    tmp_path: Path, model_repository: Path
) -> None:
    with ExitStack() as stack:
        replicas: list[ServerProcess] = [
            stack.enter_context(server_process(model_repository, drain_seconds="1"))
            for _ in range(2)
        ]
        ports = [r.url.rsplit(":", 1)[1] for r in replicas]
        lb = stack.enter_context(running_nginx(tmp_path, [f"127.0.0.1:{p}" for p in ports]))
        client = stack.enter_context(httpx.Client(base_url=lb, timeout=30))

        # Spread: requests reach both replicas; the request id passes both ways.
        answer = client.post("/v1/encode", json=BODY, headers={"x-request-id": "lb-test-1"})
        assert answer.status_code == 200
        assert answer.headers["x-request-id"] == "lb-test-1"
        for _ in range(20):
            assert client.post("/v1/encode", json=BODY).status_code == 200
        counts = [encodes_answered(r.url) for r in replicas]
        assert sum(counts) == 21 and min(counts) >= 5, counts

        # SIGTERM one replica while 4 clients keep sending: every request gets 200.
        statuses: list[int] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=lb, timeout=30) as own:
                while not stop.is_set() and len(statuses) < 2000:
                    statuses.append(own.post("/v1/encode", json=BODY).status_code)

        with ThreadPoolExecutor(4) as pool:
            for _ in range(4):
                pool.submit(load)
            time.sleep(1.0)
            replicas[0].proc.send_signal(signal.SIGTERM)
            assert replicas[0].proc.wait(timeout=30) == 0
            time.sleep(1.0)
            stop.set()
        assert len(statuses) > 20
        assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}

        # Brought back on the same port, it takes traffic again.
        back = stack.enter_context(server_process(model_repository, port=ports[0]))
        time.sleep(2.5)  # past fail_timeout, nginx tries the address again
        for _ in range(20):
            assert client.post("/v1/encode", json=BODY).status_code == 200
        assert encodes_answered(back.url) > 0


def test_grpc_goes_through_the_http2_listener(tmp_path: Path, model_repository: Path) -> None:
    """tritonclient.grpc through nginx's grpc_pass: the same answer as the replica gives
    directly, and the request id reaches the replica's scope."""
    import tritonclient.grpc as tgrpc

    replica_grpc, lb_grpc = free_port(), free_port()
    embeds = np.random.default_rng(3).standard_normal((2, 5, 32)).astype(np.float32)
    with ExitStack() as stack:
        replica = stack.enter_context(server_process(model_repository, grpc_port=str(replica_grpc)))
        port = replica.url.rsplit(":", 1)[1]
        stack.enter_context(
            running_nginx(
                tmp_path,
                [f"127.0.0.1:{port}"],
                grpc_listen=lb_grpc,
                grpc_upstreams=(f"127.0.0.1:{replica_grpc}",),
            )
        )
        answers = []
        for address in (f"127.0.0.1:{lb_grpc}", f"127.0.0.1:{replica_grpc}"):
            client = tgrpc.InferenceServerClient(address)
            tensor = tgrpc.InferInput("inputs_embeds", [2, 5, 32], "FP32")
            tensor.set_data_from_numpy(embeds)
            result = client.infer("tiny", [tensor], headers={"x-request-id": "through-nginx"})
            answers.append(result.as_numpy("last_hidden_state"))
            client.close()
        np.testing.assert_array_equal(answers[0], answers[1])  # tolerance 0: one replica
