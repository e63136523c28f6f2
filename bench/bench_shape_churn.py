"""Memory under shape churn: RSS while requests of random sizes and lengths arrive.

Users of embedding servers report memory that grows with every new input shape
(onnxruntime's arena). For each setting of ``ATTNSERVE_CPU_MEM_ARENA``, a fresh
server (all-MiniLM-L6-v2) takes ``--seconds`` of requests of 1-16 sequences of
8-256 tokens (base64 arrays, 2 clients); RSS is sampled every 0.1 s. Reported:
RSS after warm-up, at the end and at its highest, as ratios to the level after
warm-up, and requests per second (the arena's price when off).

    .venv/bin/python bench/bench_shape_churn.py --model-dir models --seconds 120

Writes ``bench/out/shape_churn.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
D_MODEL = 384


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def body(rng: np.random.Generator) -> dict[str, Any]:
    inputs = []
    for _ in range(int(rng.integers(1, 17))):
        n = int(rng.integers(8, 257))
        array = rng.standard_normal((n, D_MODEL)).astype("<f4")
        data = base64.b64encode(array.tobytes()).decode()
        inputs.append({"shape": [n, D_MODEL], "dtype": "float32", "data": data})
    return {"inputs": inputs, "pooling": "mean", "encoding_format": "base64"}


def churn(model_dir: Path, arena: bool, seconds: float, clients: int) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "ATTNSERVE_MODEL_REPOSITORY": str(model_dir),
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_GRPC_PORT": "0",
        # Every request computed: the cache would answer repeats (bench_cache measures it).
        "ATTNSERVE_RESPONSE_CACHE_BYTES": "0",
        "ATTNSERVE_LOG_LEVEL": "warning",
        "ATTNSERVE_CPU_MEM_ARENA": str(arena).lower(),
    }
    proc = subprocess.Popen([sys.executable, "-m", "service"], env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not become ready")
            time.sleep(0.2)
        warm = rss_mb(proc.pid)
        samples: list[float] = []
        done = [0]
        stop = time.monotonic() + seconds

        def client(seed: int) -> None:
            rng = np.random.default_rng(seed)
            with httpx.Client(base_url=url, timeout=60) as c:
                while time.monotonic() < stop:
                    r = c.post("/v1/encode", json=body(rng))
                    r.raise_for_status()
                    done[0] += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            samples.append(rss_mb(proc.pid))
            time.sleep(0.1)
        end = rss_mb(proc.pid)
        return {
            "cpu_mem_arena": arena,
            "rss_after_warmup_mb": round(warm),
            "rss_end_mb": round(end),
            "rss_max_mb": round(max(samples)),
            "end_over_warmup": round(end / warm, 2),
            "max_over_warmup": round(max(samples) / warm, 2),
            "requests_per_second": round(done[0] / seconds, 2),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "shape_churn.json")
    args = parser.parse_args(argv)
    rows = []
    for arena in (True, False):
        rows.append(churn(args.model_dir, arena, args.seconds, args.clients))
        print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| arena | RSS after warm-up | end (÷ warm-up) | highest (÷ warm-up) | requests/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {'on' if r['cpu_mem_arena'] else 'off'} | {r['rss_after_warmup_mb']} MB "
            f"| {r['rss_end_mb']} MB (×{r['end_over_warmup']}) "
            f"| {r['rss_max_mb']} MB (×{r['max_over_warmup']}) | {r['requests_per_second']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
