"""What the response cache gives on a workload with repeats, against the cache off, in
the same run (the machine is shared: ratios, not absolute numbers).

A re-indexing-like workload: ``--requests`` OpenAI embedding requests of
``--batch`` texts each, drawn with a Zipf law (``--skew``) from ``--distinct``
distinct batches, sent by ``--clients`` concurrent clients to MiniLM, once with
``ATTNSERVE_RESPONSE_CACHE_BYTES=0`` and once with each size of ``--sizes``.
Every answer is checked against the cache-off answer of the same batch (the
cache must change no number). Reports requests/s, the ratio to cache off, the
hit rate and the cache's bytes.

    .venv/bin/python bench/bench_cache.py --model-dir models/minilm-l6
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import running_server

WORDS = (
    *("river", "bank", "money", "loan", "water", "stream", "account", "deposit", "flood"),
    *("bridge", "boat", "credit", "fish", "interest", "rate", "current", "flow", "branch"),
    *("teller", "vault", "shore"),
)


def batches(distinct: int, batch: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [
        [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 24)))) for _ in range(batch)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=Path("models/minilm-l6"))
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--distinct", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--skew", type=float, default=1.3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--sizes", default="1,16,64", help="cache sizes in MiB")
    args = parser.parse_args()
    texts = batches(args.distinct, args.batch)
    order = schedule(args.requests, args.distinct, args.skew)
    print(
        f"{args.requests} requests of {args.batch} texts, {len(set(order))} distinct batches "
        f"(Zipf {args.skew}), {args.clients} clients"
    )
    reference: dict[int, list[list[float]]] = {}
    baseline = 0.0
    for size in [0, *(int(s) for s in args.sizes.split(","))]:
        with running_server(
            args.model_dir, RESPONSE_CACHE_BYTES=str(size * 2**20), RESPONSE_CACHE_SHARED="true"
        ) as port:
            seconds, answers, hits = asyncio.run(run_load(port, texts, order, args.clients))
            held = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        cache_bytes = next(
            (float(line.split()[-1]) for line in held.splitlines()
             if line.startswith("attnserve_response_cache_bytes ")), 0.0,
        )  # fmt: skip
        if size == 0:
            reference, baseline = answers, args.requests / seconds
        for index, vectors in answers.items():  # the cache changes no number
            np.testing.assert_allclose(vectors, reference[index], rtol=0, atol=1e-6)
        rate = args.requests / seconds
        print(
            f"cache {size:>3} MiB: {rate:7.1f} req/s  x{rate / baseline:5.2f} vs off  "
            f"hits {hits / args.requests:6.1%}  held {cache_bytes / 2**20:6.2f} MiB"
        )


if __name__ == "__main__":
    main()
