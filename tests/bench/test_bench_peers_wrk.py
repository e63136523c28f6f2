"""bench.peers' compiled load client: the real wrk (Debian's, from setup_wrk.sh) with
its Lua script against a stdlib server: every body sent in turn, its JSON line parsed,
a failed request failing the run. Skipped where wrk is not installed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.peers.wire import Call
from bench.peers.wrk import MARK, parse_wrk, write_bodies, wrk_ready, wrk_run, wrk_stats
from tests.bench.echo_server import Recorder, echo_server

WRK = shutil.which("wrk")
needs_wrk = pytest.mark.skipif(WRK is None, reason="wrk is not installed (setup_wrk.sh)")
CALLS = [Call("/v1/embeddings", b'{"input": ["text %d"]}' % i) for i in range(500)]


@needs_wrk
def test_wrk_sends_the_bodies_in_turn_and_its_output_parses() -> None:
    assert WRK is not None
    recorder = Recorder()
    with echo_server(recorder) as port:
        stats = wrk_run(WRK, port, CALLS, concurrency=2, seconds=1)
    # wrk counts the answers it read: those in flight when it stopped are not counted.
    assert 0 < stats["requests"] <= len(recorder.bodies) <= stats["requests"] + 2
    assert set(recorder.paths) == {"/v1/embeddings"}
    count = min(len(recorder.bodies), len(CALLS))  # in turn: no body twice before all went
    assert len(set(recorder.bodies[:count])) == count
    assert set(recorder.bodies) <= {c.body for c in CALLS}
    assert 0 < stats["p50_ms"] <= stats["p99_ms"]
    assert 0.5 < stats["wall_s"] < 5 and stats["loadgen_cores"] >= 0
    assert stats["bytes_per_answer"] > len(b'{"ok": true}')  # headers and body


@needs_wrk
def test_a_refused_request_fails_the_wrk_run() -> None:
    assert WRK is not None
    with echo_server(Recorder(status=503)) as port, pytest.raises(RuntimeError, match="status"):
        wrk_run(WRK, port, CALLS[:3], concurrency=1, seconds=1)


def test_the_bodies_file_keeps_binary_bodies_whole(tmp_path: Path) -> None:
    bodies = [b"a\nb", bytes(range(256)), b""]
    write_bodies(tmp_path / "b", bodies)
    assert (tmp_path / "b").read_bytes() == b"3\na\nb256\n" + bytes(range(256)) + b"0\n"


def test_parsing_needs_the_scripts_line_and_counts_every_error() -> None:
    line = {"requests": 10, "duration_us": 2_000_000, "bytes": 1000}
    line |= {"errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}}
    line |= {"latency_us": {"p50": 1500, "p99": 4000, "mean": 1700.0, "max": 5000}}
    output = "Running 2s test @ http://x\n" + MARK + json.dumps(line) + "\n"
    stats = wrk_stats(parse_wrk(output), cpu_s=0.5)
    assert stats == {
        "requests": 10.0,
        "wall_s": 2.0,
        "p50_ms": 1.5,
        "p99_ms": 4.0,
        "loadgen_cores": 0.25,
        "bytes_per_answer": 100.0,
    }
    with pytest.raises(ValueError, match="WRK-JSON"):
        parse_wrk("Running 2s test @ http://x\n")
    line["errors"]["timeout"] = 1
    with pytest.raises(RuntimeError, match="timeout"):
        wrk_stats(line, cpu_s=0.5)


def test_wrk_takes_http_calls_of_one_path_and_headers() -> None:
    assert wrk_ready(CALLS)
    assert not wrk_ready([])
    assert not wrk_ready([Call("/a", b""), Call("/b", b"")])
    assert not wrk_ready([Call("/x", b"", headers=(), grpc=True)])
