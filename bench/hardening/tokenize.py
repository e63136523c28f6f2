"""Unbounded tokenizing (issue 44, item 3): huge texts against one real server.

One server (``python -m service``, all-MiniLM-L6-v2) on 127.0.0.1. Measured:

- three concurrent ``/v1/encode {"inputs": ["x" * 30_000_000], "truncate": true}``:
  each one's status and seconds, and the server's peak RSS meanwhile;
- a 2,048-text pooled ``/v1/encode`` sent 0.5 s behind them: its status and seconds (the
  server's deadline is its default, 60 s);
- a 10 MB unbroken text on ``/v1/explain/similarity``: status and seconds.

    .venv/bin/python -m bench.hardening.tokenize [--model-dir models/minilm-l6]

``python -m bench.hardening`` runs it with the other items, before and after. Writes
``bench/out/hardening_tokenize.json``. The machine is shared: seconds are indicative,
RSS is the figure to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lib.models import DEFAULT_MODEL_DIR, OUT, ROOT
from bench.lib.procs import Sampler, cpu_and_rss, process_tree
from bench.lib.results import write_json
from bench.lib.server import running_checkout

HUGE_CHARS = 30_000_000
EXPLAIN_CHARS = 10_000_000
BEHIND_TEXTS = 2048
TIMEOUT = httpx.Timeout(600.0)


async def _timed(client: httpx.AsyncClient, path: str, body: bytes) -> dict[str, Any]:
    began = time.monotonic()
    answer = await client.post(path, content=body, headers={"Content-Type": "application/json"})
    seconds = round(time.monotonic() - began, 2)
    error = answer.json().get("error") if answer.status_code >= 400 else None
    return {"status": answer.status_code, "seconds": seconds, "error": error}


async def _probe(url: str, pid: int) -> dict[str, Any]:
    huge = json.dumps({"inputs": ["x" * HUGE_CHARS], "truncate": True}).encode()
    texts = [f"text number {i}" for i in range(BEHIND_TEXTS)]
    behind = json.dumps({"inputs": texts, "pooling": "mean"}).encode()
    explain = json.dumps({"query": "x" * EXPLAIN_CHARS, "documents": ["a document"]}).encode()
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        idle = cpu_and_rss(process_tree(pid))[1]
        with Sampler(pid) as rss:
            bigs = [asyncio.create_task(_timed(client, "/v1/encode", huge)) for _ in range(3)]
            await asyncio.sleep(0.5)
            after = await _timed(client, "/v1/encode", behind)
            concurrent = await asyncio.gather(*bigs)
        explained = await _timed(client, "/v1/explain/similarity", explain)
    return {
        "idle_rss_mb": round(idle / 1e6),
        "peak_rss_mb": round(rss.peak / 1e6),
        "huge_truncated": concurrent,
        "behind": after,
        "explain_10mb": explained,
    }


def run(service_root: Path, model_dir: Path) -> dict[str, Any]:
    """Serve ``model_dir`` with ``service_root``'s server, probe it, return the figures."""
    with running_checkout(service_root, model_dir.parent, DEFAULT_MODEL=model_dir.name) as served:
        return asyncio.run(_probe(served.url, served.pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--out", type=Path, default=OUT / "hardening_tokenize.json")
    args = parser.parse_args()
    result = run(ROOT, args.model_dir)
    write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
