"""Small helpers shared by the service tests: inputs, wire forms and direct onnxruntime runs.

Nothing here imports ``service``: the tests talk to the server over HTTP and
compute their expectations from the ONNX files and numpy alone.
"""

from __future__ import annotations

import base64
import json
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


def long_attention_body(seed: int) -> bytes:
    """/v1/encode of 16 sequences of the model's full length with every attention map, in
    base64: an answer of megabytes, for tests of slow readers and their memory."""
    seqs = sequences((MODEL_MAX_SEQ_LEN,) * 16, seed=seed)
    body = {
        "inputs": [b64_array(s) for s in seqs],
        "return_attention": True,
        "encoding_format": "base64",
    }
    return json.dumps(body).encode()


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


# The axes of each output that run over tokens, in one sequence's slice (batch axis dropped).
TOKEN_AXES = {
    graph_io.OUTPUT_HIDDEN: (0,),  # [n, d]
    graph_io.OUTPUT_ATTENTIONS: (2, 3),  # [L, H, n, n]
    graph_io.OUTPUT_HIDDEN_STATES: (1,),  # [L + 1, n, d]
    graph_io.OUTPUT_VALUE_NORMS: (2,),  # [L, H, n]
}


def ort_outputs(
    session: ort.InferenceSession, seqs: list[np.ndarray]
) -> list[dict[str, np.ndarray]]:
    """Run ``seqs`` as one zero-padded batch; each one's outputs by name, trimmed to it."""
    longest = max(len(s) for s in seqs)
    width = seqs[0].shape[-1]  # the tiny model's D_MODEL, or another model's
    embeds = np.zeros((len(seqs), longest, width), dtype=np.float32)  # (B, T, d)
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
