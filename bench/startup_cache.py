"""Start-up time with a cold session cache, a warm one and none (service/prepacked_cache.py).

Each start is ``python -m service`` in a process of its own, timed from before the
process starts until ``/health/ready`` first answers 200 (models loaded, warmed up and
calibrated), with every other setting at its default. *Cold*: an empty cache directory,
so every pre-packed graph's optimised form is made; *warm*: the directory a first,
uncounted start filled, so each entry is checked and reused; *none*: the cache off, each
session packing its own weights. Two times per start: until its models are loaded
(``/v1/models`` answers 200: files hashed and sessions opened, where the cache works)
and until it is ready (warm-up and calibration too). The three alternate, round by
round, so a drift of the machine's speed falls on each alike; the medians and the ratio
cold / warm are printed. Not a timed test.

    .venv/bin/python -m bench.startup_cache --model-dir models/minilm-l6 --rounds 5

``--once cold|warm|none`` makes one start and prints its two times (``--cache DIR`` is
the warm directory): for timing the whole process from outside.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.lib.models import DEFAULT_MODEL_DIR
from bench.lib.server import free_port, http_status, running_server

KINDS = ("cold", "warm", "none")


def start_seconds(model_dir: Path, cache: str) -> tuple[float, float]:
    """From before the server's process starts until its models are loaded (``/v1/models``
    answers 200: files hashed, sessions opened, where the cache works) and until it is
    ready; then it is stopped."""
    port = free_port()
    up: list[float] = []
    began = time.perf_counter()

    def watch() -> None:  # /v1/models answers 503 until the models are loaded
        while http_status(f"http://127.0.0.1:{port}/v1/models") != 200:
            time.sleep(0.02)
        up.append(time.perf_counter() - began)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with running_server(model_dir, session_cache_dir=cache, port=str(port)):
        ready = time.perf_counter() - began
    watcher.join()
    return up[0], ready


def once(model_dir: Path, kind: str, warm: Path) -> tuple[float, float]:
    if kind == "cold":
        with tempfile.TemporaryDirectory(prefix="attnserve-cold-") as empty:
            return start_seconds(model_dir, str(Path(empty) / "sessions"))
    return start_seconds(model_dir, str(warm) if kind == "warm" else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--once", choices=KINDS, help="one start of this kind")
    parser.add_argument("--cache", type=Path, help="the warm cache directory (with --once)")
    args = parser.parse_args()
    if args.once:
        warm = args.cache or Path(tempfile.gettempdir()) / "attnserve-warm-sessions"
        up, ready = once(args.model_dir, args.once, warm)
        print(f"models loaded {up:.3f} s, ready {ready:.3f} s")
        return
    with tempfile.TemporaryDirectory(prefix="attnserve-warm-") as root:
        warm = Path(root) / "sessions"
        start_seconds(args.model_dir, str(warm))  # fills it; not counted
        seconds: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                seconds[kind].append(once(args.model_dir, kind, warm))
    for i, phase in enumerate(("models loaded", "ready (warmed up, calibrated)")):
        median = {kind: statistics.median(s[i] for s in found) for kind, found in seconds.items()}
        for kind in KINDS:
            cells = ", ".join(f"{s[i]:.2f}" for s in seconds[kind])
            print(f"start to {phase}, {kind} cache: median {median[kind]:.2f} s ({cells})")
        print(
            f"  cold / warm {median['cold'] / median['warm']:.2f}, "
            f"none / warm {median['none'] / median['warm']:.2f}"
        )
    print(f"({args.rounds} rounds, {args.model_dir.name})")


if __name__ == "__main__":
    main()
