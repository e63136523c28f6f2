"""Text inputs against the real all-MiniLM-L6-v2 server: tokens, ids, unit sentence vectors.

Tolerances: a normalised float32 vector has norm 1 within 1e-5; the text path
(server-side tokenizer and embedding graph) and the array path (the same
embeddings sent back as arrays) run the same graphs, so they agree within 1e-5.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from attnserve_client import AsyncClient, Client, EncodeResult, TokenizeResult

D_MINILM = 384
ATOL_UNIT = 1e-5
ATOL_SAME_GRAPH = 1e-5
CLS, SEP = 101, 102  # ids of [CLS] and [SEP] in the uncased BERT vocabulary

TEXTS = ["A man is playing a guitar.", "Someone plays the guitar.", "Stock markets fell today."]


@pytest.fixture(scope="module")
def minilm(minilm_server_url: str) -> Iterator[Client]:
    with Client(minilm_server_url) as c:
        yield c


def test_text_encode_gives_tokens_and_unit_vectors(minilm: Client) -> None:
    result = minilm.encode(TEXTS, pooling="mean", normalize=True)
    assert result.model == "minilm-l6"
    assert result.embeddings is None  # pooling replaces per-token embeddings by default
    assert result.pooled is not None
    for tokens in result.tokens:
        assert tokens is not None
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    first = result.tokens[0]
    assert first is not None and "guitar" in first
    assert result.usage.tokens == sum(len(t) for t in result.tokens if t is not None)
    vectors = result.stack("pooled")  # (3, 384)
    assert vectors.shape == (len(TEXTS), D_MINILM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=0, atol=ATOL_UNIT)
    # A real sentence model: the two guitar sentences are closer than the unrelated one.
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated + 0.2, (similar, unrelated)  # measured: 0.84 vs -0.09


def test_tokenize_returns_ids(minilm: Client) -> None:
    result = minilm.tokenize(TEXTS[:2])
    assert result.model == "minilm-l6"
    assert result.embeddings is None
    for tokens, ids in zip(result.tokens, result.ids, strict=True):
        assert len(tokens) == len(ids)
        assert all(isinstance(i, int) for i in ids)
        assert ids[0] == CLS and ids[-1] == SEP
        assert tokens[0] == "[CLS]"
    assert result.usage.sequences == 2
    single = minilm.tokenize(TEXTS[0])
    assert single.ids == result.ids[:1] and single.tokens == result.tokens[:1]


def test_text_path_equals_array_path(minilm: Client) -> None:
    """Tokenize's input embeddings, sent back as arrays, encode as the texts themselves do."""
    tokenized = minilm.tokenize(TEXTS, return_embeddings=True)
    assert tokenized.embeddings is not None
    assert [e.shape for e in tokenized.embeddings] == [(len(t), D_MINILM) for t in tokenized.tokens]
    from_text = minilm.encode(TEXTS, return_embeddings=True, pooling="mean")
    from_arrays = minilm.encode(tokenized.embeddings, return_embeddings=True, pooling="mean")
    assert from_text.tokens == tokenized.tokens and from_arrays.tokens == [None] * len(TEXTS)
    for field in ("embeddings", "pooled"):
        for a, b in zip(getattr(from_text, field), getattr(from_arrays, field), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=ATOL_SAME_GRAPH)


def test_async_text(minilm_server_url: str) -> None:
    async def run() -> tuple[EncodeResult, TokenizeResult]:
        async with AsyncClient(minilm_server_url) as client:
            return (
                await client.encode(TEXTS[:1], pooling="cls", normalize=True),
                await client.tokenize(TEXTS[:1]),
            )

    encoded, tokenized = asyncio.run(run())
    assert encoded.tokens == tokenized.tokens
    assert encoded.pooled is not None
    np.testing.assert_allclose(np.linalg.norm(encoded.pooled[0]), 1.0, rtol=0, atol=ATOL_UNIT)


def test_spans_give_late_chunk_vectors_sync_and_async(minilm_server_url: str) -> None:
    """``spans=``: one vector per span of a text (the text runs once); the other inputs
    keep None. The same numbers from Client and AsyncClient (tolerance 0: one server,
    one request each)."""
    document = "Berlin is the capital of Germany. It has almost four million inhabitants."
    spans = [(0, 33), (33, len(document))]
    options = {"pooling": "mean", "normalize": True, "return_embeddings": False}
    with Client(minilm_server_url) as client:
        result = client.encode([document, TEXTS[0]], spans=[spans, None], **options)
        with pytest.raises(ValueError, match="spans has 1 entries for 2 inputs"):
            client.encode([document, TEXTS[0]], spans=[spans], **options)

    async def run() -> EncodeResult:
        async with AsyncClient(minilm_server_url) as client:
            return await client.encode([document, TEXTS[0]], spans=[spans, None], **options)

    awaited = asyncio.run(run())
    assert result.span_embeddings is not None and awaited.span_embeddings is not None
    vectors, none = result.span_embeddings
    assert none is None and vectors is not None and vectors.shape == (2, D_MINILM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=ATOL_UNIT)
    assert awaited.span_embeddings[0] is not None
    np.testing.assert_array_equal(vectors, awaited.span_embeddings[0])


def test_embed_sparse_documents_and_queries(minilm: Client) -> None:
    """BM42 through the SDK: the stems and values the raw API gives, queries at 1.0."""
    documents = minilm.embed_sparse(
        ["The running runners ran past the lighthouse!"], return_text=True
    )
    (vector,) = documents.vectors
    assert vector.text is not None and sorted(vector.text) == [
        "lighthous",
        "past",
        "ran",
        "run",
        "runner",
    ]
    assert len(vector.indices) == len(vector.values) == 5 and min(vector.values) > 0
    assert documents.usage.sequences == 1
    query = minilm.embed_sparse("lighthouse runners", kind="query")
    assert query.vectors[0].values == [1.0, 1.0] and query.vectors[0].text is None
    assert set(query.vectors[0].indices) <= set(vector.indices)
