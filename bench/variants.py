"""One graph of several model directories in-process: export-time variants side by side.

Compares ``model.onnx`` of e.g. the plain export (``--no-optimize``), the fused
default and the ``--quantize int8`` copy of the same weights, on the same
inputs, 2 intra-op threads, spinning off as the server runs it. Rounds are
interleaved (the machine is shared and noisy); reported: median ms per shape
and each directory's time as a ratio of the first one's, measured in the same
run.

    .venv/bin/python -m bench.variants models/minilm-l6-plain models/minilm-l6 \\
        models/minilm-l6-int8

Writes ``bench/out/variants.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.models import OUT, model_config
from bench.lib.reference import ort_session
from bench.lib.report import table
from bench.lib.results import write_json

SHAPES = ((1, 16), (16, 16), (8, 128), (16, 128))


def render(results: dict[str, Any]) -> str:
    names = results["models"]
    header = ["[batch, seq]", *(f"{n} ms" for n in names)]
    header += [f"{n} ÷ {names[0]}" for n in names[1:]]
    rows = []
    for r in results["rows"]:
        medians = r["median_ms"]
        rows.append(
            [
                f"[{r['batch']}, {r['seq']}]",
                *(f"{medians[n]:.2f}" for n in names),
                *(f"{medians[n] / medians[names[0]]:.2f}" for n in names[1:]),
            ]
        )
    return table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dirs", type=Path, nargs="+")
    parser.add_argument("--graph", default="model.onnx")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="per shape, round, model")
    parser.add_argument("--out", type=Path, default=OUT / "variants.json")
    args = parser.parse_args(argv)
    d_model = model_config(args.model_dirs[0])["architecture"]["d_model"]
    sessions = {d.name: ort_session(d / args.graph, 2) for d in args.model_dirs}
    names = list(sessions)
    rng = np.random.default_rng(0)
    rows = []
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
        rows.append({"batch": batch, "seq": seq, "median_ms": medians})
        print(f"[{batch}, {seq}] done", flush=True)
    results = {"graph": args.graph, "models": names, "rows": rows}
    write_json(args.out, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
