"""Starvation probe: how long a one-text request waits behind large pooled requests.

One real server (``python -m service``, all-MiniLM-L6-v2) on 127.0.0.1. For each
count in ``--large`` (1, 2, 4, 8), that many maximum-size pooled requests are
sent at once (``/v1/embeddings``, 2,048 texts of ~126 tokens each: the default
``ATTNSERVE_MAX_POOLED_SEQUENCES`` and just under ``ATTNSERVE_MAX_POOLED_TOKENS``);
once they are queued, a one-text request is sent every ``--interval`` seconds
for ``--seconds`` seconds (open loop: each on its own, whatever the others
wait), and their latencies are reported (p50, p99, max). Then the large
requests are abandoned (their connections closed: the server drops their
queued work) and the server drains before the next count. The probe server
has ``ATTNSERVE_REQUEST_TIMEOUT=600`` so the large requests are admitted and
run for the whole window; the deadline check is measured separately.

The deadline check: one large request alone on the idle server with
``X-Request-Timeout: 18`` (the issue's probe): its status, the seconds to its
answer and the message. Work sure to miss its deadline should be refused at
once, not run to a 504.

    .venv/bin/python -m bench.starvation --model-dir models/minilm-l6

Writes ``bench/out/starvation.json`` and prints a markdown table rendered from it. The machine is
shared: the numbers are absolute latencies, only comparable within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.models import DEFAULT_MODEL_DIR, OUT
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_server
from bench.lib.workloads import ONE_TOKEN_WORDS

SHORT = {"model": "minilm-l6", "input": ["A short sentence to embed."]}


def large_body(texts: int, words: int, seed: int) -> bytes:
    """A pooled request of ``texts`` texts of ``words`` one-token words (+[CLS], [SEP])."""
    rng = np.random.default_rng(seed)
    inputs = [" ".join(rng.choice(ONE_TOKEN_WORDS, size=words)) for _ in range(texts)]
    return json.dumps({"model": "minilm-l6", "input": inputs}).encode()


def _metric(text: str, name: str) -> float:
    return next(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")),
        0.0,
    )


async def _drained(http: httpx.AsyncClient, timeout: float = 120) -> None:
    """Wait until the server holds no request (abandoned ones dropped), plus a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = (await http.get("/metrics")).text
        if _metric(metrics, "attnserve_in_flight_requests") <= 0:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)


async def probe(
    port: int, large: int, bodies: list[bytes], seconds: float, interval: float, settle: float
) -> dict[str, Any]:
    """Short-request latencies (ms) while ``large`` large requests are in progress."""
    base = f"http://127.0.0.1:{port}"
    big_clients = [httpx.AsyncClient(base_url=base, timeout=None) for _ in range(large)]
    headers = {"content-type": "application/json"}
    began = time.monotonic()
    big = [
        asyncio.create_task(c.post("/v1/embeddings", content=body, headers=headers))
        for c, body in zip(big_clients, bodies, strict=False)
    ]
    async with httpx.AsyncClient(base_url=base, timeout=None) as http:
        await asyncio.sleep(settle)  # read, tokenized and queued

        async def short() -> tuple[float, int]:
            start = time.perf_counter()
            answer = await http.post("/v1/embeddings", json=SHORT)
            return (time.perf_counter() - start) * 1000, answer.status_code

        shorts = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            shorts.append(asyncio.create_task(short()))
            await asyncio.sleep(interval)
        answers = await asyncio.gather(*shorts)
        finished = [t.result().status_code for t in big if t.done() and not t.exception()]
        for task in big:
            task.cancel()
        await asyncio.gather(*big, return_exceptions=True)
        for client in big_clients:
            await client.aclose()
        await _drained(http)
    latencies = sorted(ms for ms, _ in answers)
    return {
        "large_requests": large,
        "short_requests": len(answers),
        "short_statuses": sorted({status for _, status in answers}),
        "p50_ms": statistics.median(latencies),
        "p99_ms": float(np.percentile(latencies, 99)),
        "max_ms": latencies[-1],
        "large_answered_in_window": finished,
        "window_s": time.monotonic() - began,
    }


async def deadline_check(port: int, body: bytes, timeout: float) -> dict[str, Any]:
    """One large request alone with ``X-Request-Timeout: timeout``: status, seconds, message."""
    headers = {"content-type": "application/json", "x-request-timeout": f"{timeout:g}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=None) as http:
        await _drained(http)
        start = time.perf_counter()
        answer = await http.post("/v1/embeddings", content=body, headers=headers)
        seconds = time.perf_counter() - start
    error = {} if answer.status_code == 200 else answer.json().get("error", {})
    message = error.get("message", "") if isinstance(error, dict) else error  # OpenAI's shape
    return {
        "timeout_s": timeout,
        "status": answer.status_code,
        "seconds": seconds,
        "retry_after": answer.headers.get("retry-after"),
        "message": message,
    }


def render(results: dict[str, Any]) -> str:
    check = results["deadline_check"]
    return "\n".join(
        [
            f"one-text request every {results['interval']:g} s for {results['seconds']:g} s "
            f"behind large pooled requests of {results['texts']} texts x "
            f"{results['words'] + 2} tokens "
            f"(ATTNSERVE_MAX_BATCH_TOKENS={results['batch_tokens']})\n",
            table(
                ["large requests", "short requests", "p50 ms", "p99 ms", "max ms"],
                [
                    [
                        r["large_requests"],
                        r["short_requests"],
                        f"{r['p50_ms']:.0f}",
                        f"{r['p99_ms']:.0f}",
                        f"{r['max_ms']:.0f}",
                    ]
                    for r in results["rows"]
                ],
            ),
            f"\none large request alone, X-Request-Timeout {check['timeout_s']:g}: "
            f"{check['status']} after {check['seconds']:.2f} s "
            f"(Retry-After {check['retry_after']}): {check['message']}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--large", default="1,2,4,8", help="counts of large requests")
    parser.add_argument("--texts", type=int, default=2048, help="texts per large request")
    parser.add_argument("--words", type=int, default=124, help="words per text (~+2 tokens)")
    parser.add_argument("--seconds", type=float, default=12.0, help="probe window per count")
    parser.add_argument("--interval", type=float, default=0.25, help="between short requests")
    parser.add_argument("--settle", type=float, default=3.0, help="before the first probe")
    parser.add_argument("--deadline", type=float, default=18.0, help="the deadline check's")
    parser.add_argument(
        "--batch-tokens", default="4096", help="ATTNSERVE_MAX_BATCH_TOKENS: one run's most"
    )
    parser.add_argument("--out", type=Path, default=OUT / "starvation.json")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.large.split(",")]
    bodies = [large_body(args.texts, args.words, seed) for seed in range(max(counts))]
    rows = []
    settings = {"REQUEST_TIMEOUT": "600", "MAX_BATCH_TOKENS": args.batch_tokens}
    with running_server(args.model_dir, **settings) as server:
        for large in counts:
            window = probe(server.port, large, bodies, args.seconds, args.interval, args.settle)
            rows.append(asyncio.run(window))
            print(f"{large} large: p99 {rows[-1]['p99_ms']:.0f} ms", file=sys.stderr)
    with running_server(args.model_dir) as server:
        check = asyncio.run(deadline_check(server.port, bodies[0], args.deadline))
    results = {
        "texts": args.texts,
        "words": args.words,
        "batch_tokens": int(args.batch_tokens),
        "seconds": args.seconds,
        "interval": args.interval,
        "rows": rows,
        "deadline_check": check,
    }
    write_json(args.out, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
