"""Padding-aware run planning against greedy packing, on the real runtime in-process.

Fits the run cost model (``service/run_planner.py``) the way the server does at
warm-up (the batcher's calibration shapes, each run twice), prints it, then for
queues like the text workload (32 sentences of 8-60 tokens) and ragged ones
(8-512 tokens) plans them both ways and runs both plans alternately on the same
inputs: modelled and measured seconds, greedy ÷ planned as the ratio.

    .venv/bin/python -m bench.planner --model-dir models/minilm-l6 --rounds 10

Writes ``bench/out/planner.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.models import DEFAULT_MODEL_DIR, OUT
from bench.lib.report import table
from bench.lib.results import write_json
from model_export.manifest import graph_io
from service.calibration import CALIBRATION_SHAPES
from service.inference_lanes import run_and_split
from service.model_info import read_model_info
from service.run_planner import RunCostModel, plan_runs
from service.runtime import ModelRuntime
from service.settings import Settings

QUEUES = {
    "text: 32 sentences, 8-60 tokens": (32, 8, 60),
    "ragged: 16 sequences, 8-512 tokens": (16, 8, 512),
    "short: 64 sequences, 4-24 tokens": (64, 4, 24),
}


def calibrate(runtime: ModelRuntime, graph: str) -> RunCostModel:
    model = RunCostModel()
    width = runtime.info.config.d_model
    for batch, longest in CALIBRATION_SHAPES:
        sequences = [np.zeros((longest, width), np.float32)] * batch
        run_and_split(runtime, sequences, graph)
        start = time.perf_counter()
        run_and_split(runtime, sequences, graph)
        model.observe(batch, longest, time.perf_counter() - start)
    model.fit()
    return model


def timed(runtime: ModelRuntime, runs: list[list[int]], seqs: list[np.ndarray]) -> float:
    start = time.perf_counter()
    for run in runs:
        run_and_split(runtime, [seqs[i] for i in run], graph_io.GRAPH_EMBEDDINGS)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=OUT / "planner.json")
    args = parser.parse_args(argv)
    settings = Settings(_env_file=None, intra_op_threads=2, model_repository=args.model_dir.parent)
    runtime = ModelRuntime(read_model_info(args.model_dir, settings), settings)
    runtime.warmup()

    def fits(batch: int, longest: int) -> bool:
        return batch * longest <= settings.max_batch_tokens

    model = calibrate(runtime, graph_io.GRAPH_EMBEDDINGS)
    a, b, c = model.coefficients or (0.0, 0.0, 0.0)
    print(f"fitted: {a * 1e3:.3f} ms + {b * 1e6:.3f} µs·B·T + {c * 1e9:.3f} ns·B·T²")
    rng = np.random.default_rng(0)
    width = runtime.info.config.d_model
    rows = []
    for name, (count, low, high) in QUEUES.items():
        lengths = [int(n) for n in rng.integers(low, high + 1, size=count)]
        seqs = [rng.standard_normal((n, width)).astype(np.float32) for n in lengths]
        greedy, planned = plan_runs(lengths, fits), plan_runs(lengths, fits, model)
        measured: dict[str, list[float]] = {"greedy": [], "planned": []}
        for _ in range(args.rounds):  # alternate, so drift hits both alike
            measured["greedy"].append(timed(runtime, greedy, seqs))
            measured["planned"].append(timed(runtime, planned, seqs))
        row: dict[str, Any] = {
            "queue": name,
            "greedy_runs": [[lengths[i] for i in run] for run in greedy],
            "planned_runs": [[lengths[i] for i in run] for run in planned],
            "modelled_greedy_ms": 1e3 * sum(model(len(r), lengths[r[0]]) for r in greedy),
            "modelled_planned_ms": 1e3 * sum(model(len(r), lengths[r[0]]) for r in planned),
            "measured_greedy_ms": 1e3 * statistics.median(measured["greedy"]),
            "measured_planned_ms": 1e3 * statistics.median(measured["planned"]),
        }
        row["speedup"] = row["measured_greedy_ms"] / row["measured_planned_ms"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_runs")}), flush=True)
    results = {"coefficients": model.coefficients, "queues": rows}
    write_json(args.out, results)
    print("\n" + render(results))
    return 0


def render(results: dict[str, Any]) -> str:
    return table(
        ["queue", "runs greedy → planned", "modelled ms", "measured ms (median)", "speed-up"],
        [
            [
                r["queue"],
                f"{len(r['greedy_runs'])} → {len(r['planned_runs'])}",
                f"{r['modelled_greedy_ms']:.1f} → {r['modelled_planned_ms']:.1f}",
                f"{r['measured_greedy_ms']:.1f} → {r['measured_planned_ms']:.1f}",
                f"×{r['speedup']:.2f}",
            ]
            for r in results["queues"]
        ],
    )


if __name__ == "__main__":
    raise SystemExit(main())
