"""Attention norms (Kobayashi et al., 2020): ``attention.measure: "norms"`` answers
α_ij · ‖f_h(x_j)‖ with f_h(x) = (x W_V^h + b_V^h) W_O^h (head h's slice of the output
projection, its bias excluded), checked against transformers' BertModel: its
attention weights and hidden states, and its own value and output-projection weights.
Tolerance: 1e-4 of each map's largest value.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import torch

from tests.pretrained.reference import SENTENCES, Reference

RELATIVE_ATOL = 1e-4


def decode(value: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(value["data"]), "<f4").reshape(value["shape"])


def hf_norms(reference: Reference) -> np.ndarray:
    """(B, L, H, T, T) attention norms from BertModel's own modules and outputs."""
    from transformers import BertModel

    from model_export.hf_import import minilm_l6_dir

    model = BertModel.from_pretrained(minilm_l6_dir(), attn_implementation="eager").eval()
    ids = torch.from_numpy(reference.ids)
    mask = torch.from_numpy(reference.mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True,
                    output_hidden_states=True)  # fmt: skip
        per_layer = []
        heads = model.config.num_attention_heads
        for index, layer in enumerate(model.encoder.layer):
            x = out.hidden_states[index]  # the layer's input (B, T, d)
            b, t, d = x.shape
            v = layer.attention.self.value(x).view(b, t, heads, d // heads).transpose(1, 2)
            w_o = layer.attention.output.dense.weight.view(d, heads, d // heads)  # (d, h, d_k)
            f = torch.einsum("bhtk,dhk->bhtd", v, w_o)  # (B, h, T, d): bias excluded
            norms = f.norm(dim=-1)  # (B, h, T)
            per_layer.append(out.attentions[index] * norms[:, :, None, :])
    return torch.stack(per_layer, dim=1).numpy()


def test_norms_match_transformers(reference: Reference, minilm_server_url: str) -> None:
    body = {
        "inputs": SENTENCES,
        "return_attention": True,
        "attention": {"measure": "norms"},
        "return_embeddings": False,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    want = hf_norms(reference)
    for i, item in enumerate(r.json()["data"]):
        n = reference.lengths[i]
        got = decode(item["attention"])
        assert got.shape == (6, 12, n, n)
        expected = want[i, :, :, :n, :n]
        scale = np.abs(expected).max(axis=(-2, -1), keepdims=True)  # each map's largest
        assert np.all(np.abs(got - expected) <= RELATIVE_ATOL * scale)
    # Norms are not weights: rows no longer sum to 1.
    assert not np.allclose(got.sum(axis=-1), 1.0, atol=1e-2)


def test_reductions_and_v2_use_the_same_norms(minilm_server_url: str) -> None:
    """mean over heads of the norms = the mean the client would take of the full maps;
    /v2 with parameters.attention_measure answers the native numbers (tolerance 0)."""
    text = "Attention is not only a weight."

    def native(attention: dict[str, Any]) -> np.ndarray:
        body = {
            "inputs": [text],
            "return_attention": True,
            "attention": {"measure": "norms", **attention},
            "return_embeddings": False,
            "encoding_format": "base64",
        }
        r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return decode(r.json()["data"][0]["attention"])

    full = native({})
    np.testing.assert_allclose(
        native({"reduce": "mean"}), full.mean(axis=1, keepdims=True), rtol=0, atol=1e-6
    )
    rolled = native({"reduce": "rollout"})
    assert rolled.shape[:2] == (1, 1)
    np.testing.assert_allclose(rolled.sum(axis=-1), 1.0, rtol=0, atol=1e-5)  # rows renormalised
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
        "outputs": [{"name": "attentions"}],
        "parameters": {"attention_measure": "norms"},
    }
    r = httpx.post(f"{minilm_server_url}/v2/models/minilm-l6/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (output,) = r.json()["outputs"]
    v2 = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])[0]
    np.testing.assert_array_equal(v2, full)
    body["parameters"] = {"attention_measure": "length"}
    r = httpx.post(f"{minilm_server_url}/v2/models/minilm-l6/infer", json=body, timeout=60)
    assert r.status_code == 422 and "attention_measure" in r.json()["error"]
