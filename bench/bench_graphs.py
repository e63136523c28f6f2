"""The three graphs of one model in-process: time and peak memory per run.

Why a hidden-states request runs ``model_hidden.onnx`` and not ``model_attn.onnx``
(which also returns hidden states): each graph runs in its own fresh process
(peak RSS is per process), on the same [batch, seq] input, 2 intra-op threads,
spinning off as the server runs it. Reported: median ms and peak RSS, and each
graph's time as a ratio of ``model.onnx`` measured in the same run.

    .venv/bin/python bench/bench_graphs.py --model-dir models/minilm-l6 --seq 128 256
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GRAPHS = ("model.onnx", "model_hidden.onnx", "model_attn.onnx")


def run_graph(path: str, batch: int, seq: int, d_model: int, repeats: int) -> tuple[float, float]:
    """(median ms, peak RSS MB) of ``repeats`` runs in this (fresh) process."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {
        "inputs_embeds": rng.standard_normal((batch, seq, d_model), dtype=np.float32),
        "attention_mask": np.ones((batch, seq), dtype=np.int64),
    }
    session.run(None, feeds)  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "minilm-l6")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    d_model = json.loads((args.model_dir / "config.json").read_text())["architecture"]["d_model"]
    ctx = get_context("spawn")
    print("| input | graph | median ms | ÷ model.onnx | peak RSS MB |")
    print("|---|---|---|---|---|")
    for seq in args.seq:
        results = {}
        for graph in GRAPHS:
            with ctx.Pool(1) as pool:
                results[graph] = pool.apply(
                    run_graph,
                    (str(args.model_dir / graph), args.batch, seq, d_model, args.repeats),
                )
        base = results["model.onnx"][0]
        for graph, (ms, rss) in results.items():
            print(f"| [{args.batch},{seq}] | {graph} | {ms:.0f} | {ms / base:.2f} | {rss:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
