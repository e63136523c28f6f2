"""What the SDK tests share beyond tests/support: real transports that count or rewrite,
and a poisoned model directory.

Nothing here imports ``service``: the tests talk to real servers through the SDK
and compute their expectations from the ONNX files and numpy alone (tests/support).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
from onnx import numpy_helper

from model_export import graph_io
from model_export.manifest import sha256_file


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
