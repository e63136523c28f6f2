"""Serving benchmark: the HTTP service against onnxruntime in-process, as ratios.

The machine is shared and noisy, so every number is reported next to a
baseline measured in the same run: onnxruntime called directly in its own
process on the same model and the same inputs. Each scenario starts a real
server (``python -m service``) on 127.0.0.1 and drives it from a separate
load process with the load client of ``bench.lib`` (keep-alive HTTP/1.1 framed
by h11: an httpx load generator would eat the cores it measures). Loops are
bounded by request count.

    .venv/bin/python -m bench.serving --model-dir models/minilm-l6 --requests 400

Writes ``bench/out/serving.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.load import load_process
from bench.lib.models import DEFAULT_MODEL_DIR, OUT, model_config
from bench.lib.reference import ort_session
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_server
from bench.lib.workloads import encode_body


@dataclass(frozen=True)
class Scenario:
    name: str
    seq_len: int
    concurrency: int
    encoding: str = "base64"  # how the arrays travel both ways
    attention: bool = False
    batch_tokens: int = 4096  # ATTNSERVE_MAX_BATCH_TOKENS; seq_len disables merging


SCENARIOS = [
    Scenario("latency [1,16], c=1", 16, 1),
    Scenario("throughput [1,16], c=32, batching", 16, 32),
    Scenario("throughput [1,16], c=32, no batching", 16, 32, batch_tokens=16),
    Scenario("throughput [1,16], c=32, float JSON", 16, 32, encoding="float"),
    Scenario("[1,128] c=8", 128, 8),
    Scenario("[1,128] c=8 + attention (mean)", 128, 8, attention=True),
]


def request_body(x: np.ndarray, scenario: Scenario) -> bytes:
    return encode_body([x], scenario.encoding, "mean" if scenario.attention else None)


def in_process_baseline(
    model_dir: str, x: np.ndarray, batch: int, attention: bool, repeats: int
) -> float:
    """Tokens/s of onnxruntime itself on ``batch`` copies of x (own process, one thread
    per core, spinning on: its defaults)."""
    graph = "model_attn.onnx" if attention else "model.onnx"
    session = ort_session(f"{model_dir}/{graph}", 0, spinning=True)
    embeds = np.repeat(x[None], batch, axis=0)
    mask = np.ones(embeds.shape[:2], dtype=np.int64)
    feeds = {"inputs_embeds": embeds, "attention_mask": mask}
    session.run(None, feeds)
    start = time.perf_counter()
    for _ in range(repeats):
        session.run(None, feeds)
    return float(repeats * embeds.shape[0] * embeds.shape[1] / (time.perf_counter() - start))


def run_scenario(
    model_dir: Path, d_model: int, scenario: Scenario, requests: int
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((scenario.seq_len, d_model), dtype=np.float32)
    payload = request_body(x, scenario)
    ctx = get_context("spawn")
    with ctx.Pool(1) as pool:
        batch = max(1, min(scenario.concurrency, 4096 // scenario.seq_len))
        baseline = pool.apply(
            in_process_baseline, (str(model_dir), x, batch, scenario.attention, 20)
        )
    with (
        running_server(model_dir, MAX_BATCH_TOKENS=str(scenario.batch_tokens)) as server,
        ctx.Pool(1) as pool,
    ):
        pool.apply(load_process, (server.port, payload, 20, 1))  # warm the server up
        stats = pool.apply(load_process, (server.port, payload, requests, scenario.concurrency))
    tokens_per_s = stats["requests"] * scenario.seq_len / stats["wall_s"]
    return {
        **asdict(scenario),
        **stats,
        "tokens_per_s": tokens_per_s,
        "baseline_tokens_per_s": baseline,
        "ratio_vs_in_process": tokens_per_s / baseline,
    }


def render(results: dict[str, Any]) -> str:
    rows = results["rows"]
    return "\n".join(
        [
            f"model {results['model']} (d_model {results['d_model']}); baseline: onnxruntime "
            "in-process, same inputs, batch = min(concurrency, 4096 / seq)\n",
            table(
                ["scenario", "p50 ms", "p99 ms", "tokens/s", "in-process tokens/s", "ratio"],
                [
                    [
                        r["name"],
                        f"{r['p50_ms']:.1f}",
                        f"{r['p99_ms']:.1f}",
                        f"{r['tokens_per_s']:,.0f}",
                        f"{r['baseline_tokens_per_s']:,.0f}",
                        f"{r['ratio_vs_in_process']:.2f}",
                    ]
                    for r in rows
                ],
            ),
            f"\nmedian ratio {statistics.median(r['ratio_vs_in_process'] for r in rows):.2f}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--requests", type=int, default=400, help="requests per scenario")
    parser.add_argument("--only", default="", help="run only scenarios whose name has this")
    parser.add_argument("--out", type=Path, default=OUT / "serving.json")
    args = parser.parse_args(argv)
    config = model_config(args.model_dir)
    d_model = config["architecture"]["d_model"]
    rows = [
        run_scenario(args.model_dir, d_model, s, args.requests)
        for s in SCENARIOS
        if args.only in s.name
    ]
    results = {"model": config["name"], "d_model": d_model, "rows": rows}
    write_json(args.out, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
