"""PSS per extra session, with and without the session cache (service/prepacked_cache.py).

A fresh process opens a model's sessions 1, 2 and 3 times (each a ``ModelRuntime``,
as one more set of lane sessions would), runs each once on the embeddings graph and
reads its PSS from /proc/self/smaps_rollup. Without the cache each pre-packed graph
packs a private copy per session; with it every session maps the one pre-packed
file. Not a timed test: one line per setting, and the process's wall time
with a cold cache (the entries made), a warm one and none. Last, what the
lanes' own sessions add (service/lane_sessions.py): one runtime with two intra-op
threads and two lanes, warmed up (every session run once), with
``ATTNSERVE_LANE_SESSIONS`` off and on the cache.

    .venv/bin/python -m bench.session_cache_memory --model-dir models/minilm-l6
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.models import DEFAULT_MODEL_DIR
from bench.memory import MiB, smaps

COUNTS = (1, 2, 3)
LANES = 2


def child(model_dir: Path, cache: str, count: int, lane_sessions: str = "") -> None:
    """In this process: ``count`` runtimes of ``model_dir``, one run each; print PSS.
    With ``lane_sessions``: one runtime, two threads and two lanes, warmed up."""
    import os

    from model_export import graph_io
    from service.repository import latest
    from service.runtime import open_version, pad, read_version
    from service.settings import Settings

    settings = Settings(
        model_repository=model_dir.parent,
        session_cache_dir=cache,
        intra_op_threads=2 if lane_sessions else 1,
        inference_lanes=LANES,
        lane_sessions=lane_sessions or "off",
    )
    found = latest(model_dir)
    assert found is not None, model_dir
    info = read_version(found, settings)
    runtimes = [open_version(info, settings) for _ in range(count)]
    if lane_sessions:
        runtimes[0].warmup()  # every graph on each of its sessions
    graph = graph_io.GRAPH_EMBEDDINGS
    for runtime in runtimes:
        batch, mask = pad([runtime.sample_sequence(graph, 16)])
        runtime.run(batch, mask, graph)
    print(smaps(os.getpid())["pss"])


def measure(model_dir: Path, cache: str, count: int, lane_sessions: str = "") -> int:
    args = [sys.executable, "-m", "bench.session_cache_memory", "--model-dir", str(model_dir)]
    args += ["--child", str(count), "--cache", cache, "--lane-sessions", lane_sessions]
    done = subprocess.run(args, check=True, capture_output=True, text=True)
    return int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cache", default="", help=argparse.SUPPRESS)
    parser.add_argument("--lane-sessions", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model_dir, args.cache, args.child, args.lane_sessions)
        return
    with tempfile.TemporaryDirectory(prefix="attnserve-sessions-") as cache:
        starts = {}
        for label, where in (("cold cache", cache), ("warm cache", cache), ("no cache", "")):
            began = time.perf_counter()
            measure(args.model_dir, where, 1)  # the cold start makes the entries
            starts[label] = time.perf_counter() - began
        said = ", ".join(f"{label} {seconds:.1f} s" for label, seconds in starts.items())
        print(f"one runtime's process, start to first run: {said}")
        for label, where in (("without the cache", ""), ("with the cache", cache)):
            pss = [measure(args.model_dir, where, n) / MiB for n in COUNTS]
            extra = (pss[-1] - pss[0]) / (len(COUNTS) - 1)
            cells = ", ".join(f"{n}: {p:,.0f} MiB" for n, p in zip(COUNTS, pss, strict=True))
            print(f"PSS {label} (sessions {cells}): +{extra:,.0f} MiB per extra session")
        off, on = (measure(args.model_dir, cache, 1, chosen) / MiB for chosen in ("off", "on"))
        print(
            f"PSS of one runtime, {LANES} lanes over 2 threads, warmed up, with the cache: "
            f"lane sessions off {off:,.0f} MiB, on {on:,.0f} MiB "
            f"(+{(on - off) / LANES:,.0f} MiB per lane's set of sessions)"
        )


if __name__ == "__main__":
    main()
