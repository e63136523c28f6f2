"""Helpers of the SDK tests: inputs, direct onnxruntime runs, real transports, servers.

Nothing here imports ``service``: the tests talk to real servers through the SDK
and compute their expectations from the ONNX files and numpy alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from model_export import graph_io
from model_export.manifest import sha256_file

# The tiny preset the session fixtures export (model_export.config.PRESETS["tiny"]).
D_MODEL = 32
N_HEADS = 4
N_LAYERS = 2
MODEL_MAX_SEQ_LEN = 128
MODEL = "tiny"

# The server runs the same ONNX graphs as the tests do directly, so the two agree to
# float32 noise; a wrong token, head or layer is off by ~1e-1.
ATOL_ORT = 1e-5


def sequences(lengths: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Random float32 [n_i, D_MODEL] sequences."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, D_MODEL), dtype=np.float32) for n in lengths]


def new_session(path: Path) -> ort.InferenceSession:
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


class CountingTransport(httpx.HTTPTransport):
    """A real HTTP transport that counts the requests it sends (e.g. to see retries)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)


class RecordingTransport(CountingTransport):
    """A real HTTP transport that keeps the JSON bodies of the last request and answer."""

    def __init__(self) -> None:
        super().__init__()
        self.request_json: Any = None
        self.response_json: Any = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.request_json = json.loads(request.read()) if request.content else None
        response = super().handle_request(request)
        self.response_json = json.loads(response.read())
        return response


class RewritingTransport(CountingTransport):
    """A real HTTP transport that replaces every request's body and Content-Type, as a
    broken proxy would, so a real server answers the SDK with 400 or 415."""

    def __init__(self, *, content: bytes, content_type: str) -> None:
        super().__init__()
        self.content = content
        self.content_type = content_type

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("content-type", "content-length")
        }
        headers["content-type"] = self.content_type
        rewritten = httpx.Request(
            request.method,
            request.url,
            headers=headers,
            content=self.content,
            extensions=request.extensions,
        )
        return super().handle_request(rewritten)


def poison_model(source: Path, target: Path) -> None:
    """Copy a model directory with one LayerNorm weight set to NaN in both graphs.

    The files' SHA-256 in config.json are updated, so the server loads the model; its
    warm-up then sees non-finite output and the server stays live but never ready.
    """
    shutil.copytree(source, target)
    config = json.loads((target / graph_io.CONFIG_FILE).read_text())
    for graph in graph_io.GRAPH_OUTPUTS:
        path = target / graph
        model = onnx.load(str(path))
        weight = next(i for i in model.graph.initializer if i.name.endswith("norm.weight"))
        poisoned = np.full(numpy_helper.to_array(weight).shape, np.nan, dtype=np.float32)
        weight.CopyFrom(numpy_helper.from_array(poisoned, weight.name))
        onnx.save(model, str(path))
        config["graphs"][graph]["sha256"] = sha256_file(path)
    (target / graph_io.CONFIG_FILE).write_text(json.dumps(config))
