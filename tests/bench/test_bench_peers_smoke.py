"""Smoke run of bench/bench_peers.py: ours and in-process onnxruntime on the tiny model.

The real benchmark is run by hand (peers need their own venvs and minutes of
CPU); this proves the command, its numerical check and its report still work,
without timing anything against a target.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTENDERS = ("ours JSON floats", "ours base64", "ours /v2 binary")


def test_smoke_run_reports_every_row(tiny_model_dir: Path, tmp_path: Path) -> None:
    doc, png, raw = tmp_path / "benchmarks.md", tmp_path / "peers.png", tmp_path / "peers.json"
    doc.write_text("# Benchmarks\n\nkept as it is\n")
    cmd = [sys.executable, str(ROOT / "bench" / "bench_peers.py"), "--smoke"]
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

    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nkept as it is\n")
    assert "## Against peers: `bench/bench_peers.py`" in text
    block = text[text.index("<!-- peers:begin -->") : text.index("<!-- peers:end -->")]
    for contender in CONTENDERS:
        assert f"| W1 | {contender} |" in block
    assert png.read_bytes().startswith(b"\x89PNG")
