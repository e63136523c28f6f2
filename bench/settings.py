"""Server settings side by side: which spinning, thread and batching settings pay here.

Each variant is a set of ATTNSERVE_* overrides. All variants' servers run at
once (idle ones cost nothing with spinning off), and the load process drives
them in interleaved rounds, so the machine's noise falls on all of them alike.
Workloads: W1 [1,16] c=1 (p50), W2 [1,16] c=32, W3 [8,128] c=16 and W4 [1,128]
with every attention map c=8 (tokens/s), and T1, 32 sentences per request at
c=4 through /v1/embeddings (sentences/s). Reported: the median
over rounds and each variant's ratio to the first one, with the min–max of the
per-round ratios.

    .venv/bin/python -m bench.settings default \\
        one-thread:INTRA_OP_THREADS=1 batch-1024:MAX_BATCH_TOKENS=1024

Writes ``bench/out/settings.json`` and prints a markdown table rendered from it.
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
from typing import Any

import numpy as np

from bench.lib.load import load_process
from bench.lib.models import DEFAULT_MODEL_DIR, OUT, model_config
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_server
from bench.lib.workloads import encode_body

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
    small = encode_body([x], "base64")
    batch = [
        {"shape": [128, d_model], "data": base64.b64encode(row.tobytes()).decode()}
        for row in rng.standard_normal((8, 128, d_model), dtype=np.float32)
    ]
    large = json.dumps({"inputs": batch, "encoding_format": "base64"}).encode()
    attention = json.dumps(
        {"inputs": batch[:1], "encoding_format": "base64", "return_attention": True}
    ).encode()
    texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(32)]
    text = json.dumps({"input": texts, "model": model}).encode()
    return {
        "W1 [1,16] c=1 p50 ms": ("/v1/encode", small, 200, 1),
        "W2 [1,16] c=32 tokens/s": ("/v1/encode", small, 640, 32),
        "W3 [8,128] c=16 tokens/s": ("/v1/encode", large, 64, 16),
        "W4 [1,128] + attention c=8 tokens/s": ("/v1/encode", attention, 160, 8),
        "T1 text 32/request c=4 sentences/s": ("/v1/embeddings", text, 40, 4),
    }


def measure(name: str, stats: dict[str, float], requests_per_round: int) -> float:
    if name.startswith("W1"):
        return stats["p50_ms"]
    per_request = {"W2": 16, "W3": 8 * 128, "W4": 128}.get(name[:2], 32)
    return per_request * stats["requests"] / stats["wall_s"]


def render(results: dict[str, Any]) -> str:
    """Each variant's median per workload, and its per-round ratios to the first one."""
    rows = []
    for workload, by_variant in results["values"].items():
        base = by_variant[results["first"]]
        for variant, values in by_variant.items():
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            rows.append(
                [
                    workload,
                    variant,
                    f"{statistics.median(values):,.1f}",
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})",
                ]
            )
    head = (
        f"model {results['model']}; {results['rounds']} interleaved rounds; "
        f"ratio ÷ {results['first']}\n"
    )
    return head + "\n" + table(["workload", "variant", "median", "ratio (min–max)"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", help="name[:KEY=VALUE,KEY=VALUE]")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="only workloads whose name has this")
    parser.add_argument("--out", type=Path, default=OUT / "settings.json")
    args = parser.parse_args(argv)
    variants: dict[str, dict[str, str]] = {}
    for spec in args.variants:
        name, _, overrides = spec.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in overrides.split(",") if kv)
    config = model_config(args.model_dir)
    loads = {
        k: v
        for k, v in workloads(config["name"], config["architecture"]["d_model"]).items()
        if args.only in k
    }
    results: dict[str, dict[str, list[float]]] = {w: {v: [] for v in variants} for w in loads}
    ctx = get_context("spawn")
    with ExitStack() as stack, ctx.Pool(1) as pool:
        ports = {
            v: stack.enter_context(running_server(args.model_dir, **settings)).port
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
    saved = {
        "model": config["name"],
        "rounds": args.rounds,
        "variants": variants,
        "first": next(iter(variants)),
        "values": results,
    }
    write_json(args.out, saved)
    print(render(saved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
