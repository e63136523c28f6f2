"""What the service tests share beyond tests/support: the native protocol's wire forms.

Nothing here imports ``service``: the tests talk to the server over HTTP and
compute their expectations from the ONNX files and numpy alone (tests/support).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import numpy as np

from tests.support.inputs import sequences
from tests.support.tiny import MODEL_MAX_SEQ_LEN

TIMEOUT = httpx.Timeout(30.0)


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
