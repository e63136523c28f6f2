"""A model exported before the text graph (format_version 2), each graph holding its
own weights (before format 5's shared weights.bin), still loads and serves text, and
answers compact attention (format 6's graph) and selected or float16 maps (format 7's)
from its full maps.

Its text asking only for embeddings runs embeddings.onnx then model.onnx in one
step, as the current format's does (format 3 and 4 ran a text_model.onnx of
their own). Both answers agree (1e-5: the same weights, stored apart; observed 0).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest

from model_export import graph_io
from model_export.manifest import sha256_file
from tests.conftest import running_server
from tests.pretrained.reference import SENTENCES
from tests.support.metrics import scrape

AGREEMENT_ATOL = 1e-5


@pytest.fixture(scope="module")
def format2_url(minilm_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("format2")
    model_dir = repo / "minilm-l6"
    shutil.copytree(minilm_repository / "minilm-l6", model_dir)
    for name in (graph_io.GRAPH_SPARSE, graph_io.STOPWORDS_FILE):
        (model_dir / name).unlink()
    config = model_dir / graph_io.CONFIG_FILE
    raw = json.loads(config.read_text())
    raw["format_version"] = 2
    for key in ("graph", "sparse_graph", "stopwords"):
        raw["text"].pop(key)
        raw["text"].pop(f"{key}_sha256")
    for graph in graph_io.COMPACT_GRAPHS:  # format 6's and 7's
        raw["graphs"].pop(graph)
        (model_dir / graph).unlink()
    # Each graph with its weights inside, as exports before format 5 wrote them.
    for graph in [*raw["graphs"], raw["text"]["embeddings_graph"]]:
        onnx.save(onnx.load(str(model_dir / graph)), str(model_dir / graph))
    (model_dir / raw.pop("weights")).unlink()
    raw.pop("weights_sha256")
    for graph in raw["graphs"]:
        raw["graphs"][graph]["sha256"] = sha256_file(model_dir / graph)
    raw["text"]["embeddings_sha256"] = sha256_file(model_dir / raw["text"]["embeddings_graph"])
    config.write_text(json.dumps(raw))
    with running_server(repo, intra_op_threads="2") as url:
        yield url


def _graph_runs(url: str) -> dict[str, float]:
    return scrape(url).by("graph", "attnserve_inference_seconds_count")


def _both_answer(
    body: dict[str, object], *urls: str
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, set[str]]]:
    """Each server's answer to the same /v1/encode ``body``, and the graphs it ran."""
    answers, ran = {}, {}
    for url in urls:
        before = _graph_runs(url)
        r = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
        assert r.status_code == 200, r.text
        after = _graph_runs(url)
        ran[url] = {g for g in after if after[g] > before.get(g, 0.0)}
        answers[url] = r.json()["data"]
    return answers, ran


def test_format_2_text_runs_as_the_current_format_and_agrees_with_it(
    format2_url: str, minilm_server_url: str
) -> None:
    body = {"inputs": SENTENCES, "pooling": "mean", "normalize": True, "return_embeddings": True}
    answers = {}
    for url in (format2_url, minilm_server_url):
        before = _graph_runs(url)
        r = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
        assert r.status_code == 200, r.text
        after = _graph_runs(url)
        ran = {g for g in after if after[g] > before.get(g, 0.0)}
        # Neither has a text graph: both run the text step (embeddings.onnx, then
        # model.onnx), not the batcher's two steps that attention takes.
        assert ran == {"text"}
        answers[url] = r.json()["data"]
    for old, new in zip(answers[format2_url], answers[minilm_server_url], strict=True):
        assert old["tokens"] == new["tokens"]
        for key in ("embeddings", "pooled"):
            np.testing.assert_allclose(old[key], new[key], rtol=0, atol=AGREEMENT_ATOL)


def test_format_2_has_no_bm42_documents_but_takes_queries(format2_url: str) -> None:
    """A model exported before BM42: documents are 422 unsupported_by_model (re-export),
    queries (tokenizer only) still work, keeping stopwords (it has no list)."""
    url = f"{format2_url}/v1/embed_sparse"
    r = httpx.post(url, json={"inputs": ["the capital of Germany"]}, timeout=60)
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "unsupported_by_model" and "re-export" in r.json()["error"]
    body = {"inputs": ["the capital of Germany"], "kind": "query", "return_text": True}
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert sorted(r.json()["data"][0]["text"]) == ["capit", "germani", "of", "the"]


def test_format_2_answers_compact_attention_from_its_full_maps(
    format2_url: str, minilm_server_url: str
) -> None:
    """No compact graph: top-k rows and summaries come from the full maps in numpy, equal
    to the compact graph's (1e-5: two graphs' float rounding; the same keys)."""
    attention = {"top_k": 4, "summaries": ["entropy", "distance"]}
    body = {"inputs": SENTENCES, "return_attention": True, "attention": attention}
    answers, ran = _both_answer(body, format2_url, minilm_server_url)
    assert "attention" in ran[format2_url] and "compact_attention" in ran[minilm_server_url]
    for old, new in zip(answers[format2_url], answers[minilm_server_url], strict=True):
        np.testing.assert_allclose(old["attention"], new["attention"], rtol=0, atol=AGREEMENT_ATOL)
        assert np.array_equal(old["attention_indices"], new["attention_indices"])
        for name in attention["summaries"]:
            np.testing.assert_allclose(
                old["attention_summaries"][name],
                new["attention_summaries"][name],
                rtol=AGREEMENT_ATOL,
                atol=AGREEMENT_ATOL,
            )


def test_format_2_answers_selected_and_float16_maps_from_its_full_maps(
    format2_url: str, minilm_server_url: str
) -> None:
    """No selected-maps graph: some layers' and heads' maps, float16, are cut and cast
    from the full maps, equal to the selected-maps graph's within float16's rounding of
    two graphs' float32 maps (one float16 ulp at 1: 2^-10)."""
    attention = {"layers": [4, 1], "heads": [7, 0, 3], "dtype": "float16"}
    body = {"inputs": SENTENCES, "return_attention": True, "attention": attention}
    answers, ran = _both_answer(body, format2_url, minilm_server_url)
    assert "attention" in ran[format2_url] and "selected_attention" in ran[minilm_server_url]
    for old, new in zip(answers[format2_url], answers[minilm_server_url], strict=True):
        old_maps, new_maps = np.asarray(old["attention"]), np.asarray(new["attention"])
        assert old_maps.shape == new_maps.shape == (2, 3, len(old["tokens"]), len(old["tokens"]))
        np.testing.assert_allclose(old_maps, new_maps, rtol=0, atol=2.0**-10)
