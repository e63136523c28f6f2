"""Unbounded tokenizing (issue 44, item 3): huge texts against one real server.

One server (``python -m service``, all-MiniLM-L6-v2) on 127.0.0.1. Measured:

- three concurrent ``/v1/encode {"inputs": ["x" * 30_000_000], "truncate": true}``:
  each one's status and seconds, and the server's peak RSS meanwhile;
- a 2,048-text pooled ``/v1/encode`` sent 0.5 s behind them: its status and seconds (the
  server's deadline is its default, 60 s);
- a 10 MB unbroken text on ``/v1/explain/similarity``: status and seconds.

    .venv/bin/python -m bench.hardening.tokenize [--model-dir models/minilm-l6]

Without ``--model-dir`` (and no exported ``models/minilm-l6``), MiniLM is exported to a
temporary folder first (~1-2 min). Writes ``bench/out/hardening_tokenize.json``. The
machine is shared: seconds are indicative, RSS is the figure to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.lib.models import DEFAULT_MODEL_DIR, OUT
from bench.lib.procs import process_tree, vm_rss
from bench.lib.results import write_json
from bench.lib.server import running_server

HUGE_CHARS = 30_000_000
EXPLAIN_CHARS = 10_000_000
BEHIND_TEXTS = 2048
TIMEOUT = httpx.Timeout(600.0)


@contextmanager
def minilm_dir(given: Path | None) -> Iterator[Path]:
    """The model directory asked for, models/minilm-l6, or MiniLM exported to a temp dir."""
    if given is not None:
        yield given
        return
    if (DEFAULT_MODEL_DIR / "config.json").exists():
        yield DEFAULT_MODEL_DIR
        return
    from model_export.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "minilm-l6"
        assert main(["--preset", "minilm-l6", "--out", str(out), "--no-compact-attention"]) == 0
        yield out


class PeakRss:
    """The largest RSS of a process tree, sampled every 50 ms while running."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            total = sum(vm_rss(p) or 0 for p in process_tree(self.pid))
            self.peak = max(self.peak, total)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


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
        idle = sum(vm_rss(p) or 0 for p in process_tree(pid))
        with PeakRss(pid) as rss:
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, probe it, return the figures."""
    with minilm_dir(args.model_dir) as model_dir, running_server(model_dir) as served:
        return asyncio.run(_probe(served.url, served.pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT / "hardening_tokenize.json")
    args = parser.parse_args()
    result = run(args)
    write_json(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
