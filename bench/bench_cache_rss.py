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

    .venv/bin/python bench/bench_cache_rss.py --model-dir models/minilm-l6
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cache import WORDS
from bench_serving import ROOT, _wait_ready, free_port

MiB = 2**20


@contextmanager
def served(model_dir: Path, **settings: str) -> Iterator[tuple[str, int]]:
    """``python -m service`` on ``model_dir``: its base URL and process id."""
    port = free_port()
    env = {
        **os.environ,
        "ATTNSERVE_MODEL_REPOSITORY": str(model_dir.parent),
        "ATTNSERVE_DEFAULT_MODEL": model_dir.name,
        "ATTNSERVE_HOST": "127.0.0.1",
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_GRPC_PORT": "0",
        "ATTNSERVE_LOG_LEVEL": "warning",
        **{f"ATTNSERVE_{k}": v for k, v in settings.items()},
    }
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        try:
            _wait_ready(port, server)
            yield f"http://127.0.0.1:{port}", server.pid
        finally:
            server.terminate()
            server.wait(timeout=30)


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


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
    return [" ".join(rng.choice(WORDS, size=tokens - 2)) for _ in range(count)]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=Path("models/minilm-l6"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="sequences in the shared run")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--warm-up", type=int, default=5, help="rounds before the baseline")
    args = parser.parse_args()
    bound = args.cache_mib * MiB
    # One tenant, no API key: the cache must be told it may be shared to be on at all.
    cache = {"RESPONSE_CACHE_BYTES": str(bound), "RESPONSE_CACHE_SHARED": "true"}
    with served(args.model_dir, **cache) as (url, pid):
        at_rest = []
        for seed in range(10_000, 10_000 + args.warm_up):  # the allocator's and arenas' plateau
            pinning_round(url, seed, args.batch, args.tokens)
            at_rest.append(vm_rss(pid))
        start = statistics.median(at_rest[-3:])  # as the end: transient peaks and dips aside
        print(f"cache bound {args.cache_mib} MiB; RSS after warm-up {start / MiB:.0f} MiB")
        shared, rss = 0, []
        for r in range(1, args.rounds + 1):
            shared += pinning_round(url, r, args.batch, args.tokens)
            rss.append(vm_rss(pid))
            gauge = metric(url, "attnserve_response_cache_bytes")
            print(f"round {r:2}: RSS {rss[-1] / MiB:7.0f} MiB  gauge {gauge / MiB:6.1f} MiB")
    grown = statistics.median(rss[-3:]) - start
    verdict = "met" if grown <= 1.1 * bound else "NOT met"
    print(
        f"{shared}/{args.rounds} rounds shared a run; RSS grew {grown / MiB:.0f} MiB "
        f"(median of the last three rounds, against the warm-up's), "
        f"target <= {1.1 * bound / MiB:.0f} MiB: {verdict}"
    )


if __name__ == "__main__":
    main()
