"""``POST /v1/explain/similarity`` on all-MiniLM-L6-v2: why a query and documents match.

One real server on 127.0.0.1 serves the MiniLM export three times (its files copied,
only ``config.json`` rewritten): as exported (mean pooling), as ``minilm-cls`` (CLS
pooling) and as ``minilm-apart`` (mean pooling with a default prompt and
``include_prompt: false``). Driven by raw httpx and by the SDK:

- the score is the served cosine: the dot product of ``/v1/encode``'s (and
  ``/v1/embeddings``') normalised mean-pooled vectors, ≤ 1e-5; the contributions sum to
  it ≤ 1e-5;
- the matrix equals a numpy computation from ``/v1/encode``'s per-token embeddings,
  ``a_i·b_j / (n_q n_d ‖ā‖ ‖b̄‖)``, ≤ 1e-6 per term, with the same tokens;
- the score agrees with sentence-transformers' cosine on the same checkpoint folder
  ≤ 1e-5 (ONNX vs torch: embeddings agree to ~3e-6);
- top pairs, totals, base64 and float answers agree with the matrix;
- other poolings, and a pooling that leaves the prompt out, are 422
  ``unsupported_by_model``; bad bodies are 422 (413 for sizes) naming the field;
- the answer is never larger than the size the engine bounded it by before running.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from attnserve_client import AsyncClient, Client, UnprocessableEntityError
from model_export.hf_import import minilm_l6_dir
from service.engine.similarity import answer_shape
from service.protocols.native.codec import similarity_request
from tests.conftest import running_server

MODEL = "minilm-l6"
QUERY = "how long do tulips bloom"
DOCUMENTS = [
    "Tulips bloom for one to two weeks in spring, longer where the weather stays cool.",
    "The central bank raised interest rates again.",
    "bulbs",
]
SUM_ATOL = 1e-5  # the matrix's sum against the served cosine (float32 terms summed)
SCORE_ATOL = 1e-5  # against /v1/encode's vectors, and against sentence-transformers
TERM_ATOL = 1e-6  # each term against numpy on /v1/encode's token vectors (terms ~1e-2)
TIMEOUT = 60.0


def _copy_tree(source: Path, target: Path, **manifest: Any) -> None:
    """``source``'s files in ``target``, its ``config.json`` updated with ``manifest`` and
    named after ``target``. Copies, not hard links: a second link to the session's
    ``weights.bin`` makes onnx's checker refuse it (a "hardlink attack") in later tests."""
    target.mkdir()
    for path in source.iterdir():
        if path.name != "config.json":
            shutil.copy2(path, target / path.name)
    config = json.loads((source / "config.json").read_text())
    config.update(name=target.name, **manifest)
    (target / "config.json").write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def url(minilm_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("similarity-models")
    exported = minilm_repository / MODEL
    _copy_tree(exported, repo / MODEL)
    _copy_tree(exported, repo / "minilm-cls", pooling="cls")
    _copy_tree(
        exported,
        repo / "minilm-apart",
        prompts={"query": "query: "},
        default_prompt_name="query",
        include_prompt=False,
    )
    with running_server(repo, default_model=MODEL, intra_op_threads="2") as running:
        yield running


def explain(url: str, **body: Any) -> httpx.Response:
    payload = {"query": QUERY, "documents": DOCUMENTS, **body}
    return httpx.post(f"{url}/v1/explain/similarity", json=payload, timeout=TIMEOUT)


def explained(url: str, **body: Any) -> dict[str, Any]:
    answer = explain(url, **body)
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    return data


def encoded(url: str, **options: Any) -> list[dict[str, Any]]:
    body = {"inputs": [QUERY, *DOCUMENTS], **options}
    answer = httpx.post(f"{url}/v1/encode", json=body, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    items: list[dict[str, Any]] = answer.json()["data"]
    return items


def test_the_contributions_sum_to_the_served_cosine(url: str) -> None:
    answer = explained(url)
    pooled = np.array(
        [item["pooled"] for item in encoded(url, pooling="mean", normalize=True)], np.float64
    )
    openai = httpx.post(
        f"{url}/v1/embeddings", json={"model": MODEL, "input": [QUERY, *DOCUMENTS]}, timeout=60
    )
    assert openai.status_code == 200, openai.text
    vectors = np.array([item["embedding"] for item in openai.json()["data"]], np.float64)
    assert answer["model"] == MODEL
    assert [item["index"] for item in answer["data"]] == list(range(len(DOCUMENTS)))
    for item in answer["data"]:
        k = item["index"]
        served = float(pooled[0] @ pooled[1 + k])
        assert abs(item["score"] - served) <= SCORE_ATOL, (item["score"], served)
        assert abs(item["score"] - float(vectors[0] @ vectors[1 + k])) <= SCORE_ATOL
        total = np.asarray(item["contributions"], np.float64).sum()
        assert abs(total - item["score"]) <= SUM_ATOL, (total, item["score"])
    scores = [item["score"] for item in answer["data"]]
    assert scores[0] > scores[1] + 0.3, scores  # the tulip sentence matches, not the bank's


def test_the_matrix_equals_numpy_on_the_encode_token_vectors(url: str) -> None:
    answer = explained(url)
    items = encoded(url)  # per-token embeddings, no pooling
    a = np.asarray(items[0]["embeddings"], np.float64)
    for item in answer["data"]:
        b = np.asarray(items[1 + item["index"]]["embeddings"], np.float64)
        want = (a @ b.T) / (
            len(a) * len(b) * np.linalg.norm(a.mean(axis=0)) * np.linalg.norm(b.mean(axis=0))
        )
        got = np.asarray(item["contributions"], np.float64)
        assert got.shape == (len(a), len(b))
        np.testing.assert_allclose(got, want, rtol=0, atol=TERM_ATOL)
        assert item["query_tokens"] == items[0]["tokens"]
        assert item["document_tokens"] == items[1 + item["index"]]["tokens"]
        assert item["query_tokens"][0] == "[CLS]" and item["document_tokens"][-1] == "[SEP]"


def test_the_score_agrees_with_sentence_transformers(url: str) -> None:
    from sentence_transformers import SentenceTransformer

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")  # a local folder: nothing to download
        model = SentenceTransformer(str(minilm_l6_dir()), device="cpu")
    vectors = np.asarray(model.encode([QUERY, *DOCUMENTS], normalize_embeddings=True), np.float64)
    for item in explained(url)["data"]:
        want = float(vectors[0] @ vectors[1 + item["index"]])
        assert abs(item["score"] - want) <= SCORE_ATOL, (item["score"], want)


@pytest.mark.parametrize("top_pairs", [0, 1, 10, 100])
def test_top_pairs_and_totals_agree_with_the_matrix(url: str, top_pairs: int) -> None:
    with Client(url) as client:
        result = client.explain_similarity(QUERY, DOCUMENTS, top_pairs=top_pairs)
    assert result.model == MODEL and len(result.data) == len(DOCUMENTS)
    assert list(result) == result.data and len(result) == len(DOCUMENTS)  # iterable
    assert result[-1] is result.data[-1]
    assert result.usage.sequences == 1 + len(DOCUMENTS)
    lengths = [len(result.data[0].query_tokens)] + [len(x.document_tokens) for x in result.data]
    assert result.usage.tokens == sum(lengths)
    for x in result.data:
        matrix = x.contributions
        assert matrix.dtype == np.float32
        assert matrix.shape == (len(x.query_tokens), len(x.document_tokens))
        flat = matrix.astype(np.float64).ravel()
        assert len(x.top_pairs) == min(top_pairs, flat.size)
        # Largest first, and none left out larger than the last listed.
        listed = [p.contribution for p in x.top_pairs]
        assert listed == sorted(listed, reverse=True)
        if x.top_pairs:
            assert np.sort(flat)[::-1][len(listed) - 1] == pytest.approx(listed[-1], abs=1e-7)
        for p in x.top_pairs:
            assert p.query_token == x.query_tokens[p.query_index]
            assert p.document_token == x.document_tokens[p.document_index]
            assert abs(p.contribution - float(matrix[p.query_index, p.document_index])) <= 1e-7
        np.testing.assert_allclose(x.query_totals, flat.reshape(matrix.shape).sum(1), atol=1e-6)
        np.testing.assert_allclose(x.document_totals, flat.reshape(matrix.shape).sum(0), atol=1e-6)
        assert abs(x.query_totals.sum() - x.score) <= SUM_ATOL
        assert abs(x.document_totals.sum() - x.score) <= SUM_ATOL


def test_base64_float_sync_and_async_answers_agree(url: str) -> None:
    floats = explained(url, top_pairs=5)
    with Client(url) as client:
        sync = client.explain_similarity(QUERY, DOCUMENTS, top_pairs=5)

    async def asynchronous() -> Any:
        async with AsyncClient(url) as client:
            return await client.explain_similarity(QUERY, DOCUMENTS, top_pairs=5, model=MODEL)

    import asyncio

    awaited = asyncio.run(asynchronous())
    for item, x, y in zip(floats["data"], sync.data, awaited.data, strict=True):
        assert x.score == y.score == item["score"]
        np.testing.assert_array_equal(x.contributions, np.asarray(item["contributions"], "<f4"))
        np.testing.assert_array_equal(x.contributions, y.contributions)
        assert [p.contribution for p in x.top_pairs] == [
            p["contribution"] for p in item["top_pairs"]
        ]
        assert x.top_pairs == y.top_pairs


@pytest.mark.parametrize("model", ["minilm-cls", "minilm-apart"])
def test_a_model_whose_pooling_does_not_split_is_refused(url: str, model: str) -> None:
    answer = explain(url, model=model)
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert error["error_type"] == "unsupported_by_model"
    assert error["error"].startswith(f"model: model {model!r}"), error
    assert ("not mean" if model == "minilm-cls" else "include_prompt false") in error["error"]
    with Client(url) as client, pytest.raises(UnprocessableEntityError):
        client.explain_similarity(QUERY, DOCUMENTS, model=model)
    # The same models serve /v1/encode: only the split is refused.
    body = {"model": model, "inputs": [QUERY], "pooling": "mean"}
    assert httpx.post(f"{url}/v1/encode", json=body, timeout=TIMEOUT).status_code == 200


LONG = "tulips " * 400  # over MiniLM's 256 tokens
BAD_BODIES = {
    "no documents": ({"documents": []}, 422, "documents: "),
    "top_pairs below": ({"top_pairs": -1}, 422, "top_pairs: "),
    "top_pairs above": ({"top_pairs": 101}, 422, "top_pairs: "),
    "top_pairs a string": ({"top_pairs": "5"}, 422, "top_pairs: "),
    "unknown key": ({"normalize": True}, 422, "normalize: "),
    "empty query": ({"query": "  "}, 422, "query: "),
    "no query": ({"query": None}, 422, "query: "),
    "an empty document": ({"documents": ["a", ""]}, 422, "documents[1]: "),
    "a document not text": ({"documents": ["a", 3]}, 422, "documents[1]: "),
    "encoding_format": ({"encoding_format": "npy"}, 422, "encoding_format: "),
    "a long document": ({"documents": ["a", LONG]}, 413, "documents[1]: "),
    "a long query": ({"query": LONG}, 413, "query: "),
    "too many documents": ({"documents": ["a"] * 64}, 413, "documents: "),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_bodies_name_the_field(url: str, case: str) -> None:
    change, status, named = BAD_BODIES[case]
    body = {"query": QUERY, "documents": DOCUMENTS, **change}
    if body["query"] is None:
        del body["query"]
    answer = httpx.post(f"{url}/v1/explain/similarity", json=body, timeout=TIMEOUT)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"].startswith(named), answer.text


def test_truncate_cuts_a_long_document_to_the_window(url: str) -> None:
    answer = explained(url, documents=[LONG], truncate=True)
    (item,) = answer["data"]
    assert len(item["document_tokens"]) == 256
    assert abs(np.asarray(item["contributions"], np.float64).sum() - item["score"]) <= SUM_ATOL


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_the_answer_is_within_the_size_bounded_before_the_run(
    url: str, encoding_format: str
) -> None:
    """The bytes the engine priced the answer at (the codec's WireCost over
    ``answer_shape`` of its tokens) bound the answer actually sent."""
    body = {
        "query": "why do the longest tulip stems bend toward the window " * 4,
        "documents": [LONG, *DOCUMENTS],
        "truncate": True,
        "top_pairs": 100,
        "encoding_format": encoding_format,
    }
    answer = httpx.post(f"{url}/v1/explain/similarity", json=body, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    request, _ = similarity_request(json.dumps(body).encode())
    tokens = [data[0]["query_tokens"], *(item["document_tokens"] for item in data)]
    shape = answer_shape([len(t) for t in tokens], tokens, request.top_pairs)
    bound = request.wire_cost.bytes(shape, MODEL)
    assert len(answer.content) <= bound, (len(answer.content), bound)
    assert len(answer.content) > bound / 4  # a bound, not a guess far off
