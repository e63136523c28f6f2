"""The response cache's real memory: process RSS over rounds of view-pinning traffic,
against the cache's own byte gauge (issue 37: entries that were views of a whole
run's output kept the run alive, ~30x the bound).

Each round sends, while a run of the attention graph keeps the inference thread
busy, a keeper (one text of ``--tokens`` tokens, every attention map) and a mate
(``--batch`` - 1 texts of the same length, small rollout answers): they queue
together and share one run, so the keeper's maps are a row of the run's
[batch, L, H, n, n] output. Kept as that view, one ~1.2 MB entry (MiniLM, 64
tokens) would keep a ~75 MB run alive. Reports RSS after the warm-up and after
each round (the median of the last three, against that of the last three warm-up
rounds: the allocator's transient peaks and dips aside),
the gauge, and growth against the target: at most the bound + 10%.

    .venv/bin/python -m bench.cache_rss --model-dir models/minilm-l6

Writes ``bench/out/cache_rss.json`` and prints a report rendered from it.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.models import DEFAULT_MODEL_DIR, OUT
from bench.lib.procs import vm_rss
from bench.lib.results import write_json
from bench.lib.server import running_server
from bench.lib.workloads import BANK_WORDS

MiB = 2**20


def rss(pid: int) -> int:
    """The server's RSS in bytes (it must be alive)."""
    value = vm_rss(pid)
    if value is None:
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return value


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` carrying ``labels`` on /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def texts(rng: np.random.Generator, count: int, tokens: int) -> list[str]:
    """``count`` texts of ``tokens`` tokens each ([CLS] and [SEP] included: one-token words)."""
    return [" ".join(rng.choice(BANK_WORDS, size=tokens - 2)) for _ in range(count)]


def post(url: str, body: dict[str, object]) -> None:
    answer = httpx.post(f"{url}/v1/encode", json=body, timeout=120)
    answer.raise_for_status()


def pinning_round(url: str, seed: int, batch: int, tokens: int) -> bool:
    """One round; whether the keeper shared its run (no run of a lone sequence)."""
    rng = np.random.default_rng(seed)
    alone = metric(url, "attnserve_batch_sequences_bucket", le="1.0")
    started = metric(url, "attnserve_queue_seconds_count")
    rollout = {"return_attention": True, "attention": {"reduce": "rollout"}}
    small = {"return_embeddings": False, "encoding_format": "base64", **rollout}
    # Pooled only (little memory), four times the keeper's length: runs to queue behind.
    blocker = {"inputs": texts(rng, batch, 4 * tokens), "pooling": "mean"}
    sent = [threading.Thread(target=post, args=(url, blocker))]
    sent[0].start()
    deadline = time.monotonic() + 60
    while metric(url, "attnserve_queue_seconds_count") <= started and time.monotonic() < deadline:
        time.sleep(0.02)
    mate = {"inputs": texts(rng, batch - 1, tokens), **small}
    sent.append(threading.Thread(target=post, args=(url, mate)))
    sent[-1].start()
    while metric(url, "attnserve_queued_requests") < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the mate queued behind the blocker's run: the keeper joins it
    keeper = {"inputs": texts(rng, 1, tokens), "return_attention": True}
    post(url, {**keeper, "encoding_format": "base64"})
    for thread in sent:
        thread.join()
    return metric(url, "attnserve_batch_sequences_bucket", le="1.0") == alone


def render(results: dict[str, Any]) -> str:
    bound, rounds = results["cache_mib"] * MiB, results["rounds"]
    start = results["rss_start"]
    lines = [f"cache bound {results['cache_mib']} MiB; RSS after warm-up {start / MiB:.0f} MiB"]
    for r, (rss_, gauge) in enumerate(zip(rounds["rss"], rounds["gauge"], strict=True), 1):
        lines.append(f"round {r:2}: RSS {rss_ / MiB:7.0f} MiB  gauge {gauge / MiB:6.1f} MiB")
    grown = statistics.median(rounds["rss"][-3:]) - start
    verdict = "met" if grown <= 1.1 * bound else "NOT met"
    lines.append(
        f"{results['shared']}/{len(rounds['rss'])} rounds shared a run; RSS grew "
        f"{grown / MiB:.0f} MiB (median of the last three rounds, against the warm-up's), "
        f"target <= {1.1 * bound / MiB:.0f} MiB: {verdict}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="sequences in the shared run")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--warm-up", type=int, default=5, help="rounds before the baseline")
    parser.add_argument("--out", type=Path, default=OUT / "cache_rss.json")
    args = parser.parse_args(argv)
    bound = args.cache_mib * MiB
    # One tenant, no API key: the cache must be told it may be shared to be on at all.
    cache = {"RESPONSE_CACHE_BYTES": str(bound), "RESPONSE_CACHE_SHARED": "true"}
    with running_server(args.model_dir, **cache) as server:
        url, pid = server.url, server.pid
        at_rest = []
        for seed in range(10_000, 10_000 + args.warm_up):  # the allocator's and arenas' plateau
            pinning_round(url, seed, args.batch, args.tokens)
            at_rest.append(rss(pid))
        start = statistics.median(at_rest[-3:])  # as the end: transient peaks and dips aside
        print(f"RSS after warm-up {start / MiB:.0f} MiB", flush=True)
        shared, rounds = 0, {"rss": list[float](), "gauge": list[float]()}
        for r in range(1, args.rounds + 1):
            shared += pinning_round(url, r, args.batch, args.tokens)
            rounds["rss"].append(rss(pid))
            rounds["gauge"].append(metric(url, "attnserve_response_cache_bytes"))
            print(f"round {r:2}: RSS {rounds['rss'][-1] / MiB:7.0f} MiB", flush=True)
    results = {
        "cache_mib": args.cache_mib,
        "batch": args.batch,
        "tokens": args.tokens,
        "rss_start": start,
        "shared": shared,
        "rounds": rounds,
    }
    write_json(args.out, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
