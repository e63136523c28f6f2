"""What the response cache gives on a workload with repeats, against the cache off, in
the same run (the machine is shared: ratios, not absolute numbers).

A re-indexing-like workload: ``--requests`` OpenAI embedding requests of
``--batch`` texts each, drawn with a Zipf law (``--skew``) from ``--distinct``
distinct batches, sent by ``--clients`` concurrent clients to MiniLM, once with
``ATTNSERVE_RESPONSE_CACHE_BYTES=0`` and once with each size of ``--sizes``.
Every answer is checked against the cache-off answer of the same batch (the
cache must change no number). Reports requests/s, the ratio to cache off, the
hit rate and the cache's bytes.

    .venv/bin/python -m bench.cache --model-dir models/minilm-l6

Writes ``bench/out/cache.json`` and prints a report rendered from it.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.models import DEFAULT_MODEL_DIR, OUT
from bench.lib.results import write_json
from bench.lib.server import running_server
from bench.lib.workloads import BANK_WORDS


def batches(distinct: int, batch: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [
        [" ".join(rng.choice(BANK_WORDS, size=int(rng.integers(6, 24)))) for _ in range(batch)]
        for _ in range(distinct)
    ]


def schedule(requests: int, distinct: int, skew: float, seed: int = 1) -> list[int]:
    """Which batch each request sends: Zipf ranks folded into ``distinct``."""
    rng = np.random.default_rng(seed)
    return [int(r - 1) % distinct for r in rng.zipf(skew, size=requests)]


async def run_load(
    port: int, texts: list[list[str]], order: list[int], clients: int
) -> tuple[float, dict[int, list[list[float]]], int]:
    """Seconds, one answer per batch index, hits seen."""
    queue = list(order)
    answers: dict[int, list[list[float]]] = {}
    hits = 0

    async def client() -> None:
        nonlocal hits
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            while queue:
                index = queue.pop()
                body = {"model": "minilm-l6", "input": texts[index]}
                answer = await http.post("/v1/embeddings", json=body)
                answer.raise_for_status()
                hits += answer.headers.get("x-cache") == "hit"
                answers.setdefault(index, [d["embedding"] for d in answer.json()["data"]])

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start, answers, hits


def render(results: dict[str, Any]) -> str:
    lines = [
        f"{results['requests']} requests of {results['batch']} texts, "
        f"{results['distinct_sent']} distinct batches (Zipf {results['skew']}), "
        f"{results['clients']} clients"
    ]
    baseline = results["rows"][0]["requests_per_s"]
    for r in results["rows"]:
        rate = r["requests_per_s"]
        lines.append(
            f"cache {r['cache_mib']:>3} MiB: {rate:7.1f} req/s  x{rate / baseline:5.2f} vs off  "
            f"hits {r['hit_rate']:6.1%}  held {r['held_bytes'] / 2**20:6.2f} MiB"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--distinct", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--skew", type=float, default=1.3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--sizes", default="1,16,64", help="cache sizes in MiB")
    parser.add_argument("--out", type=Path, default=OUT / "cache.json")
    args = parser.parse_args(argv)
    texts = batches(args.distinct, args.batch)
    order = schedule(args.requests, args.distinct, args.skew)
    reference: dict[int, list[list[float]]] = {}
    rows = []
    for size in [0, *(int(s) for s in args.sizes.split(","))]:
        with running_server(
            args.model_dir, RESPONSE_CACHE_BYTES=str(size * 2**20), RESPONSE_CACHE_SHARED="true"
        ) as server:
            seconds, answers, hits = asyncio.run(run_load(server.port, texts, order, args.clients))
            held = httpx.get(f"{server.url}/metrics").text
        cache_bytes = next(
            (float(line.split()[-1]) for line in held.splitlines()
             if line.startswith("attnserve_response_cache_bytes ")), 0.0,
        )  # fmt: skip
        if size == 0:
            reference = answers
        for index, vectors in answers.items():  # the cache changes no number
            np.testing.assert_allclose(vectors, reference[index], rtol=0, atol=1e-6)
        rows.append(
            {
                "cache_mib": size,
                "requests_per_s": args.requests / seconds,
                "hit_rate": hits / args.requests,
                "held_bytes": cache_bytes,
            }
        )
        print(f"cache {size} MiB: {args.requests / seconds:.1f} req/s", flush=True)
    results = {
        "requests": args.requests,
        "batch": args.batch,
        "distinct_sent": len(set(order)),
        "skew": args.skew,
        "clients": args.clients,
        "rows": rows,
    }
    write_json(args.out, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
