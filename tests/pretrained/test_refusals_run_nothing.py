"""A refused request costs no inference: every 4xx is decided before any graph runs.

Text asking for attention is tokenized, then embedded (``embeddings.onnx``) and
run (``model_attn.onnx``), both by the batcher, whose every onnxruntime run is
counted in ``attnserve_inference_seconds{graph}``. Before, the token embeddings
ran on a codec thread ahead of the response-size check: a 413 had run a graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, server_process
from tests.support.metrics import metric

MODEL = "minilm-l6"
RUNS = "attnserve_inference_seconds_count"
# A small response limit: 8 texts of ~100 tokens with full attention maps
# (6 layers x 12 heads x 100² floats each, ~23 MB) are far over it.
MAX_RESPONSE_BYTES = 1_000_000
TEXT = "attention is all you need " * 20


@pytest.fixture(scope="module")
def server(minilm_repository: Path) -> Iterator[ServerProcess]:
    with server_process(minilm_repository, max_response_bytes=str(MAX_RESPONSE_BYTES)) as running:
        yield running


def runs(url: str) -> dict[str, float]:
    return {
        graph: metric(url, RUNS, model=MODEL, graph=graph)
        for graph in ("token_embeddings", "attention")
    }


def test_a_response_size_refusal_of_text_with_attention_runs_no_graph(
    server: ServerProcess,
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        before = runs(server.url)
        big = {"model": MODEL, "inputs": [TEXT] * 8, "return_attention": True}
        refused = c.post("/v1/encode", json=big)
        assert refused.status_code == 413, refused.text
        assert "response" in refused.json()["error"], refused.text
        assert runs(server.url) == before
        # The positive control: the same kind of request within the limit runs both
        # graphs, each counted once, so the counter above would have seen a run.
        small = {**big, "inputs": ["attention"], "attention": {"reduce": "mean"}}
        served = c.post("/v1/encode", json=small)
        assert served.status_code == 200, served.text
        after = runs(server.url)
        assert after == {graph: count + 1 for graph, count in before.items()}
