"""Padding-aware run planning against greedy packing, on the real runtime in-process.

Fits the run cost model (``service/run_planner.py``) the way the server does at
warm-up (the batcher's calibration shapes, each run twice), prints it, then for
queues like the text workload (32 sentences of 8-60 tokens) and ragged ones
(8-512 tokens) plans them both ways and runs both plans alternately on the same
inputs: modelled and measured seconds, greedy ÷ planned as the ratio.

    .venv/bin/python bench/bench_planner.py --model-dir models/minilm-l6 --rounds 10

Writes ``bench/out/planner.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from model_export.manifest import graph_io
from service.batcher import CALIBRATION_SHAPES, _run_and_split
from service.model_info import read_model_info
from service.run_planner import RunCostModel, plan_runs
from service.runtime import ModelRuntime
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
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
        _run_and_split(runtime, sequences, graph)
        start = time.perf_counter()
        _run_and_split(runtime, sequences, graph)
        model.observe(batch, longest, time.perf_counter() - start)
    model.fit()
    return model


def timed(runtime: ModelRuntime, runs: list[list[int]], seqs: list[np.ndarray]) -> float:
    start = time.perf_counter()
    for run in runs:
        _run_and_split(runtime, [seqs[i] for i in run], graph_io.GRAPH_EMBEDDINGS)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "minilm-l6")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "planner.json")
    args = parser.parse_args(argv)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, intra_op_threads=2, model_repository=args.model_dir.parent
    )
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
        row = {
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"coefficients": model.coefficients, "queues": rows}, indent=2) + "\n"
    )
    print("\n| queue | runs greedy → planned | modelled ms | measured ms (median) | speed-up |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['queue']} | {len(r['greedy_runs'])} → {len(r['planned_runs'])} "
            f"| {r['modelled_greedy_ms']:.1f} → {r['modelled_planned_ms']:.1f} "
            f"| {r['measured_greedy_ms']:.1f} → {r['measured_planned_ms']:.1f} "
            f"| ×{r['speedup']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
