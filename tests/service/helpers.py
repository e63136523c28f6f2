"""Small helpers shared by the service tests: inputs, wire forms and direct onnxruntime runs.

Nothing here imports ``service``: the tests talk to the server over HTTP and
compute their expectations from the ONNX files and numpy alone.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort

from model_export import graph_io
from model_export.validate import make_inputs

# The tiny preset the fixtures export (model_export.config.PRESETS["tiny"]).
D_MODEL = 32
N_HEADS = 4
N_LAYERS = 2
D_FF = 64
MODEL_MAX_SEQ_LEN = 128
MODEL = "tiny"

TIMEOUT = httpx.Timeout(30.0)


def sequences(lengths: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Random float32 [n_i, D_MODEL] sequences (make_inputs trimmed to each length)."""
    embeds, _ = make_inputs(lengths, D_MODEL, seed)
    return [embeds[i, :n].copy() for i, n in enumerate(lengths)]


def b64_array(array: np.ndarray) -> dict[str, Any]:
    """The wire form {"shape", "data"} of a float32 array: base64 of little-endian bytes."""
    le = np.ascontiguousarray(array, dtype="<f4")
    return {"shape": list(le.shape), "data": base64.b64encode(le.tobytes()).decode("ascii")}


def as_array(value: Any) -> np.ndarray:
    """A response array (nested JSON floats or a base64 object) as float32 numpy."""
    if isinstance(value, dict):
        assert value["dtype"] == "float32", value
        raw = base64.b64decode(value["data"], validate=True)
        return np.frombuffer(raw, dtype="<f4").reshape(value["shape"]).astype(np.float32)
    return np.asarray(value, dtype=np.float32)


def encode(client: httpx.Client, inputs: list[Any], **options: Any) -> dict[str, Any]:
    """POST /v1/encode; numpy inputs are sent as nested floats. Asserts 200."""
    wire = [x.tolist() if isinstance(x, np.ndarray) else x for x in inputs]
    r = client.post("/v1/encode", json={"inputs": wire, **options})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def new_session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_encode(
    session: ort.InferenceSession, seqs: list[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Run ``seqs`` as one zero-padded batch; return each one's trimmed (hidden, attention)."""
    longest = max(len(s) for s in seqs)
    embeds = np.zeros((len(seqs), longest, D_MODEL), dtype=np.float32)  # (B, T, d)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)  # (B, T)
    for row, seq in enumerate(seqs):
        embeds[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    outputs = session.run(None, {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask})
    hidden = outputs[0]  # (B, T, d)
    attn = outputs[1] if len(outputs) > 1 else None  # (B, L, H, T, T)
    return [
        (hidden[i, :n], None if attn is None else attn[i, :, :, :n, :n])
        for i, n in enumerate(len(s) for s in seqs)
    ]
