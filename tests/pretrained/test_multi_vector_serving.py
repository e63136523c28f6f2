"""Late interaction served: a real server on the four late-interaction layouts
(tests/support/late_interaction.py), exported by the CLI, against the references.

- ``POST /v1/multi-vector`` equals ``MultiVectorEncoder.encode_query`` /
  ``encode_document`` (sentence-transformers loads the MultiVectorEncoder, PyLate and
  Stanford folders itself): the same vectors, row for row, within ATOL.
- bge-m3's dense, sparse and ColBERT outputs from one request equal FlagEmbedding's
  ``BGEM3FlagModel`` math, written out here (the package is not installed).
- ``/v1/rerank`` on a multi-vector model scores by MaxSim, equal to
  ``MultiVectorEncoder.similarity``; its explanation's terms sum to each score and name
  each query token's best document token.
- A vector store running in-process (qdrant-client's local mode, its MaxSim
  multivector comparator) ranks the served document vectors for the served query
  vectors as the server's rerank does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from sentence_transformers import MultiVectorEncoder

from attnserve_client import Client, MaxSimExplanation
from tests.conftest import running_server
from tests.support.late_interaction import DOCUMENTS, HIDDEN, QUERIES, build_all, export_all

ATOL = 1e-5  # float32 graphs against torch eager; observed differences are ~1e-7
ST_LAYOUTS = ("multi_vector_encoder", "pylate", "stanford")
MORE_DOCUMENTS = [
    *DOCUMENTS,
    "a single dense vector per text cannot keep every token's meaning.",
    "late interaction: colbert keeps one vector per token, and maxsim sums the best.",
    "the weather today is sunny with a light breeze from the west",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_all(tmp_path_factory.mktemp("late-checkpoints"))


@pytest.fixture(scope="module")
def url(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repository = export_all(checkpoints, tmp_path_factory.mktemp("late-models"))
    with running_server(repository, default_model="multi-vector-encoder") as base:
        yield base


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, Path]) -> dict[str, MultiVectorEncoder]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        return {
            name: MultiVectorEncoder(str(checkpoints[name]), device="cpu") for name in ST_LAYOUTS
        }


def served(url: str, model: str, texts: list[str], input_type: str, **extra: Any) -> Any:
    body = {"model": model, "input": texts, "input_type": input_type, **extra}
    answer = httpx.post(f"{url}/v1/multi-vector", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("name", ST_LAYOUTS)
@pytest.mark.parametrize("side", ["query", "document"])
def test_served_vectors_equal_multi_vector_encoder(
    url: str, references: dict[str, MultiVectorEncoder], name: str, side: str
) -> None:
    model = references[name]
    texts = QUERIES if side == "query" else DOCUMENTS
    encode = model.encode_query if side == "query" else model.encode_document
    want = [np.asarray(v, dtype=np.float32) for v in encode(texts, convert_to_numpy=True)]
    answer = served(url, name.replace("_", "-"), texts, side)
    got = [np.asarray(item["embeddings"], dtype=np.float32) for item in answer["data"]]
    assert [g.shape for g in got] == [w.shape for w in want]  # the same rows kept
    assert max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True)) <= ATOL


def test_base64_float16_is_the_float32_answer_halved(url: str) -> None:
    with Client(url) as client:
        full = client.multi_vector(DOCUMENTS, model="multi-vector-encoder")
        half = client.multi_vector(DOCUMENTS, model="multi-vector-encoder", dtype="float16")
    for f, h in zip(full, half, strict=True):
        assert f.vectors is not None and h.vectors is not None
        assert h.vectors.dtype == np.float16
        assert np.array_equal(h.vectors, f.vectors.astype(np.float16))


def test_bge_m3_answers_dense_sparse_and_colbert_from_one_request(
    url: str, checkpoints: dict[str, Path]
) -> None:
    """dense = normalize(h[:, 0]); colbert = normalize(colbert_linear(h[:, 1:])) at real
    tokens; sparse = per token id the largest relu(sparse_linear(h)) above 0, special
    tokens left out (FlagEmbedding's BGEM3FlagModel)."""
    from tokenizers import Tokenizer
    from transformers import XLMRobertaModel

    folder = checkpoints["bge_m3"]
    answer = served(
        url, "bge-m3", DOCUMENTS, "document", output=["dense", "sparse", "multi_vector"]
    )
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    unused = {tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>", "<unk>")}
    model = XLMRobertaModel.from_pretrained(folder, attn_implementation="eager").eval()
    colbert_linear, sparse_linear = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, 1)
    colbert_linear.load_state_dict(torch.load(folder / "colbert_linear.pt"))
    sparse_linear.load_state_dict(torch.load(folder / "sparse_linear.pt"))
    for text, item in zip(DOCUMENTS, answer["data"], strict=True):
        ids = tokenizer.encode(text).ids
        with torch.no_grad():
            h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            dense = torch.nn.functional.normalize(h[0], dim=-1).numpy()
            colbert = torch.nn.functional.normalize(colbert_linear(h[1:]), dim=-1).numpy()
            weights = torch.relu(sparse_linear(h)).squeeze(-1).numpy()
        sparse: dict[int, float] = {}
        for token, weight in zip(ids, weights, strict=True):
            if token not in unused and weight > 0:
                sparse[token] = max(sparse.get(token, 0.0), float(weight))
        assert np.abs(np.asarray(item["dense"]) - dense).max() <= ATOL
        vectors = np.asarray(item["embeddings"])
        assert vectors.shape == colbert.shape and np.abs(vectors - colbert).max() <= ATOL
        got = dict(zip(item["sparse"]["indices"], item["sparse"]["values"], strict=True))
        assert got.keys() == sparse.keys()
        assert max(abs(got[k] - sparse[k]) for k in sparse) <= ATOL


@pytest.mark.parametrize("name", ST_LAYOUTS)
def test_rerank_scores_by_maxsim_and_explains_each_score(
    url: str, references: dict[str, MultiVectorEncoder], name: str
) -> None:
    model = references[name]
    query = QUERIES[0]
    want = model.similarity(model.encode_query([query]), model.encode_document(MORE_DOCUMENTS))[
        0
    ].numpy()
    with Client(url) as client:
        result = client.rerank(
            query, MORE_DOCUMENTS, model=name.replace("_", "-"), return_attention=True
        )
    order = sorted(range(len(want)), key=lambda i: (-want[i], i))
    assert [r.index for r in result] == order
    q_vectors = model.encode_query([query], convert_to_numpy=True)[0]
    d_vectors = model.encode_document(MORE_DOCUMENTS, convert_to_numpy=True)
    for ranked in result:
        assert abs(ranked.relevance_score - float(want[ranked.index])) <= ATOL
        x = ranked.explanation
        assert isinstance(x, MaxSimExplanation)
        assert abs(sum(x.terms) - ranked.relevance_score) <= 1e-9  # the split is exact
        sims = q_vectors @ d_vectors[ranked.index].T
        assert x.best == sims.argmax(axis=1).tolist()
        assert len(x.query_tokens) == len(q_vectors)
        assert len(x.document_tokens) == len(d_vectors[ranked.index])


def test_every_rerank_route_scores_by_maxsim(url: str) -> None:
    """TEI's /rerank and Cohere's /v2/rerank answer /v1/rerank's MaxSim scores."""
    model = "multi-vector-encoder"
    with Client(url) as client:
        ranked = client.rerank(QUERIES[0], MORE_DOCUMENTS, model=model)
    scores = {r.index: r.relevance_score for r in ranked}
    tei = httpx.post(f"{url}/rerank", json={"query": QUERIES[0], "texts": MORE_DOCUMENTS})
    assert tei.status_code == 200, tei.text  # the server's default model is this one
    assert {r["index"]: r["score"] for r in tei.json()} == scores
    body = {"model": model, "query": QUERIES[0], "documents": MORE_DOCUMENTS}
    cohere = httpx.post(f"{url}/v2/rerank", json=body)
    assert cohere.status_code == 200, cohere.text
    assert {r["index"]: r["relevance_score"] for r in cohere.json()["results"]} == scores


def test_a_vector_store_ranks_served_vectors_as_the_server_does(url: str) -> None:
    """Served document vectors stored in Qdrant (local mode, MaxSim comparator), searched
    with the served query's vectors: its ranking and scores are the server's rerank."""
    from qdrant_client import QdrantClient, models

    with Client(url) as client:
        documents = client.multi_vector(MORE_DOCUMENTS, model="multi-vector-encoder")
        (query,) = client.multi_vector(
            [QUERIES[0]], model="multi-vector-encoder", input_type="query"
        )
        ranked = client.rerank(QUERIES[0], MORE_DOCUMENTS, model="multi-vector-encoder")
    store = QdrantClient(":memory:")
    dim = documents.items[0].vectors.shape[1]  # type: ignore[union-attr]
    store.create_collection(
        "documents",
        vectors_config=models.VectorParams(
            size=dim,
            distance=models.Distance.DOT,
            multivector_config=models.MultiVectorConfig(
                comparator=models.MultiVectorComparator.MAX_SIM
            ),
        ),
    )
    store.upsert(
        "documents",
        points=[
            models.PointStruct(id=i, vector=item.vectors.tolist())  # type: ignore[union-attr]
            for i, item in enumerate(documents)
        ],
    )
    assert query.vectors is not None
    found = store.query_points("documents", query=query.vectors.tolist(), limit=len(MORE_DOCUMENTS))
    assert [p.id for p in found.points] == [r.index for r in ranked]
    for point, r in zip(found.points, ranked, strict=True):
        assert abs(point.score - r.relevance_score) <= 1e-4  # the store scores in float32


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model": "bge-m3", "input": ["a"], "input_type": "passage"}, 422, "input_type"),
        ({"model": "multi-vector-encoder", "input": ["a"], "output": ["sparse"]}, 422, "output"),
        ({"model": "multi-vector-encoder", "input": ["a"], "output": ["dense"]}, 422, "output"),
        ({"model": "multi-vector-encoder", "input": [" "]}, 422, "input"),
        ({"model": "multi-vector-encoder", "input": []}, 422, "input"),
    ],
)
def test_what_a_model_cannot_answer_is_refused_by_name(
    url: str, body: dict[str, Any], status: int, field: str
) -> None:
    answer = httpx.post(f"{url}/v1/multi-vector", json=body, timeout=60)
    assert answer.status_code == status, answer.text
    assert field in answer.text
