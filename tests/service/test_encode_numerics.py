"""POST /v1/encode against direct onnxruntime, PyTorch and numpy references.

Tolerances: the server runs the same ONNX graphs, so it must match a direct
onnxruntime run to float32 noise (atol 1e-5, which still catches any wrong
token, head or layer: those differ by ~1e-1). PyTorch differs from
onnxruntime by up to ~3e-6 (docs of model_export), so it gets atol 1e-4, the
export's own tolerance.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch

from model_export.model import Encoder
from model_export.validate import make_inputs
from tests.service.helpers import as_array, b64_array, encode
from tests.support.inputs import sequences
from tests.support.onnx_runs import ort_encode
from tests.support.tiny import D_MODEL, MODEL, N_HEADS, N_LAYERS

ATOL_ORT = 1e-5  # same graph, possibly different padding: float32 noise only
ATOL_TORCH = 1e-4  # PyTorch eager vs onnxruntime
ATOL_ROW_SUM = 1e-5  # softmax rows in float32

RAGGED = (16, 5, 1, 11, 3)
# The tiny model's random weights give near-uniform attention at unit-scale inputs;
# scaled inputs make heads, layers and the rollout order differ by 1e-2..1e-1, far
# above the 1e-5 tolerance, so a wrong selection or order cannot pass.
SHARP = 8.0


def _embeddings(item: dict[str, Any]) -> np.ndarray:
    return as_array(item["embeddings"])


def test_embeddings_match_onnxruntime_and_pytorch(
    http_client: httpx.Client, embeddings_session: ort.InferenceSession, tiny_encoder: Encoder
) -> None:
    lengths = (9, 4, 1)
    embeds, mask = make_inputs(lengths, D_MODEL, seed=11)  # (B, T, d), (B, T)
    seqs = [embeds[i, :n] for i, n in enumerate(lengths)]
    body = encode(http_client, seqs)

    assert body["model"] == MODEL
    assert body["usage"] == {"sequences": 3, "tokens": sum(lengths)}
    expected = ort_encode(embeddings_session, seqs)
    with torch.no_grad():
        torch_hidden, _, _, _ = tiny_encoder(torch.from_numpy(embeds), torch.from_numpy(mask))
    for i, (item, n) in enumerate(zip(body["data"], lengths, strict=True)):
        assert item["index"] == i
        assert item["attention"] is None and item["pooled"] is None
        assert item["tokens"] is None  # array inputs carry no tokens
        got = _embeddings(item)
        assert got.shape == (n, D_MODEL)
        np.testing.assert_allclose(got, expected[i][0], rtol=0, atol=ATOL_ORT)
        np.testing.assert_allclose(got, torch_hidden[i, :n].numpy(), rtol=0, atol=ATOL_TORCH)


def test_attention_matches_attention_graph(
    http_client: httpx.Client,
    attention_session: ort.InferenceSession,
    embeddings_session: ort.InferenceSession,
    tiny_encoder: Encoder,
) -> None:
    lengths = (7, 12)
    embeds, mask = make_inputs(lengths, D_MODEL, seed=12)
    seqs = [embeds[i, :n] for i, n in enumerate(lengths)]
    body = encode(http_client, seqs, return_attention=True)

    expected = ort_encode(attention_session, seqs)
    hidden_only = ort_encode(embeddings_session, seqs)
    with torch.no_grad():
        _, torch_attn, _, _ = tiny_encoder(torch.from_numpy(embeds), torch.from_numpy(mask))
    assert torch_attn is not None
    for i, (item, n) in enumerate(zip(body["data"], lengths, strict=True)):
        attn = as_array(item["attention"])
        assert attn.shape == (N_LAYERS, N_HEADS, n, n)
        want = expected[i][1]
        assert want is not None
        np.testing.assert_allclose(attn, want, rtol=0, atol=ATOL_ORT)
        np.testing.assert_allclose(
            attn, torch_attn[i, :, :, :n, :n].numpy(), rtol=0, atol=ATOL_TORCH
        )
        # The attention graph's embeddings are the embeddings graph's (atol 1e-5).
        np.testing.assert_allclose(_embeddings(item), hidden_only[i][0], rtol=0, atol=ATOL_ORT)


def test_ragged_batch_equals_each_sequence_alone(http_client: httpx.Client) -> None:
    seqs = sequences(RAGGED, seed=13)
    batch = encode(http_client, seqs, return_attention=True)["data"]
    assert [item["index"] for item in batch] == list(range(len(RAGGED)))
    for seq, item in zip(seqs, batch, strict=True):
        n = len(seq)
        alone = encode(http_client, [seq], return_attention=True)["data"][0]
        emb, attn = _embeddings(item), as_array(item["attention"])
        # Trimmed to this sequence's own length: no padded rows or columns leak out.
        assert emb.shape == (n, D_MODEL)
        assert attn.shape == (N_LAYERS, N_HEADS, n, n)
        np.testing.assert_allclose(emb, _embeddings(alone), rtol=0, atol=ATOL_ORT)
        np.testing.assert_allclose(attn, as_array(alone["attention"]), rtol=0, atol=ATOL_ORT)
        # All attention mass is on real keys: rows over the n real keys sum to 1.
        np.testing.assert_allclose(attn.sum(axis=-1), 1.0, rtol=0, atol=ATOL_ROW_SUM)


# --- attention selection and reduction, against numpy on the attention graph's output ---


def rollout_reference(attn: np.ndarray) -> np.ndarray:
    """Abnar & Zuidema rollout of [L, H, n, n]: R = Â_L … Â_1, Â = rownorm(0.5 mean_h A + 0.5 I)."""
    n = attn.shape[-1]
    mixed = []
    for layer in attn.astype(np.float64):  # (H, n, n)
        a_hat = 0.5 * layer.mean(axis=0) + 0.5 * np.eye(n)  # (n, n)
        mixed.append(a_hat / a_hat.sum(axis=1, keepdims=True))
    # reduce over [Â_L, ..., Â_1]: ((Â_L Â_{L-1}) ...) Â_1
    return functools.reduce(np.matmul, mixed[::-1])[None, None]  # (1, 1, n, n)


def selection_reference(
    attn: np.ndarray, layers: list[int] | None, heads: list[int] | None, reduce: str
) -> np.ndarray:
    """numpy fancy indexing (negative indices included) then the reduction."""
    chosen = attn[list(range(N_LAYERS)) if layers is None else layers]
    chosen = chosen[:, list(range(N_HEADS)) if heads is None else heads]  # (L', H', n, n)
    if reduce == "mean":
        return chosen.mean(axis=1, keepdims=True)
    if reduce == "max":
        return chosen.max(axis=1, keepdims=True)
    if reduce == "rollout":
        return rollout_reference(chosen)
    return chosen


SELECTIONS = [
    # (layers, heads, reduce, expected (L', H') of the answer)
    (None, None, "none", (N_LAYERS, N_HEADS)),
    ([-1], None, "none", (1, N_HEADS)),
    ([1, 0], [0, -1], "none", (2, 2)),
    ([-2], [2], "none", (1, 1)),
    (None, None, "mean", (N_LAYERS, 1)),
    ([0], [1, 3], "mean", (1, 1)),
    (None, None, "max", (N_LAYERS, 1)),
    ([-1], [-2, -1], "max", (1, 1)),
    (None, None, "rollout", (1, 1)),
    ([-1], None, "rollout", (1, 1)),
    ([0, 1], [0, 2], "rollout", (1, 1)),
]


@pytest.mark.parametrize(("layers", "heads", "reduce", "lead"), SELECTIONS)
def test_attention_selection_and_reduce(
    http_client: httpx.Client,
    attention_session: ort.InferenceSession,
    layers: list[int] | None,
    heads: list[int] | None,
    reduce: str,
    lead: tuple[int, int],
) -> None:
    seqs = [SHARP * s for s in sequences((10, 3), seed=14)]
    attention: dict[str, Any] = {"reduce": reduce}
    if layers is not None:
        attention["layers"] = layers
    if heads is not None:
        attention["heads"] = heads
    body = encode(http_client, seqs, return_attention=True, attention=attention)
    full = ort_encode(attention_session, seqs)
    for seq, item, (_, want_full) in zip(seqs, body["data"], full, strict=True):
        assert want_full is not None
        n = len(seq)
        got = as_array(item["attention"])
        assert got.shape == (*lead, n, n)
        want = selection_reference(want_full, layers, heads, reduce)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL_ORT)
        if reduce == "max":
            # A max over heads is no distribution: rows sum to >= 1.
            assert (got.sum(axis=-1) >= 1.0 - ATOL_ROW_SUM).all()
        else:
            np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=0, atol=ATOL_ROW_SUM)


def test_references_can_tell_wrong_answers_apart(
    attention_session: ort.InferenceSession,
) -> None:
    """Guards the references: the mistakes they must catch differ by far more than 1e-5."""
    seq = [SHARP * s for s in sequences((10,), seed=14)]
    ((_, attn),) = ort_encode(attention_session, seq)
    assert attn is not None
    rollout = rollout_reference(attn)[0, 0]
    np.testing.assert_allclose(rollout.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    reversed_order = rollout_reference(attn[::-1])[0, 0]  # Â_1 Â_2 instead of Â_2 Â_1
    no_residual = functools.reduce(np.matmul, attn.astype(np.float64).mean(axis=1)[::-1])
    for wrong in (reversed_order, no_residual, attn.mean(axis=1)[-1]):
        assert np.abs(rollout - wrong).max() > 100 * ATOL_ORT
    assert np.abs(attn[:, 0] - attn[:, 1]).max() > 100 * ATOL_ORT  # heads differ
    assert np.abs(attn[0] - attn[1]).max() > 100 * ATOL_ORT  # layers differ
    assert np.abs(attn.mean(axis=1) - attn.max(axis=1)).max() > 100 * ATOL_ORT


# --- pooling -------------------------------------------------------------------------------


def pooling_reference(hidden: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    vector = {
        "mean": lambda h: h.astype(np.float64).mean(axis=0),
        "max": lambda h: h.max(axis=0),
        "cls": lambda h: h[0],
        "last": lambda h: h[-1],  # the last real token, never a padded position
    }[pooling](hidden)
    if normalize:
        vector = vector / np.linalg.norm(vector)
    return np.asarray(vector, dtype=np.float64)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "last"])
def test_pooling_on_real_tokens(http_client: httpx.Client, pooling: str, normalize: bool) -> None:
    # Ragged, with negative-shifted inputs so a padded zero would win a max and skew a mean.
    seqs = [s - 3.0 for s in sequences(RAGGED, seed=16)]
    body = encode(http_client, seqs, pooling=pooling, normalize=normalize, return_embeddings=True)
    for seq, item in zip(seqs, body["data"], strict=True):
        hidden = _embeddings(item)
        assert hidden.shape == (len(seq), D_MODEL)
        pooled = as_array(item["pooled"])
        assert pooled.shape == (D_MODEL,)
        # float32 sums of <= 16 values: 1e-5 absolute is ample and catches any padding leak.
        np.testing.assert_allclose(
            pooled, pooling_reference(hidden, pooling, normalize), rtol=0, atol=1e-5
        )
        if normalize:
            assert abs(float(np.linalg.norm(pooled)) - 1.0) < 1e-5


def test_pooling_defaults_drop_embeddings(http_client: httpx.Client) -> None:
    seqs = sequences((4, 2), seed=17)
    pooled = encode(http_client, seqs, pooling="mean")["data"]
    assert all(item["embeddings"] is None for item in pooled)
    assert all(len(item["pooled"]) == D_MODEL for item in pooled)
    plain = encode(http_client, seqs)["data"]
    assert all(item["pooled"] is None and item["attention"] is None for item in plain)
    embeddings_off = encode(http_client, seqs, return_embeddings=False, return_attention=True)[
        "data"
    ]
    assert all(item["embeddings"] is None for item in embeddings_off)
    assert [as_array(i["attention"]).shape for i in embeddings_off] == [
        (N_LAYERS, N_HEADS, 4, 4),
        (N_LAYERS, N_HEADS, 2, 2),
    ]


# --- base64 --------------------------------------------------------------------------------


def test_base64_round_trip_is_bitwise(http_client: httpx.Client) -> None:
    seqs = sequences((6, 2), seed=18)
    options: dict[str, Any] = {
        "return_attention": True,
        "attention": {"layers": [-1], "reduce": "mean"},
        "pooling": "max",
        "return_embeddings": True,
    }
    as_floats = encode(http_client, seqs, **options)
    b64_in = encode(http_client, [b64_array(s) for s in seqs], **options)
    b64_both = encode(
        http_client, [b64_array(s) for s in seqs], encoding_format="base64", **options
    )

    for f, bi, bb, seq in zip(
        as_floats["data"], b64_in["data"], b64_both["data"], seqs, strict=True
    ):
        for key, shape in (
            ("embeddings", [len(seq), D_MODEL]),
            ("attention", [1, 1, len(seq), len(seq)]),
            ("pooled", [D_MODEL]),
        ):
            wire = bb[key]
            assert set(wire) == {"shape", "dtype", "data"}
            assert wire["shape"] == shape and wire["dtype"] == "float32"
            from_floats = as_array(f[key])
            # Exact: the float32 values behind the JSON floats are the base64 bytes.
            np.testing.assert_array_equal(from_floats.view(np.uint32), as_array(wire).view("<u4"))
            np.testing.assert_array_equal(from_floats, as_array(bi[key]))
    assert as_floats["usage"] == b64_in["usage"] == b64_both["usage"]


def test_rollout_uses_each_layer_once_bottom_up(http_client: httpx.Client) -> None:
    """Rollout is a product over layers in model order: [1, 0] means layers 0 then 1."""
    x = sequences((6,), seed=77)[0] * np.float32(8)
    opts = {"return_attention": True, "encoding_format": "base64"}
    answers = [
        encode(http_client, [x], attention={"layers": layers, "reduce": "rollout"}, **opts)
        for layers in ([1, 0], [0, 1], None)
    ]
    got = [as_array(answer["data"][0]["attention"]) for answer in answers]
    np.testing.assert_array_equal(got[0], got[1])  # same computation: exactly equal
    np.testing.assert_array_equal(got[1], got[2])
