"""The one server launcher: ``python -m service`` on 127.0.0.1, and peers' servers.

``running_server`` (one model) and ``running_repository`` (a whole model
repository) start our service in a process of its own, wait until it is ready and
yield where it listens and its pid; ``peer_process`` does the same for another
project's server (a whole process group, stopped as one).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.lib.models import ROOT
from bench.lib.procs import process_tree


def free_port() -> int:
    """A port nothing listens on now (the OS's choice on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Served:
    """A running server: its HTTP port and its process id (the process that listens)."""

    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def running_server(model_dir: Path, /, **settings: str) -> Iterator[Served]:
    """``python -m service`` with ``model_dir`` as its default model (the repository
    served is its parent folder); yields once ``/health/ready`` answers 200, stops the
    server on exit.

    ``settings`` are ATTNSERVE_* values without the prefix. By default gRPC is off and
    the response cache too: every request is computed (``bench.cache`` measures the
    cache by turning it on).
    """
    with running_checkout(
        ROOT, model_dir.parent, **{"DEFAULT_MODEL": model_dir.name, **settings}
    ) as served:
        yield served


@contextmanager
def running_repository(repository: Path, /, **settings: str) -> Iterator[Served]:
    """``running_server`` for a whole model ``repository``, its default model left to
    the service's settings."""
    with running_checkout(ROOT, repository, **settings) as served:
        yield served


@contextmanager
def running_checkout(service_root: Path, repository: Path, /, **settings: str) -> Iterator[Served]:
    """``running_repository`` with the ``service`` of the checkout ``service_root``: an
    older version measured beside this one (``bench.hardening``'s before/after figures).
    A ``port`` setting is the port to listen on (else a free one)."""
    port = int(settings.pop("port", None) or free_port())
    env = {
        **os.environ,
        "ATTNSERVE_MODEL_REPOSITORY": str(repository),
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_GRPC_PORT": "0",
        "ATTNSERVE_RESPONSE_CACHE_BYTES": "0",
        "ATTNSERVE_LOG_LEVEL": "warning",
        **{f"ATTNSERVE_{k.upper()}": v for k, v in settings.items()},
    }
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "service"],
            cwd=service_root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def log_text() -> str:
            log.seek(0)
            return log.read().decode(errors="replace")

        try:
            wait_ready(f"http://127.0.0.1:{port}", server, log_text)
            yield Served(port, server.pid)
        finally:
            server.terminate()
            server.wait(timeout=60)


# How long a server may take to become ready before a test or a benchmark gives up. A
# bound for a server that hangs, not a measure: a multi-model server on a loaded 2-core
# machine took over 60 s to load, warm up and calibrate. A server that exits stops the wait
# at once, so a failed start costs no more time for being generous.
READY_TIMEOUT_ENV = "ATTNSERVE_TEST_READY_TIMEOUT"
READY_TIMEOUT_SECONDS = 600.0
LOG_TAIL_CHARS = 4000  # the end of the server's log shown in a failure


def ready_timeout() -> float:
    """The readiness bound: ATTNSERVE_TEST_READY_TIMEOUT seconds, else 600."""
    return float(os.environ.get(READY_TIMEOUT_ENV) or READY_TIMEOUT_SECONDS)


class ServerFailed(RuntimeError):
    """The server process exited before it became ready."""

    def __init__(self, returncode: int, log: str) -> None:
        super().__init__(f"server exited with {returncode}:\n{log}")
        self.returncode = returncode
        self.log = log


def ready_status(url: str) -> int | None:
    """``/health/ready``'s status, None while nothing answers."""
    return http_status(f"{url}/health/ready")


def http_status(url: str) -> int | None:
    """The status a GET of ``url`` answers, None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:  # refused, reset or timed out: not listening yet
        return None


def wait_ready(
    url: str, server: subprocess.Popen[bytes], log: Callable[[], str], *, wait_for: str = "ready"
) -> None:
    """The one wait for a started ``python -m service``: polls ``url``'s ``/health/ready``
    while ``server`` lives, until it answers 200 (``wait_for="up"``: anything at all, for a
    server meant never to become ready) or ``ready_timeout()`` passes.

    ServerFailed (with the whole ``log()``) if the process exits first; TimeoutError with
    the log's tail if the bound passes."""
    timeout = ready_timeout()
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            raise ServerFailed(server.returncode, log())
        status = ready_status(url)
        if status == 200 or (status is not None and wait_for == "up"):
            return
        if time.monotonic() > deadline:
            tail = log()[-LOG_TAIL_CHARS:]
            raise TimeoutError(
                f"server at {url} not {wait_for} after {timeout:.0f} s "
                f"({READY_TIMEOUT_ENV}); its log ends:\n{tail}"
            )
        time.sleep(0.05)


@contextmanager
def peer_process(
    cmd: list[str],
    env: dict[str, str],
    port: int,
    ready_paths: list[str],
    log_path: Path,
    cwd: Path,
    timeout: float = 180,
) -> Iterator[int]:
    """A peer's server in its own process group; yields its pid once every path answers
    200, and on exit stops the whole group and waits for every process of it."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout
            pending = list(ready_paths)
            while pending:
                if proc.poll() is not None:
                    tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
                    raise RuntimeError(f"exited with {proc.returncode}: {' / '.join(tail)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready after {timeout:.0f} s; see {log_path}")
                try:
                    url = f"http://127.0.0.1:{port}{pending[0]}"
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            pending.pop(0)
                            continue
                except OSError:
                    pass
                time.sleep(0.2)
            yield proc.pid
        finally:
            tree = process_tree(proc.pid)
            if proc.poll() is None:
                os.killpg(proc.pid, 15)  # the group: Triton's server and stubs too
            deadline = time.monotonic() + 30
            # Wait for the whole group (tritonserver outlives its Python parent for a few
            # seconds): the next contender must not share the cores with its shutdown.
            while any(Path(f"/proc/{p}").exists() for p in tree) and time.monotonic() < deadline:
                proc.poll()
                time.sleep(0.2)
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()
