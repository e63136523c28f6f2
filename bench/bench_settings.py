"""Server settings side by side: which spinning, thread and batching settings pay here.

Each variant is a set of ATTNSERVE_* overrides. All variants' servers run at
once (idle ones cost nothing with spinning off), and the load process drives
them in interleaved rounds, so the machine's noise falls on all of them alike.
Workloads: W1 [1,16] c=1 (p50), W2 [1,16] c=32 and W3 [8,128] c=16 (tokens/s),
and T1, 32 sentences per request at c=4 through /v1/embeddings (sentences/s). Reported: the median
over rounds and each variant's ratio to the first one, with the min–max of the
per-round ratios.

    .venv/bin/python bench/bench_settings.py default \\
        one-thread:INTRA_OP_THREADS=1 batch-1024:MAX_BATCH_TOKENS=1024
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
from contextlib import ExitStack
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from bench_serving import ROOT, Scenario, load_process, request_body, running_server

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention weights show which tokens each token reads from.",
    "A serving layer earns its place only if it adds little to the model's cost.",
    "Dynamic batching merges concurrent requests into one onnxruntime run.",
]


def workloads(model: str, d_model: int) -> dict[str, tuple[str, bytes, int, int]]:
    """name -> (path, body, requests per round, concurrency)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, d_model), dtype=np.float32)
    small = request_body(x, Scenario("w", 16, 1))
    batch = [
        {"shape": [128, d_model], "data": base64.b64encode(row.tobytes()).decode()}
        for row in rng.standard_normal((8, 128, d_model), dtype=np.float32)
    ]
    large = json.dumps({"inputs": batch, "encoding_format": "base64"}).encode()
    texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(32)]
    text = json.dumps({"input": texts, "model": model}).encode()
    return {
        "W1 [1,16] c=1 p50 ms": ("/v1/encode", small, 200, 1),
        "W2 [1,16] c=32 tokens/s": ("/v1/encode", small, 640, 32),
        "W3 [8,128] c=16 tokens/s": ("/v1/encode", large, 64, 16),
        "T1 text 32/request c=4 sentences/s": ("/v1/embeddings", text, 40, 4),
    }


def measure(name: str, stats: dict[str, float], requests_per_round: int) -> float:
    if name.startswith("W1"):
        return stats["p50_ms"]
    per_request = {"W2": 16, "W3": 8 * 128}.get(name[:2], 32)
    return per_request * stats["requests"] / stats["wall_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="name[:KEY=VALUE,KEY=VALUE]")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "minilm-l6")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="only workloads whose name has this")
    args = parser.parse_args()
    variants: dict[str, dict[str, str]] = {}
    for spec in args.variants:
        name, _, overrides = spec.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in overrides.split(",") if kv)
    config = json.loads((args.model_dir / "config.json").read_text())
    loads = {
        k: v
        for k, v in workloads(config["name"], config["architecture"]["d_model"]).items()
        if args.only in k
    }
    results: dict[str, dict[str, list[float]]] = {w: {v: [] for v in variants} for w in loads}
    ctx = get_context("spawn")
    with ExitStack() as stack, ctx.Pool(1) as pool:
        ports = {
            v: stack.enter_context(running_server(args.model_dir, **settings))
            for v, settings in variants.items()
        }
        for port in ports.values():  # warm up
            for path, body, _, _ in loads.values():
                pool.apply(load_process, (port, body, 8, 1, path))
        for round_ in range(args.rounds):
            for workload, (path, body, requests, concurrency) in loads.items():
                for variant, port in ports.items():
                    stats = pool.apply(load_process, (port, body, requests, concurrency, path))
                    results[workload][variant].append(measure(workload, stats, requests))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    first = next(iter(variants))
    print(f"model {config['name']}; {args.rounds} interleaved rounds; ratio ÷ {first}\n")
    print("| workload | variant | median | ratio (min–max) |")
    print("|---|---|---|---|")
    for workload, by_variant in results.items():
        for variant, values in by_variant.items():
            ratios = [v / b for v, b in zip(values, by_variant[first], strict=True)]
            print(
                f"| {workload} | {variant} | {statistics.median(values):,.1f} | "
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
