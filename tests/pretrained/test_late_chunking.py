"""Late chunking: a text with character spans runs once; each span's vector is the mean
of the token embeddings whose first character lies in it (special tokens excluded).

Against transformers' BertModel (eager) on a held-out document, with the offsets of
its fast tokenizer: span embeddings within 1e-4 (the hidden states' tolerance).
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.pretrained.reference import HIDDEN_ATOL, Reference

DOCUMENT = (
    "Berlin is the capital of Germany. It has almost four million inhabitants. "
    "The city is known for its museums, and its river is the Spree."
)


def spans_of(text: str) -> list[list[int]]:
    """The sentences of ``text`` as [start, end) spans (the chunks a RAG index stores)."""
    spans, start = [], 0
    for end in [i + 1 for i, c in enumerate(text) if c == "."] + [len(text)]:
        if text[start:end].strip():
            spans.append([start, end])
        start = end
    return spans


def decode(value: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(value["data"]), "<f4").reshape(value["shape"])


def expected(
    reference: Reference, text: str, spans: list[list[int]], normalize: bool
) -> np.ndarray:
    """HF: the whole text once, then a masked mean per span over its tokens' embeddings."""
    from transformers import BertModel

    from model_export.hf_import import minilm_l6_dir

    batch = reference.tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    offsets = batch.pop("offset_mapping")[0].tolist()
    special = reference.tokenizer.get_special_tokens_mask(
        batch["input_ids"][0].tolist(), already_has_special_tokens=True
    )
    model = BertModel.from_pretrained(minilm_l6_dir(), attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state[0].numpy()
    vectors = []
    for begin, end in spans:
        held = [t for t, (s, _) in enumerate(offsets) if not special[t] and begin <= s < end]
        vector = hidden[held].mean(axis=0)
        vectors.append(vector / np.linalg.norm(vector) if normalize else vector)
    return np.stack(vectors)


@pytest.mark.parametrize("normalize", [False, True])
def test_span_embeddings_match_transformers(
    reference: Reference, minilm_server_url: str, normalize: bool
) -> None:
    spans = spans_of(DOCUMENT)
    assert len(spans) == 3
    body = {
        "inputs": [{"text": DOCUMENT, "spans": spans}, "A plain text beside it."],
        "pooling": "mean",
        "normalize": normalize,
        "return_embeddings": False,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    spanned, plain = r.json()["data"]
    got = decode(spanned["span_embeddings"])
    assert got.shape == (3, 384)
    np.testing.assert_allclose(
        got, expected(reference, DOCUMENT, spans, normalize), rtol=0, atol=HIDDEN_ATOL
    )
    assert spanned["pooled"] is not None  # the whole text's vector comes too
    assert plain["span_embeddings"] is None


def test_late_chunks_see_the_whole_document(minilm_server_url: str) -> None:
    """The point of late chunking: "It" in the second sentence is about Berlin, so its
    chunk vector is nearer a Berlin query than the same sentence embedded alone."""
    spans = spans_of(DOCUMENT)
    second = DOCUMENT[spans[1][0] : spans[1][1]].strip()
    body = {
        "inputs": [{"text": DOCUMENT, "spans": spans}, second, "the population of Berlin"],
        "pooling": "mean",
        "normalize": True,
        "return_embeddings": False,
    }
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    chunks, naive, query = r.json()["data"]
    late = np.asarray(chunks["span_embeddings"][1])
    assert float(late @ np.asarray(query["pooled"])) > float(
        np.asarray(naive["pooled"]) @ np.asarray(query["pooled"])
    )


@pytest.mark.parametrize(
    ("item", "field", "says"),
    [
        ({"text": "abc", "spans": [[0, 9]]}, "inputs[0].spans[0]", "outside the text"),
        ({"text": "abc", "spans": [[2, 1]]}, "inputs[0].spans[0]", "empty or reversed"),
        ({"text": "abc", "spans": [[1, 1]]}, "inputs[0].spans[0]", "empty or reversed"),
        ({"text": "a b c", "spans": [[0, 3], [2, 5]]}, "inputs[0].spans[1]", "overlaps span 0"),
        ({"text": "a b", "spans": [[1, 2]]}, "inputs[0].spans[0]", "holds no token"),
        ({"text": "abc", "spans": []}, "inputs[0].spans", "non-empty list"),
        ({"text": "abc", "spans": [[0, "3"]]}, "inputs[0].spans[0]", "two integers"),
        ({"text": "abc", "spans": [[0, 3]], "x": 1}, "inputs[0]", "unknown keys"),
    ],
)
def test_bad_spans_are_422_naming_the_field(
    minilm_server_url: str, item: dict[str, Any], field: str, says: str
) -> None:
    body = {"inputs": [item], "pooling": "mean", "return_embeddings": False}
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 422, r.text
    error = r.json()
    assert error["error_type"] == "invalid_input", error
    assert error["error"].startswith(f"{field}: ") and says in error["error"], error


def test_spans_need_a_pooling_that_pools_chunks(minilm_server_url: str) -> None:
    for pooling in ("none", "cls"):
        body = {"inputs": [{"text": "a b c", "spans": [[0, 1]]}], "pooling": pooling}
        r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
        assert r.status_code == 422, r.text
        assert "set pooling to mean or max" in r.json()["error"]
