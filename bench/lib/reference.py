"""In-process references: onnxruntime on our graphs, in the measuring process.

What a served answer must match (each sequence run alone: no padding, no batching
with others) and the sessions the in-process baselines time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from model_export import graph_io


def ort_session(path: Path | str, threads: int, *, spinning: bool = False) -> ort.InferenceSession:
    """A CPU session with ``threads`` intra-op threads (0: onnxruntime's default, one per
    core); ``spinning`` False as our server runs it (idle threads do not busy-wait)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class SequenceReference:
    """``model.onnx`` and ``model_attn.onnx`` of a model directory, one sequence a run."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        self.sessions = {
            attention: ort_session(model_dir / graph, threads)
            for attention, graph in (
                (False, graph_io.GRAPH_EMBEDDINGS),
                (True, graph_io.GRAPH_ATTENTION),
            )
        }

    def run(self, x: np.ndarray, attention: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(hidden [n, d], every attention map [L, H, n, n] or None) of one sequence [n, d]."""
        names = [graph_io.OUTPUT_HIDDEN] + ([graph_io.OUTPUT_ATTENTIONS] if attention else [])
        feeds = {
            graph_io.INPUT_EMBEDS: x[None],  # (1, n, d)
            graph_io.INPUT_MASK: np.ones((1, len(x)), dtype=np.int64),  # (1, n)
        }
        outputs = self.sessions[attention].run(names, feeds)
        return outputs[0][0], (outputs[1][0] if attention else None)
