"""Smoke run of ``python -m bench.peers``: ours and in-process onnxruntime on the tiny model.

The real benchmark is run by hand (peers need their own venvs and minutes of
CPU); this proves the command, its numerical check and its report still work,
without timing anything against a target. Unit tests below hold its bookkeeping:
rounds paired by id (a failed round shifts nothing), and a wrong answer failing
the contender's round, before timing or in the sample checked after it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.peers.checks import WrongAnswer, check_answers, check_summary
from bench.peers.common import ATOL, Bench, Results, Row, Server
from bench.peers.limit import limit_of
from bench.peers.measure import measure_contender
from bench.peers.ratios import cell, ratios, unpaired
from bench.peers.wire import native_call
from bench.peers.workloads import WORKLOADS, Inputs

ROOT = Path(__file__).resolve().parents[2]
CONTENDERS = ("ours JSON floats", "ours base64", "ours /v2 binary")


@pytest.mark.slow  # about 16 s on 2 cores: every contender of bench.peers once
def test_smoke_run_reports_every_row(tiny_model_dir: Path, tmp_path: Path) -> None:
    doc, png, raw = tmp_path / "benchmarks.md", tmp_path / "peers.png", tmp_path / "peers.json"
    doc.write_text("# Benchmarks\n\nkept as it is\n")
    cmd = [sys.executable, "-m", "bench.peers", "--smoke"]
    cmd += ["--model-dir", str(tiny_model_dir), "--doc", str(doc), "--plot", str(png)]
    cmd += ["--json", str(raw)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads(raw.read_text())
    rows = {(r["workload"], r["contender"]): r for r in result["rows"]}
    for workload in ("W1", "W2", "W3", "R"):
        assert f"{workload} limit" in {w for w, _ in rows}
        for contender in CONTENDERS:
            row = rows[(workload, contender)]
            assert row["check"].startswith("✓"), row
            assert row["ratios"] and all(r > 0 for r in row["ratios"]), row
            assert all(rnd["server_peak_rss_mb"] > 0 for rnd in row["rounds"])
    for contender in ("ours base64", "ours /v2 binary"):  # attention: no JSON floats
        assert rows[("W4", contender)]["ratios"][0] > 0
    assert ("W4", "ours JSON floats") not in rows
    for workload in ("W1", "W2", "W4"):  # gRPC, its answers checked as any other's
        row = rows[(workload, "ours gRPC")]
        assert row["check"].startswith("✓") and row["ratios"][0] > 0, row
    assert ("W3", "ours gRPC") not in rows
    if shutil.which("wrk"):  # the compiled client on W2 (the smoke run's), checked first
        for contender in CONTENDERS:
            row = rows[("W2", f"{contender}, wrk")]
            assert row["check"].startswith("✓") and row["ratios"][0] > 0, row
            assert row["rounds"][0]["loadgen_cores"] >= 0
        assert ("W1", "ours base64, wrk") not in rows
    else:
        assert any(n.startswith("wrk: skipped") for n in result["notes"])

    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nkept as it is\n")
    assert "## Against peers: `bench/peers/`" in text
    block = text[text.index("<!-- peers:begin -->") : text.index("<!-- peers:end -->")]
    for contender in CONTENDERS:
        assert f"| W1 | {contender} |" in block
    assert png.read_bytes().startswith(b"\x89PNG")


# ---------------------------------------------------------------- unit tests, no timing

W1 = next(w for w in WORKLOADS if w.key == "W1")


def _bench(seq: np.ndarray | None = None) -> Bench:
    seqs = {"W1": [seq]} if seq is not None else {}
    inputs = Inputs(seqs=seqs, texts=[], ids={})
    results = Results("t", 4, 16, rounds=3, requests=6, seconds=2.0)
    bench = Bench(Path("."), inputs, runs=1, text=False, results=results)
    if seq is not None:
        bench.reference["W1"] = [{"hidden": [seq * 2]}]
    return bench


def _rounds(row: Row, items: dict[int, float]) -> None:
    row.rounds += [{"round": r, "items_per_s": v, "p50_ms": 1.0} for r, v in items.items()]


def test_a_failed_round_does_not_shift_later_rounds() -> None:
    bench = _bench()
    _rounds(bench.row("W1 limit", "batch ×1"), {1: 100.0, 2: 200.0, 3: 400.0})
    peer = bench.row("W1", "peer")
    _rounds(peer, {1: 50.0, 3: 200.0})  # its round 2 failed
    peer.failures.append({"round": 2, "reason": "wrong answer"})
    # Paired by round id; zip(strict=False) gave [0.5, 1.0]: round 3 against round 2's limit.
    assert ratios(bench.results, W1, peer) == [0.5, 0.5]
    assert cell(ratios(bench.results, W1, peer), 3) == "0.50 (0.50–0.50) [2/3 rounds]"
    assert check_summary(peer).startswith("✗ round 2 failed")


def test_a_round_without_its_limit_is_dropped_not_paired_with_another() -> None:
    bench = _bench()
    _rounds(bench.row("W1 limit", "batch ×1"), {1: 100.0, 2: 200.0, 3: 400.0})
    _rounds(bench.row("W1 limit", "batch ×2"), {1: 100.0, 3: 800.0})  # lost in round 2
    peer = bench.row("W1", "peer")
    _rounds(peer, {1: 50.0, 2: 100.0, 3: 400.0})
    best, _ = limit_of(bench.results, W1)
    assert best == {1: 100.0, 3: 800.0}  # round 2's best would have been ×1 alone
    assert ratios(bench.results, W1, peer) == [0.5, 0.5]
    assert unpaired(bench.results, W1, peer) == [2]


class _Native(BaseHTTPRequestHandler):
    """/v1/encode answering ``answer`` to the first ``good`` requests, then ``wrong``."""

    protocol_version = "HTTP/1.1"
    answer = wrong = b""
    good = 0
    served = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        body = cls.answer if cls.served < cls.good else cls.wrong
        cls.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _InProcessLoad:
    """bench.load for a test: the load generator in this process."""

    def apply(self, fn: Any, args: tuple[Any, ...]) -> Any:
        return fn(*args)


def _native_body(array: np.ndarray) -> bytes:
    item = {"embeddings": {"shape": list(array.shape), "data": b64(array)}}
    return json.dumps({"data": [item]}).encode()


def b64(array: np.ndarray) -> str:
    import base64

    return base64.b64encode(array.astype("<f4").tobytes()).decode()


@pytest.mark.parametrize("good", [0, 3], ids=["wrong-before-timing", "wrong-under-load"])
def test_a_wrong_answer_fails_the_round_loudly(good: int, capsys: Any) -> None:
    seq = np.arange(8, dtype=np.float32).reshape(2, 4)
    bench = _bench(seq)
    bench.load = _InProcessLoad()
    _Native.answer, _Native.wrong = _native_body(seq * 2), _native_body(seq * 2 + 1e-3)
    _Native.good, _Native.served = good, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Native)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        call = native_call([seq], "base64", attention=False)
        target = Server("fake", os.getpid(), server.server_address[1], lambda w: {})
        measure_contender(bench, target, W1, "peer", [call])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    row = bench.results.rows[("W1", "peer")]
    assert row.rounds == []  # not counted
    assert row.failures == [{"round": 1, "reason": row.failures[0]["reason"]}]
    assert "max |difference| 1.00e-03 > 0.0001" in row.failures[0]["reason"]
    assert "round 1 FAILED" in capsys.readouterr().out
    assert any(n.startswith("✗ W1 peer: round 1 failed") for n in bench.results.notes)
    # good == 0: caught before timing, nothing sent beyond the check; good == 3: timed,
    # then the sample of answers received under load caught it.
    assert (_Native.served == 1) == (good == 0)


def test_right_answers_count_the_round_with_their_check() -> None:
    seq = np.arange(8, dtype=np.float32).reshape(2, 4)
    bench = _bench(seq)
    stats = check_answers(bench, W1, [(0, {"hidden": [seq * 2 + 5e-5]})])
    assert stats["checked"] == 1 and 4e-5 < stats["check_max_abs"] <= ATOL
    with pytest.raises(WrongAnswer, match="shape"):
        check_answers(bench, W1, [(0, {"hidden": [seq[:1] * 2]})])
    with pytest.raises(WrongAnswer, match="no answer"):
        check_answers(bench, W1, [])
    with pytest.raises(WrongAnswer):  # NaN is never within the tolerance
        check_answers(bench, W1, [(0, {"hidden": [seq * np.nan]})])
