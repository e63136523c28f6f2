"""Dockerfile and docker-compose.yml: static checks, and the image's commands run here.

The fast half of the container checks: hadolint and Compose's own parser check
the files, and the runtime stage's ENV, CMD and HEALTHCHECK are read out of the
Dockerfile and run as they are (bar the host and port) against the real
all-MiniLM-L6-v2 model directory. The image itself is built and run, with
compose and `podman kube play`, by `make container-check` (tests/containers/).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import compose
import httpx

from bench.lib.server import ready_timeout
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPOSE = Path(compose.__file__).parent / "docker-compose"


def runtime_stage() -> list[str]:
    """Instruction lines (continuations joined) of the Dockerfile's last stage."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    start = max(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    return lines[start:]


def instruction(name: str) -> str:
    (line,) = [ln for ln in runtime_stage() if ln.startswith(f"{name} ")]
    return line[len(name) + 1 :].strip()


def runtime_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in runtime_stage():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [str(BIN / "hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_file_is_valid_and_serves_on_loopback() -> None:
    result = subprocess.run(
        [str(COMPOSE), "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    service = services["attnserve"]
    # Replicas are reached through the balancer only, which publishes on loopback.
    assert "ports" not in service
    assert service["deploy"]["replicas"] == 2
    published = [(p["host_ip"], p["published"], p["target"]) for p in services["balancer"]["ports"]]
    assert published == [("127.0.0.1", "8000", 8080), ("127.0.0.1", "8001", 8081)]
    nginx = (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    assert "listen 8080;" in nginx and "listen 8081 http2;" in nginx
    assert "server attnserve:8000" in nginx and "server attnserve:8001" in nginx
    assert services["attnserve"]["environment"]["ATTNSERVE_HOST"] == "0.0.0.0"
    assert services["balancer"]["depends_on"]["attnserve"]["condition"] == "service_healthy"
    prometheus = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "names: [attnserve]" in prometheus and "port: 8000" in prometheus
    # Exec form with no spaces inside an argument (podman's Docker API re-splits on them).
    assert service["healthcheck"]["test"] == ["CMD", "attnserve-healthcheck", "live"]
    # Docker SIGKILLs after stop_grace_period: it must outlast the server's own shutdown.
    grace = int(service["stop_grace_period"].rstrip("s"))
    assert grace > float(service["environment"]["ATTNSERVE_SHUTDOWN_TIMEOUT"])
    assert float(service["environment"]["ATTNSERVE_DRAIN_SECONDS"]) < grace


def test_export_stage_pins_the_same_torch_as_pyproject() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (pin,) = [r for r in pyproject["project"]["optional-dependencies"]["export"] if "torch" in r]
    assert pin == "torch==2.13.0"
    assert (
        f"pip install {pin} --index-url https://download.pytorch.org/whl/cpu"
        in (ROOT / "Dockerfile").read_text()
    )


def test_runtime_stage_needs_no_torch() -> None:
    installs = " ".join(ln for ln in runtime_stage() if ln.startswith("RUN "))
    assert "'.[serve]'" in installs
    assert "torch" not in installs and "export" not in installs


def test_image_commands_serve_and_pass_the_healthcheck(minilm_repository: Path) -> None:
    """CMD with the image's ENV starts the server; the HEALTHCHECK command then passes."""
    env_image = runtime_env()
    assert env_image["ATTNSERVE_DEFAULT_MODEL"] == "minilm-l6"
    port = free_port()
    env = {
        **os.environ,
        **env_image,
        "ATTNSERVE_MODEL_REPOSITORY": str(minilm_repository),  # the image's /models
        "ATTNSERVE_HOST": "127.0.0.1",  # tests stay on loopback
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_GRPC_PORT": "0",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    cmd = json.loads(instruction("CMD"))
    health = json.loads(re.sub(r"^.*?CMD ", "", instruction("HEALTHCHECK")))
    assert health == ["attnserve-healthcheck", "live"]  # liveness: a busy replica is not sick

    def probe(*command: str) -> int:
        return subprocess.run(command, env=env, capture_output=True).returncode

    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + ready_timeout()
        while probe(*health) != 0:
            assert server.poll() is None, f"CMD {cmd} exited with {server.returncode}"
            assert time.monotonic() < deadline, "HEALTHCHECK never passed"
            time.sleep(0.2)
        # Live is not ready: the warm-up (and the run planner's calibration) comes first.
        while probe("attnserve-healthcheck", "ready") != 0:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/encode", json={"inputs": ["in a container"]})
        assert r.status_code == 200 and r.json()["model"] == "minilm-l6"
    finally:
        server.terminate()
        server.wait(timeout=10)
    # Stopped: the healthcheck must now fail, so it is not a command that always passes.
    assert probe(*health) != 0
    assert probe("attnserve-healthcheck", "ready") != 0


def test_commands_are_exec_form() -> None:
    """Exec form: the server is PID 1 and gets SIGTERM for a graceful shutdown."""
    assert instruction("CMD").startswith("[")
    assert 'CMD ["' in instruction("HEALTHCHECK")


def test_compose_config_is_quiet() -> None:
    # `docker-compose config -q`: no output, exit 0 (the binary; its wrapper always exits 0).
    result = subprocess.run(
        [str(COMPOSE), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_session_cache_lives_on_a_volume_the_server_owns() -> None:
    """The image's session cache directory is a sub-directory of one the image makes for
    the server's user, and compose mounts a named volume there (a new named volume
    starts as a copy of the image's directory, owner included), so the cache is kept
    across recreated replicas and shared by them, whatever the root filesystem."""
    cache = Path(runtime_env()["ATTNSERVE_SESSION_CACHE_DIR"])
    user = instruction("USER")
    made = [ln for ln in runtime_stage() if f"install -d -o {user} -g {user}" in ln]
    assert made and str(cache.parent) in made[0].split()
    result = subprocess.run(
        [str(COMPOSE), "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    service = config["services"]["attnserve"]
    assert Path(service["environment"]["ATTNSERVE_SESSION_CACHE_DIR"]) == cache
    (volume,) = [v for v in service["volumes"] if v["target"] == str(cache.parent)]
    assert volume["type"] == "volume" and volume["source"] in config["volumes"]
