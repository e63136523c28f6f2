"""The three graphs of one model in-process: time and peak memory per run.

Why a hidden-states request runs ``model_hidden.onnx`` and not ``model_attn.onnx``
(which also returns hidden states): each graph runs in its own fresh process
(peak RSS is per process), on the same [batch, seq] input, 2 intra-op threads,
spinning off as the server runs it. Reported: median ms and peak RSS, and each
graph's time as a ratio of ``model.onnx`` measured in the same run.

``--text-graph``: the one-run text graph (``text_model.onnx``, in format 3 and 4
exports; format 5 has none) against the two
graphs text ran through before it (``embeddings.onnx``, then ``model.onnx``, with
the per-sequence hand-over the runtime does), interleaved in one process on the
same token ids; outputs compared first (1e-5).

    .venv/bin/python -m bench.graphs --model-dir models/minilm-l6 --seq 128 256
    .venv/bin/python -m bench.graphs --text-graph --batch 32 --seq 16 64 128

Writes ``bench/out/graphs.json`` (``graphs_text.json`` with ``--text-graph``) and
prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.models import DEFAULT_MODEL_DIR, OUT, model_config
from bench.lib.reference import ort_session
from bench.lib.report import table
from bench.lib.results import write_json

GRAPHS = ("model.onnx", "model_hidden.onnx", "model_attn.onnx")


def run_graph(path: str, batch: int, seq: int, d_model: int, repeats: int) -> tuple[float, float]:
    """(median ms, peak RSS MB) of ``repeats`` runs in this (fresh) process."""
    session = ort_session(path, 2)
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


def text_graph_ratios(model_dir: Path, batch: int, seq: int, repeats: int) -> tuple[float, float]:
    """(two graphs ms, text graph ms), medians over interleaved runs, for ``batch``
    sequences of random token ids with lengths spread over seq/4..seq."""
    embeddings, encoder, text = (
        ort_session(model_dir / name, 2)
        for name in ("embeddings.onnx", "model.onnx", "text_model.onnx")
    )
    rng = np.random.default_rng(0)
    lengths = rng.integers(max(1, seq // 4), seq + 1, size=batch)
    lengths[0] = seq
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(1000, 20000, size=(batch, seq), dtype=np.int64) * mask
    types = np.zeros_like(ids)

    def two_graphs() -> np.ndarray:
        (embeds,) = embeddings.run(None, {"input_ids": ids, "token_type_ids": types})
        rows = [embeds[row, :n] for row, n in enumerate(lengths)]  # as embed_tokens hands over
        padded = np.zeros_like(embeds)
        for row, value in enumerate(rows):
            padded[row, : len(value)] = value
        out: np.ndarray = encoder.run(None, {"inputs_embeds": padded, "attention_mask": mask})[0]
        return out

    def one_graph() -> np.ndarray:
        feeds = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        out: np.ndarray = text.run(None, feeds)[0]
        return out

    difference = float(np.abs((two_graphs() - one_graph()) * mask[..., None]).max())
    if difference > 1e-5:
        raise SystemExit(f"text graph differs from the two graphs by {difference:.3g}")
    times: dict[str, list[float]] = {"two": [], "one": []}
    for _ in range(repeats):
        for name, run in (("two", two_graphs), ("one", one_graph)):
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1000)
    return statistics.median(times["two"]), statistics.median(times["one"])


def render_text(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "token ids [batch, longest]",
            "embeddings.onnx + model.onnx ms",
            "text_model.onnx ms",
            "speed-up",
        ],
        [
            [
                f"[{r['batch']},{r['seq']}]",
                f"{r['two_graphs_ms']:.1f}",
                f"{r['text_graph_ms']:.1f}",
                f"{r['two_graphs_ms'] / r['text_graph_ms']:.2f}×",
            ]
            for r in rows
        ],
    )


def render(rows: list[dict[str, Any]]) -> str:
    base = {(r["batch"], r["seq"]): r["ms"] for r in rows if r["graph"] == "model.onnx"}
    return table(
        ["input", "graph", "median ms", "÷ model.onnx", "peak RSS MB"],
        [
            [
                f"[{r['batch']},{r['seq']}]",
                r["graph"],
                f"{r['ms']:.0f}",
                f"{r['ms'] / base[(r['batch'], r['seq'])]:.2f}",
                f"{r['peak_rss_mb']:.0f}",
            ]
            for r in rows
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--text-graph", action="store_true", help="text_model.onnx vs two graphs")
    parser.add_argument("--out", type=Path, default=None, help="default bench/out/graphs.json")
    args = parser.parse_args(argv)
    if args.text_graph:
        rows = []
        for seq in args.seq:
            two, one = text_graph_ratios(args.model_dir, args.batch, seq, args.repeats)
            rows.append(
                {"batch": args.batch, "seq": seq, "two_graphs_ms": two, "text_graph_ms": one}
            )
        write_json(args.out or OUT / "graphs_text.json", rows)
        print(render_text(rows))
        return 0
    d_model = model_config(args.model_dir)["architecture"]["d_model"]
    ctx = get_context("spawn")
    rows = []
    for seq in args.seq:
        for graph in GRAPHS:
            with ctx.Pool(1) as pool:
                ms, rss = pool.apply(
                    run_graph,
                    (str(args.model_dir / graph), args.batch, seq, d_model, args.repeats),
                )
            rows.append(
                {"batch": args.batch, "seq": seq, "graph": graph, "ms": ms, "peak_rss_mb": rss}
            )
    write_json(args.out or OUT / "graphs.json", rows)
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
