"""onnxruntime run by the tests directly, not through the service: the expectations.

The server runs the same ONNX graphs, so the two agree to float32 noise (another
batch composition); a wrong token, head or layer is off by ~1e-1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from model_export import graph_io

# The server's answers and these runs agree to float32 noise (see the docstring).
ATOL_ORT = 1e-5

# The axes of each output that run over tokens, in one sequence's slice (batch axis
# dropped), from the graphs' own declaration: hidden (0,), attentions (2, 3), ...
TOKEN_AXES = graph_io.TOKEN_AXES


def new_session(path: str | Path) -> ort.InferenceSession:
    """onnxruntime on one graph, on one thread (the tests run beside a server)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_run(session: ort.InferenceSession, seq: np.ndarray) -> dict[str, np.ndarray]:
    """One [n, d] sequence alone (batch of one, no padding): the graph's outputs by name,
    batch axis dropped: last_hidden_state (n, d), attentions (L, H, n, n), hidden_states
    (L + 1, n, d), those the graph has."""
    mask = np.ones((1, len(seq)), dtype=np.int64)  # (1, n)
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, {graph_io.INPUT_EMBEDS: seq[None], graph_io.INPUT_MASK: mask})
    return {name: out[0] for name, out in zip(names, outputs, strict=True)}


def ort_outputs(
    session: ort.InferenceSession, seqs: list[np.ndarray]
) -> list[dict[str, np.ndarray]]:
    """Run ``seqs`` as one zero-padded batch; each one's outputs by name, trimmed to it."""
    longest = max(len(s) for s in seqs)
    d_model = seqs[0].shape[-1]
    embeds = np.zeros((len(seqs), longest, d_model), dtype=np.float32)  # (B, T, d)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)  # (B, T)
    for row, seq in enumerate(seqs):
        embeds[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask})
    trimmed = []
    for row, seq in enumerate(seqs):
        by_name = {}
        for name, value in zip(names, outputs, strict=True):
            index: list[slice | int] = [row] + [slice(None)] * (value.ndim - 1)
            for axis in TOKEN_AXES[name]:
                index[axis + 1] = slice(0, len(seq))
            by_name[name] = value[tuple(index)]
        trimmed.append(by_name)
    return trimmed


def ort_encode(
    session: ort.InferenceSession, seqs: list[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Run ``seqs`` as one zero-padded batch; return each one's trimmed (hidden, attention)."""
    return [
        (out[graph_io.OUTPUT_HIDDEN], out.get(graph_io.OUTPUT_ATTENTIONS))
        for out in ort_outputs(session, seqs)
    ]
