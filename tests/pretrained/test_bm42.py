"""BM42 sparse vectors (``POST /v1/embed_sparse``) against transformers' BertModel.

The reference runs the whole BertModel (eager, ``output_attentions``), takes the
last layer's [CLS] row averaged over heads, and builds the vector the way
fastembed's BM42 does (WordPiece pieces merged into words, NLTK's English
stopwords and punctuation dropped, Snowball stems, the largest weight per stem,
``abs(mmh3.hash(stem))``). Weights agree within 1e-4 before the log.
"""

from __future__ import annotations

import math
import string
from typing import Any

import httpx
import mmh3
import numpy as np
import pytest
import torch
from py_rust_stemmers import SnowballStemmer

from model_export.stopwords import ENGLISH
from tests.pretrained.reference import Reference
from tests.support.metrics import metric

WEIGHT_ATOL = 1e-4
HELD_OUT = [
    "Qdrant combines dense vectors with sparse BM42 weights for hybrid search.",
    "The running runners ran past the unbelievably tall lighthouse!",
    "Attention, attention: the attention weights are not explanations.",
]


def reference_weights(reference: Reference, text: str) -> dict[str, float]:
    """stem -> weight, from HF's attention of the last layer's [CLS] row."""
    from transformers import BertModel

    from model_export.hf_import import minilm_l6_dir

    batch = reference.tokenizer(text, return_tensors="pt")
    model = BertModel.from_pretrained(minilm_l6_dir(), attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    row = attentions[-1][0, :, 0, :].mean(dim=0).numpy()  # (T,)
    tokens = reference.tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    special = set(reference.tokenizer.all_special_tokens)
    words: list[tuple[str, float]] = []
    for token, weight in zip(tokens, row, strict=True):
        if token in special:
            continue
        if token.startswith("##") and words:
            words[-1] = (words[-1][0] + token[2:], words[-1][1] + float(weight))
        else:
            words.append((token, float(weight)))
    stemmer = SnowballStemmer("english")
    best: dict[str, float] = {}
    for word, weight in words:
        if word in ENGLISH or word in string.punctuation:
            continue
        stem = stemmer.stem_word(word)
        best[stem] = max(best.get(stem, 0.0), weight)
    return best


def embed_sparse(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/embed_sparse", json=body, timeout=60)


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_document_vectors_match_transformers(
    reference: Reference, minilm_server_url: str, alpha: float
) -> None:
    r = embed_sparse(minilm_server_url, inputs=HELD_OUT, alpha=alpha, return_text=True)
    assert r.status_code == 200, r.text
    for text, item in zip(HELD_OUT, r.json()["data"], strict=True):
        want = reference_weights(reference, text)
        got = dict(zip(item["text"], item["values"], strict=True))
        assert set(got) == set(want), (sorted(got), sorted(want))
        for stem, value in got.items():
            weight = math.exp(value ** (1 / alpha)) - 1  # undo log(1 + w) ** alpha
            assert abs(weight - want[stem]) <= WEIGHT_ATOL, (stem, weight, want[stem])
        assert item["indices"] == [abs(mmh3.hash(stem)) for stem in item["text"]]


def test_stems_and_indices_are_fastembeds(minilm_server_url: str) -> None:
    """Stopwords and punctuation dropped, words stemmed, each stem once, hashed with
    MurmurHash3 (seed 0) made non-negative: the indices fastembed writes to Qdrant."""
    r = embed_sparse(minilm_server_url, inputs=[HELD_OUT[1]], return_text=True)
    (item,) = r.json()["data"]
    assert sorted(item["text"]) == ["lighthous", "past", "ran", "run", "runner", "tall", "unbeliev"]
    assert dict(zip(item["text"], item["indices"], strict=True))["run"] == 243905464
    assert all(v > 0 for v in item["values"])


def test_queries_weigh_one_per_stem_without_a_model_run(minilm_server_url: str) -> None:
    def sparse_runs() -> float:
        return metric(minilm_server_url, "attnserve_inference_seconds_count", graph="sparse")

    before = sparse_runs()
    r = embed_sparse(
        minilm_server_url,
        inputs=["What is the capital of Germany?"],
        kind="query",
        return_text=True,
    )
    assert r.status_code == 200, r.text
    (item,) = r.json()["data"]
    assert sorted(item["text"]) == ["capit", "germani"]
    assert item["values"] == [1.0, 1.0]
    assert sparse_runs() == before


def test_many_documents_come_back_in_order(minilm_server_url: str) -> None:
    """130 texts (three parts of 64): each vector equals its text sent alone (1e-6)."""
    texts = [f"document number {i} mentions lighthouses and {i % 7} rivers" for i in range(130)]
    r = embed_sparse(minilm_server_url, inputs=texts, return_text=True)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(130))
    for i in (0, 64, 129):
        (alone,) = embed_sparse(minilm_server_url, inputs=[texts[i]], return_text=True).json()[
            "data"
        ]
        assert alone["text"] == data[i]["text"]
        np.testing.assert_allclose(alone["values"], data[i]["values"], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inputs": ["a"], "alpha": 0}, "alpha"),
        ({"inputs": ["a"], "alpha": -1.0}, "alpha"),
        ({"inputs": ["a"], "alpha": 11}, "alpha"),
        ({"inputs": ["a"], "alpha": "0.5"}, "alpha"),
        ({"inputs": ["a"], "kind": "passage"}, "kind"),
        ({"inputs": "a"}, "inputs"),
        ({"inputs": []}, "inputs"),
        ({"inputs": ["a"], "extra": 1}, "extra"),
    ],
)
def test_bad_requests_are_422_naming_the_field(
    minilm_server_url: str, body: dict[str, Any], field: str
) -> None:
    r = embed_sparse(minilm_server_url, **body)
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(f"{field}"), r.json()
