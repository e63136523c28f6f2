"""One graph of several model directories in-process: export-time variants side by side.

Compares ``model.onnx`` of e.g. the plain export (``--no-optimize``), the fused
default and the ``--quantize int8`` copy of the same weights, on the same
inputs, 2 intra-op threads, spinning off as the server runs it. Rounds are
interleaved (the machine is shared and noisy); reported: median ms per shape
and each directory's time as a ratio of the first one's, measured in the same
run.

    .venv/bin/python bench/bench_variants.py models/minilm-l6-plain models/minilm-l6 \\
        models/minilm-l6-int8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

SHAPES = ((1, 16), (16, 16), (8, 128), (16, 128))


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dirs", type=Path, nargs="+")
    parser.add_argument("--graph", default="model.onnx")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="per shape, round, model")
    args = parser.parse_args()
    d_model = json.loads((args.model_dirs[0] / "config.json").read_text())["architecture"][
        "d_model"
    ]
    sessions = {d.name: session(d / args.graph) for d in args.model_dirs}
    names = list(sessions)
    print(f"| [batch, seq] | {' | '.join(f'{n} ms' for n in names)} | "
          f"{' | '.join(f'{n} ÷ {names[0]}' for n in names[1:])} |")  # fmt: skip
    print("|---" * (2 * len(names)) + "|")
    rng = np.random.default_rng(0)
    for batch, seq in SHAPES:
        feeds = {
            "inputs_embeds": rng.standard_normal((batch, seq, d_model), dtype=np.float32),
            "attention_mask": np.ones((batch, seq), dtype=np.int64),
        }
        times: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(args.rounds):
            for name, s in sessions.items():
                s.run(None, feeds)  # warm
                runs, start = 0, time.perf_counter()
                while time.perf_counter() - start < args.seconds:
                    s.run(None, feeds)
                    runs += 1
                times[name].append((time.perf_counter() - start) / runs * 1000)
        medians = {n: statistics.median(t) for n, t in times.items()}
        ratios = " | ".join(f"{medians[n] / medians[names[0]]:.2f}" for n in names[1:])
        cells = " | ".join(f"{medians[n]:.2f}" for n in names)
        print(f"| [{batch}, {seq}] | {cells} | {ratios} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
