"""The compiled load generator: wrk, driving a server with the same requests as the
Python client, from one event-loop thread in C (it takes far fewer of the cores the
server needs; its cores are measured as the Python client's are).

wrk sends the contender's bodies in turn (``workers/wrk_bodies.lua``: T2's one text per
request, W1–W4's arrays), runs for the run's seconds (it has no request count) and
reports its latency percentiles as one line of JSON. It cannot check answers: a wrk
round counts only after the Python client's pre-timing check of the same calls passes.
Installed by ``bench/peers/setup_wrk.sh``; without it the wrk columns are skipped, said
in the notes.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.peers.common import WORKERS
from bench.peers.wire import Call

SCRIPT = WORKERS / "wrk_bodies.lua"
MARK = "WRK-JSON "  # the line the script's done() prints
WRK = ", wrk"  # a wrk row's contender: the Python client's name and this
WRK_WORKLOADS = "W2,W4,T2,T2L"  # where the client's cores matter most (--wrk-workloads)


def wrk_binary() -> str | None:
    return shutil.which("wrk")


def wrk_ready(calls: list[Call]) -> bool:
    """Whether wrk can send these calls: HTTP, one path and one set of headers (wrk's
    ``-H``: each body's own length is its Content-Length)."""
    return (
        bool(calls)
        and not calls[0].grpc
        and all(c.path == calls[0].path and c.headers == calls[0].headers for c in calls)
    )


def write_bodies(path: Path, bodies: list[bytes]) -> None:
    """The script's input: per body, its length on a line, then its bytes."""
    with path.open("wb") as file:
        for body in bodies:
            file.write(b"%d\n" % len(body) + body)


def parse_wrk(output: str) -> dict[str, Any]:
    """The script's JSON line of wrk's output; ValueError if it is missing (wrk failed
    before ``done``)."""
    for line in output.splitlines():
        if line.startswith(MARK):
            parsed: dict[str, Any] = json.loads(line.removeprefix(MARK))
            return parsed
    raise ValueError(f"no {MARK.strip()} line in wrk's output: {output[-500:]!r}")


def wrk_stats(parsed: dict[str, Any], cpu_s: float) -> dict[str, float]:
    """One run's statistics in the Python client's keys, from the parsed line and wrk's
    CPU seconds; RuntimeError if any request failed (a non-2xx answer, a timeout, a
    broken connection) or none was made."""
    errors = {k: v for k, v in parsed["errors"].items() if v}
    if errors or not parsed["requests"]:
        raise RuntimeError(f"wrk: {parsed['requests']} requests, errors {errors or 'none'}")
    wall = parsed["duration_us"] / 1e6
    latency = parsed["latency_us"]
    return {
        "requests": float(parsed["requests"]),
        "wall_s": wall,
        "p50_ms": latency["p50"] / 1000,
        "p99_ms": latency["p99"] / 1000,
        "loadgen_cores": cpu_s / wall,
        "bytes_per_answer": parsed["bytes"] / parsed["requests"],
    }


def wrk_run(
    binary: str, port: int, calls: list[Call], concurrency: int, seconds: float
) -> dict[str, float]:
    """One timed wrk run (one thread, ``concurrency`` keep-alive connections) of the
    calls' bodies in turn, for ``seconds`` (whole seconds, at least 1: wrk's unit)."""
    with tempfile.TemporaryDirectory(prefix="peers-wrk-") as work:
        bodies = Path(work) / "bodies"
        write_bodies(bodies, [c.body for c in calls])
        cmd = [binary, "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency"]
        cmd += [arg for name, value in calls[0].headers for arg in ("-H", f"{name}: {value}")]
        cmd += ["-s", str(SCRIPT), f"http://127.0.0.1:{port}{calls[0].path}", "--", str(bodies)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited {done.returncode}: {done.stderr[-500:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wrk_stats(parse_wrk(done.stdout), cpu)
