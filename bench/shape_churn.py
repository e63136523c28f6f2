"""Memory under shape churn: RSS while requests of random sizes and lengths arrive.

Users of embedding servers report memory that grows with every new input shape
(onnxruntime's arena). For each setting of ``ATTNSERVE_CPU_MEM_ARENA``, a fresh
server (all-MiniLM-L6-v2) takes ``--seconds`` of requests of 1-16 sequences of
8-256 tokens (base64 arrays, 2 clients); RSS is sampled every 0.1 s. Reported:
RSS after warm-up, at the end and at its highest, as ratios to the level after
warm-up, and requests per second (the arena's price when off).

    .venv/bin/python -m bench.shape_churn --model-dir models --seconds 120

Writes ``bench/out/shape_churn.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import base64
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.models import MODELS, OUT
from bench.lib.procs import vm_rss
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_repository

D_MODEL = 384


def rss_mb(pid: int) -> float:
    """The server's RSS in MiB (0 once it is gone)."""
    return (vm_rss(pid) or 0) / 2**20


def body(rng: np.random.Generator) -> dict[str, Any]:
    inputs = []
    for _ in range(int(rng.integers(1, 17))):
        n = int(rng.integers(8, 257))
        array = rng.standard_normal((n, D_MODEL)).astype("<f4")
        data = base64.b64encode(array.tobytes()).decode()
        inputs.append({"shape": [n, D_MODEL], "dtype": "float32", "data": data})
    return {"inputs": inputs, "pooling": "mean", "encoding_format": "base64"}


def churn(repository: Path, arena: bool, seconds: float, clients: int) -> dict[str, Any]:
    with running_repository(repository, CPU_MEM_ARENA=str(arena).lower()) as server:
        url, pid = server.url, server.pid
        warm = rss_mb(pid)
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
            samples.append(rss_mb(pid))
            time.sleep(0.1)
        end = rss_mb(pid)
    return {
        "cpu_mem_arena": arena,
        "rss_after_warmup_mb": round(warm),
        "rss_end_mb": round(end),
        "rss_max_mb": round(max(samples)),
        "end_over_warmup": round(end / warm, 2),
        "max_over_warmup": round(max(samples) / warm, 2),
        "requests_per_second": round(done[0] / seconds, 2),
    }


def render(rows: list[dict[str, Any]]) -> str:
    return table(
        ["arena", "RSS after warm-up", "end (÷ warm-up)", "highest (÷ warm-up)", "requests/s"],
        [
            [
                "on" if r["cpu_mem_arena"] else "off",
                f"{r['rss_after_warmup_mb']} MB",
                f"{r['rss_end_mb']} MB (×{r['end_over_warmup']})",
                f"{r['rss_max_mb']} MB (×{r['max_over_warmup']})",
                r["requests_per_second"],
            ]
            for r in rows
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, default=MODELS, help="the model repository served (all of it)"
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT / "shape_churn.json")
    args = parser.parse_args(argv)
    rows = []
    for arena in (True, False):
        rows.append(churn(args.model_dir, arena, args.seconds, args.clients))
        print(json.dumps(rows[-1]), flush=True)
    write_json(args.out, rows)
    print("\n" + render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
