"""Task adapters in the graph (one graph, A/B stacked per task, gathered by a task input)
against one merged graph per task (W + B_t A_t folded in: k copies of the weights).

Measures, on a random encoder of the given size with k tasks of rank r: the files
(one model.onnx vs k), the memory onnxruntime holds for the sessions (resident set
growth after opening and one run), and the latency of model.onnx per batch (median of
runs, each task in turn). Prints one JSON object.

    python -m bench.task_adapters --d-model 256 --layers 4 --tasks 5 --rank 4
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from model_export import graph_io
from model_export.config import EncoderConfig
from model_export.export import _export_graph
from model_export.graph_modules import EmbeddingsGraph
from model_export.model import Encoder, TaskLoRALinear


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _merged(encoder: Encoder, task: int, config: EncoderConfig) -> Encoder:
    """The plain encoder with task ``task``'s adapters folded into its weights."""
    plain = EncoderConfig.from_dict({**config.to_dict(), "lora_tasks": 0, "lora_rank": 0})
    merged = Encoder(plain)
    state = {k: v for k, v in encoder.state_dict().items() if ".lora_" not in k}
    with torch.no_grad():
        for name, module in encoder.named_modules():
            if isinstance(module, TaskLoRALinear):
                delta = (module.lora_a[task] @ module.lora_b[task]).t()  # (out, in)
                state[f"{name}.weight"] = module.weight + delta
    merged.load_state_dict(state)
    return merged


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _timed(run: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = EncoderConfig(
        d_model=args.d_model,
        n_heads=args.heads,
        n_layers=args.layers,
        d_ff=4 * args.d_model,
        max_seq_len=512,
        rotary="half",
        lora_tasks=args.tasks,
        lora_rank=args.rank,
    )
    encoder = Encoder(config, seed=0)
    with torch.no_grad():  # non-zero adapters
        for module in encoder.modules():
            if isinstance(module, TaskLoRALinear):
                module.lora_a[1:].normal_(0.0, 0.1)
                module.lora_b[1:].normal_(0.0, 0.1)
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((args.batch, args.seq, args.d_model), dtype=np.float32)
    mask = np.ones((args.batch, args.seq), dtype=np.int64)
    example = (torch.randn(2, 8, args.d_model), torch.ones(2, 8, dtype=torch.int64))
    out: dict[str, Any] = {"config": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lora = root / "lora.onnx"
        inputs = list(graph_io.with_task(graph_io.INPUT_NAMES, args.tasks))
        task = (torch.tensor([1, 2]),)
        names = [graph_io.OUTPUT_HIDDEN]
        _export_graph(
            EmbeddingsGraph(encoder), example + task, lora, 18, "torchscript", inputs, names
        )
        merged = []
        for t in range(1, args.tasks + 1):
            path = root / f"merged_{t}.onnx"
            graph = EmbeddingsGraph(_merged(encoder, t, config))
            _export_graph(
                graph, example, path, 18, "torchscript", list(graph_io.INPUT_NAMES), names
            )
            merged.append(path)
        # Same answers (the merged graphs are the reference for the in-graph adapters).
        gc.collect()
        before = _rss_bytes()
        session = _session(lora)
        feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
        per_task = []
        for t in range(1, args.tasks + 1):
            task_feed = {graph_io.INPUT_TASK: np.full(args.batch, t, dtype=np.int64)}
            per_task.append(session.run(None, feeds | task_feed)[0])
        lora_rss = _rss_bytes() - before
        gc.collect()
        before = _rss_bytes()
        sessions = [_session(p) for p in merged]
        merged_out = [s.run(None, feeds)[0] for s in sessions]
        merged_rss = _rss_bytes() - before
        diff = max(float(np.abs(a - b).max()) for a, b in zip(per_task, merged_out, strict=True))

        def run_lora() -> None:
            for t in range(1, args.tasks + 1):
                task_feed = {graph_io.INPUT_TASK: np.full(args.batch, t, dtype=np.int64)}
                session.run(None, feeds | task_feed)

        def run_merged() -> None:
            for s in sessions:
                s.run(None, feeds)

        for run in (run_lora, run_merged):  # warm-up
            run()
        lora_ms = _timed(run_lora, args.repeats) / args.tasks
        merged_ms = _timed(run_merged, args.repeats) / args.tasks
        out |= {
            "lora_in_graph": {
                "file_bytes": lora.stat().st_size,
                "session_rss_bytes": lora_rss,
                "ms_per_batch": round(lora_ms, 3),
            },
            "merged_per_task": {
                "file_bytes": sum(p.stat().st_size for p in merged),
                "session_rss_bytes": merged_rss,
                "ms_per_batch": round(merged_ms, 3),
            },
            "max_abs_diff_between_them": diff,
            "encoder_parameters": config.parameters(),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    print(json.dumps(measure(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
