"""sentence-transformers ``Dense`` modules, applied: a LaBSE-shaped folder served.

The folder is built and saved by sentence-transformers itself: a small random BERT
(hidden size 48), CLS pooling, ``Dense`` 48 -> 24 with tanh, ``Normalize``, as
LaBSE's (768 -> 768). Exported and served by a real server, its vectors equal
``SentenceTransformer(folder).encode(texts)`` within 1e-5 on /v1/encode,
/v1/embeddings and TEI's /embed: 24-d, where served without its Dense they were the
48-d pooled ones. Token vectors keep the hidden size; span vectors (late chunking)
and int8 answers go through the Dense layer too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.dense import Dense
from sentence_transformers.base.modules.normalize import Normalize
from sentence_transformers.base.modules.transformer import Transformer
from sentence_transformers.sentence_transformer.modules.pooling import Pooling
from transformers import BertConfig, BertModel

from attnserve_client import Client
from model_export.manifest import Manifest, graph_io
from tests.conftest import running_server
from tests.support.heads import _bert_tokenizer

HIDDEN, OUT = 48, 24
ATOL = 1e-5
# Ragged on purpose: sentence-transformers pads its batch, we do not.
TEXTS = ["language agnostic sentence vectors", "bonjour", "a third, longer text to embed here"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("labse")
    config = BertConfig(
        hidden_size=HIDDEN, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96
    )
    BertModel(config).save_pretrained(root / "hf")
    _bert_tokenizer(root / "hf")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        torch.manual_seed(0)
        model = SentenceTransformer(
            modules=[
                Transformer(str(root / "hf")),
                Pooling(HIDDEN, pooling_mode="cls"),
                Dense(HIDDEN, OUT, activation_function=torch.nn.Tanh()),
                Normalize(),
            ],
            device="cpu",
        )
        model.save(str(root / "labse"))
    return root / "labse"


@pytest.fixture(scope="module")
def st_model(folder: Path) -> SentenceTransformer:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def repo(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("labse-models")
    command = ["--checkpoint", str(folder), "--name", "labse", "--out", str(repo / "labse")]
    assert main([*command, "--no-compact-attention"]) == 0  # CI time; not what is tested
    return repo


@pytest.fixture(scope="module")
def url(repo: Path) -> Iterator[str]:
    with running_server(repo, intra_op_threads="2", default_model="labse") as running:
        yield running


def post(url: str, route: str, body: dict[str, object]) -> object:
    answer = httpx.post(f"{url}{route}", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_manifest_lists_the_dense_layer(repo: Path) -> None:
    manifest = Manifest.read(repo / "labse")
    assert manifest.dense is not None and manifest.format_version >= 8  # dense since 8
    layer = manifest.dense.layers[0]
    assert (layer.in_features, layer.out_features, layer.bias, layer.activation) == (
        HIDDEN,
        OUT,
        True,
        "tanh",
    )
    assert manifest.files()[graph_io.DENSE_FILE] == manifest.dense.sha256
    assert (manifest.pooling, manifest.normalize, manifest.pooled_width) == ("cls", True, OUT)
    assert manifest.quantization_ranges is not None
    assert len(manifest.quantization_ranges[0]) == OUT


def test_served_vectors_equal_sentence_transformers(
    url: str, st_model: SentenceTransformer
) -> None:
    want = np.asarray(st_model.encode(TEXTS))
    assert want.shape == (len(TEXTS), OUT)
    encode = post(url, "/v1/encode", {"inputs": TEXTS, "pooling": "cls", "normalize": True})
    embeddings = post(url, "/v1/embeddings", {"model": "labse", "input": TEXTS})
    tei = post(url, "/embed", {"inputs": TEXTS})
    assert isinstance(encode, dict) and isinstance(embeddings, dict)
    served = {
        "encode": [item["pooled"] for item in encode["data"]],
        "embeddings": [item["embedding"] for item in embeddings["data"]],
        "tei": tei,
    }
    for route, got in served.items():
        np.testing.assert_allclose(np.array(got), want, rtol=0, atol=ATOL, err_msg=route)


def test_token_vectors_keep_the_hidden_size_and_spans_pass_the_dense_layer(
    url: str, st_model: SentenceTransformer
) -> None:
    text = TEXTS[2]  # spans of one word each: "a", "longer"
    body = {"inputs": [{"text": text, "spans": [[0, 1], [9, 15]]}], "pooling": "mean"}
    answer = post(url, "/v1/encode", {**body, "normalize": True, "return_embeddings": True})
    assert isinstance(answer, dict)
    item = answer["data"][0]
    tokens = np.array(item["embeddings"])
    assert tokens.shape == (len(item["tokens"]), HIDDEN)
    spans = np.array(item["span_embeddings"])
    assert spans.shape == (2, OUT)
    # Each span's mean is its one token's vector: through sentence-transformers' own Dense.
    firsts = [item["tokens"].index(word) for word in ("a", "longer")]
    with torch.no_grad():
        dense = st_model[2]({"sentence_embedding": torch.tensor(tokens[firsts]).float()})
    want = torch.nn.functional.normalize(dense["sentence_embedding"], dim=-1).numpy()
    np.testing.assert_allclose(spans, want, rtol=0, atol=ATOL)


def test_widths_that_mean_the_pooled_vector_are_the_dense_layers(url: str) -> None:
    card = httpx.get(f"{url}/v1/models/labse").json()
    assert (card["d_model"], card["dimensions"]) == (HIDDEN, OUT)
    with Client(url) as sdk:
        assert sdk.model("labse").dimensions == OUT
    meta = httpx.get(f"{url}/v2/models/labse").json()
    shapes = {output["name"]: output["shape"] for output in meta["outputs"]}
    assert shapes["pooled"] == [-1, OUT] and shapes[graph_io.OUTPUT_HIDDEN] == [-1, -1, HIDDEN]
    int8 = post(
        url,
        "/v1/encode",
        {"inputs": TEXTS[:1], "pooling": "cls", "normalize": True, "embedding_type": "int8"},
    )
    assert isinstance(int8, dict) and len(int8["data"][0]["pooled"]) == OUT


def test_the_similarity_split_is_refused_for_a_dense_model(url: str) -> None:
    """A cosine after a Dense layer does not split into token pairs: 422, no approximation."""
    answer = httpx.post(
        f"{url}/v1/explain/similarity",
        json={"model": "labse", "query": "a", "documents": ["b"]},
        timeout=60,
    )
    assert answer.status_code == 422, answer.text
    assert "Dense" in answer.text
