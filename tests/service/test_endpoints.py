"""Models, health, readiness, metrics and OpenAPI endpoints."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_export import graph_io
from service.app import create_app
from service.settings import Settings
from tests.service.helpers import encode
from tests.support.inputs import sequences
from tests.support.metrics import scrape
from tests.support.tiny import D_FF, D_MODEL, MODEL, MODEL_MAX_SEQ_LEN, N_HEADS, N_LAYERS


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- /v1/models ----------------------------------------------------------------------------


def test_model_list_and_card(http_client: httpx.Client, tiny_model_dir: Path) -> None:
    listing = http_client.get("/v1/models")
    assert listing.status_code == 200
    cards = listing.json()["data"]
    assert [c["name"] for c in cards] == [MODEL]
    card = cards[0]
    assert card["d_model"] == D_MODEL
    assert card["heads"] == N_HEADS
    assert card["layers"] == N_LAYERS
    assert card["d_ff"] == D_FF
    assert card["max_seq_len"] == MODEL_MAX_SEQ_LEN
    assert card["default"] is True
    assert card["tokenizer"] is False
    assert card["hidden_states"] is True  # exported with per-layer hidden states
    assert card["causal"] is False and card["window"] is None
    graphs = sorted(p.name for p in tiny_model_dir.glob("*.onnx"))
    assert graphs == [
        "model.onnx",
        "model_attn.onnx",
        "model_attn_compact.onnx",
        "model_attn_select.onnx",
        "model_hidden.onnx",
    ]
    files = [*graphs, graph_io.WEIGHTS_FILE]  # the graphs and the weights they share
    assert card["sha256"] == {name: _file_sha256(tiny_model_dir / name) for name in files}

    single = http_client.get(f"/v1/models/{MODEL}")
    assert single.status_code == 200
    assert single.json() == card


def test_unknown_model_card_is_404(http_client: httpx.Client) -> None:
    r = http_client.get("/v1/models/no-such-model")
    assert r.status_code == 404
    assert r.json()["error_type"] == "model_not_found"
    assert MODEL in r.json()["error"]  # names what is available


# --- health and readiness ------------------------------------------------------------------


def test_real_server_is_live_and_ready(http_client: httpx.Client) -> None:
    live = http_client.get("/health/live")
    assert (live.status_code, live.json()) == (200, {"status": "alive"})
    ready = http_client.get("/health/ready")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


def test_not_ready_before_lifespan_then_ready_after(model_repository: Path) -> None:
    """ASGITransport does not run the lifespan: the app must say 503 until it has run."""
    # No gRPC: the in-process app would take the default port 8001, which need not be free.
    app = create_app(Settings(model_repository=model_repository, grpc_port=0))
    body = {"inputs": [sequences((3,), seed=31)[0].tolist()]}

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
            ready = await c.get("/health/ready")
            assert ready.status_code == 503
            assert ready.json()["error_type"] == "not_ready"
            assert "retry-after" in ready.headers
            live = await c.get("/health/live")
            assert live.status_code == 200  # live, just not ready
            early = await c.post("/v1/encode", json=body)
            assert early.status_code == 503
            assert early.json()["error_type"] == "not_ready"
            early_tokenize = await c.post("/v1/tokenize", json={"text": "x"})
            assert early_tokenize.status_code == 503
            for path in ("/v1/models", "/v1/models/tiny"):
                early_models = await c.get(path)
                assert early_models.status_code == 503, path
                assert early_models.json()["error_type"] == "not_ready"

            # Now run the real lifespan: load, warm up, then 200.
            async with app.router.lifespan_context(app):
                deadline = time.monotonic() + 30.0
                while (await c.get("/health/ready")).status_code != 200:
                    assert time.monotonic() < deadline, "not ready after 30 s"
                    await asyncio.sleep(0.02)
                done = await c.post("/v1/encode", json=body)
                assert done.status_code == 200, done.text
                assert done.json()["usage"] == {"sequences": 1, "tokens": 3}
            after = await c.get("/health/ready")
            assert after.status_code == 503  # shut down: not ready any more

    asyncio.run(scenario())


# --- /metrics ------------------------------------------------------------------------------


def test_metrics_are_prometheus_text(http_client: httpx.Client) -> None:
    r = http_client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")


def test_metrics_count_requests_and_tokens(http_client: httpx.Client, server_url: str) -> None:
    before = scrape(server_url)
    lengths = (5, 2)
    encode(http_client, sequences(lengths, seed=32))
    after = scrape(server_url)
    tokens = "attnserve_tokens_total"
    assert after.value(tokens, model=MODEL) - before.value(tokens, model=MODEL) == sum(lengths)
    # The encode and the first /metrics scrape (counted once it has answered).
    requests = "attnserve_requests_total"
    assert after.value(requests) - before.value(requests) == pytest.approx(2)


def test_metrics_label_requests_by_protocol_and_route(
    http_client: httpx.Client, server_url: str
) -> None:
    """Requests are counted under their protocol and route template, not lumped together
    as "unmatched"; a path no protocol serves counts as plain ``http``."""
    before = scrape(server_url)
    encode(http_client, sequences((3,), seed=33))
    http_client.get("/v1/models")
    http_client.get(f"/v1/models/{MODEL}")
    http_client.get("/health")  # TEI's
    http_client.get(f"/v2/models/{MODEL}")
    http_client.get("/no/such/path")
    after = scrape(server_url)
    seen = sorted(
        (s.labels["protocol"], s.labels["route"], s.labels["status"])
        for s in after.samples
        if s.name == "attnserve_requests_total"
    )
    for protocol, route, status in (
        ("native", "/v1/encode", "200"),
        ("native", "/v1/models", "200"),
        ("native", "/v1/models/{name}", "200"),
        ("tei", "/health", "200"),
        ("kserve_v2", "/v2/models/{model}", "200"),
        ("http", "unmatched", "404"),
    ):
        labels = {"protocol": protocol, "route": route, "status": status}
        counted = after.value("attnserve_requests_total", **labels) - before.value(
            "attnserve_requests_total", **labels
        )
        assert counted == 1, f"seen: {seen}"


# --- OpenAPI -------------------------------------------------------------------------------


def _resolve(doc: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_openapi_describes_encode(http_client: httpx.Client) -> None:
    r = http_client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    post = doc["paths"]["/v1/encode"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/EncodeRequest"
    schema = _resolve(doc, ref)
    assert "inputs" in schema["required"]
    assert {
        "inputs",
        "model",
        "return_attention",
        "attention",
        "pooling",
        "normalize",
        "return_embeddings",
        "encoding_format",
    } <= set(schema["properties"])
    # Every $ref anywhere in the document resolves.
    for each in _refs(doc):
        _resolve(doc, each)
    pooling = json.dumps(schema["properties"]["pooling"])
    assert all(p in pooling for p in ("none", "mean", "cls", "max", "last"))
    assert {"200", "400", "404", "413", "415", "422"} <= set(post["responses"])
    for path in ("/v1/models", "/v1/models/{name}", "/health/live", "/health/ready", "/metrics"):
        assert path in doc["paths"], path
