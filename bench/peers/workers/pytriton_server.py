"""PyTriton (Triton core + dynamic batcher) serving our graphs, for ``python -m bench.peers``.

Runs in its own venv (bench/peers/setup_pytriton.sh: PyTriton pins numpy < 2).
Two models: ``<name>`` from ``model.onnx`` (last_hidden_state) and
``<name>_attn`` from ``model_attn.onnx`` (plus the full attention tensor), each
behind Triton's dynamic batcher, onnxruntime inside the infer function with the
same thread settings as our server (2 intra-op threads, no spinning), so the
comparison is of the serving layers, not of the runtime.

The batcher as Triton's docs recommend tuning it (server docs/user_guide/batcher.md,
"Recommended Configuration Process"): no preferred batch sizes ("should not be
used for most models"), a queue delay of 0 (Triton's default) unless raising it
buys throughput within the latency budget, which bench.peers measures with one
server per ``--delay-us``; ``--instances`` binds that many infer functions (PyTriton's
multi-instance models), each with its own session and ``threads / instances``
intra-op threads, so the cores are shared, not oversubscribed.

    LD_LIBRARY_PATH=$(python -c 'import sys;print(sys.base_prefix)')/lib \\
        bench/peers/.venvs/pytriton/bin/python bench/peers/workers/pytriton_server.py \\
        --model-dir models/minilm-l6 --port 8100 --workspace /tmp/pytriton-ws

Triton's Python backend loads libpython through LD_LIBRARY_PATH: without the
running Python's own ``lib`` it picks the system's and fails.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def infer_function(sess: ort.InferenceSession, outputs: list[str]) -> Any:
    """A batched infer function: Triton concatenates same-shaped requests along axis 0."""

    @batch
    def infer(inputs_embeds: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        # Only the outputs served: onnxruntime then skips the graph's other branches
        # (model_attn.onnx also has hidden states and value norms).
        feeds = {"inputs_embeds": inputs_embeds, "attention_mask": attention_mask}
        return dict(zip(outputs, sess.run(outputs, feeds), strict=True))

    return infer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--name", default="model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, default=0, help="0: port + 1")
    parser.add_argument("--metrics-port", type=int, default=0, help="0: port + 2")
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--delay-us", type=int, default=0, help="max_queue_delay_microseconds")
    parser.add_argument(
        "--instances", type=int, default=1, help="model instances (infer functions)"
    )
    args = parser.parse_args()
    d_model = json.loads((args.model_dir / "config.json").read_text())["architecture"]["d_model"]
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port or args.port + 1,
        metrics_address="127.0.0.1",
        metrics_port=args.metrics_port or args.port + 2,
        allow_metrics=False,
        log_verbose=0,
    )
    inputs = [
        Tensor(name="inputs_embeds", dtype=np.float32, shape=(-1, d_model)),
        Tensor(name="attention_mask", dtype=np.int64, shape=(-1,)),
    ]
    hidden = Tensor(name="last_hidden_state", dtype=np.float32, shape=(-1, d_model))
    batcher = DynamicBatcher(max_queue_delay_microseconds=args.delay_us)
    threads = max(1, args.threads // args.instances)

    def instances(graph: str, outputs: list[str]) -> list[Any]:
        return [
            infer_function(session(args.model_dir / graph, threads), outputs)
            for _ in range(args.instances)
        ]

    with Triton(config=config, workspace=str(args.workspace)) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=instances("model.onnx", ["last_hidden_state"]),
            inputs=inputs,
            outputs=[hidden],
            config=ModelConfig(max_batch_size=args.max_batch, batcher=batcher),
            strict=True,
        )
        if (args.model_dir / "model_attn.onnx").exists():
            triton.bind(
                model_name=f"{args.name}_attn",
                infer_func=instances("model_attn.onnx", ["last_hidden_state", "attentions"]),
                inputs=inputs,
                outputs=[
                    hidden,
                    Tensor(name="attentions", dtype=np.float32, shape=(-1, -1, -1, -1)),
                ],
                config=ModelConfig(max_batch_size=args.max_batch, batcher=batcher),
                strict=True,
            )
        triton.serve()


if __name__ == "__main__":
    main()
