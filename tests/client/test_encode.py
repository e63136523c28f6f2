"""``encode`` against the real server (tiny model) and a direct onnxruntime run.

Tolerance: the server runs the same ONNX graphs, so its arrays match a direct
onnxruntime run to float32 noise: ``ATOL_ORT`` (1e-5). The two wire formats
carry the same float32 values, so they must agree exactly (atol 0).
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

from attnserve_client import AsyncClient, Client, EncodeResult
from attnserve_client._base import Pooling, Reduce
from model_export import graph_io
from tests.client.helpers import RecordingTransport
from tests.support.inputs import sequences
from tests.support.onnx_runs import ATOL_ORT, ort_run
from tests.support.tiny import D_MODEL, MODEL, N_HEADS, N_LAYERS

RAGGED = (9, 4, 1, 13)
ATOL_UNIT = 1e-5  # L2 norm of a normalised float32 vector


def assert_matches_onnxruntime(
    result: EncodeResult,
    seqs: list[np.ndarray],
    embeddings_session: ort.InferenceSession,
    attention_session: ort.InferenceSession,
) -> None:
    assert result.model == MODEL
    assert len(result) == len(seqs)
    assert result.usage.tokens == sum(len(s) for s in seqs)
    assert result.embeddings is not None and result.attention is not None
    assert result.pooled is None
    assert result.tokens == [None] * len(seqs)  # array inputs carry no tokens
    for seq, hidden, attn in zip(seqs, result.embeddings, result.attention, strict=True):
        n = len(seq)
        assert hidden.dtype == np.float32 and attn.dtype == np.float32
        assert hidden.shape == (n, D_MODEL)  # trimmed to this sequence's own length
        assert attn.shape == (N_LAYERS, N_HEADS, n, n)
        want = ort_run(embeddings_session, seq)
        assert list(want) == [graph_io.OUTPUT_HIDDEN]
        want_attn = ort_run(attention_session, seq)
        np.testing.assert_allclose(hidden, want[graph_io.OUTPUT_HIDDEN], rtol=0, atol=ATOL_ORT)
        np.testing.assert_allclose(hidden, want_attn[graph_io.OUTPUT_HIDDEN], rtol=0, atol=ATOL_ORT)
        np.testing.assert_allclose(
            attn, want_attn[graph_io.OUTPUT_ATTENTIONS], rtol=0, atol=ATOL_ORT
        )


def test_sync_encode_matches_onnxruntime(
    sdk_client: Client,
    embeddings_session: ort.InferenceSession,
    attention_session: ort.InferenceSession,
) -> None:
    seqs = sequences(RAGGED, seed=1)
    result = sdk_client.encode(seqs, return_attention=True)
    assert_matches_onnxruntime(result, seqs, embeddings_session, attention_session)


def test_async_encode_matches_onnxruntime(
    server_url: str,
    embeddings_session: ort.InferenceSession,
    attention_session: ort.InferenceSession,
) -> None:
    seqs = sequences(RAGGED, seed=2)

    async def run() -> EncodeResult:
        async with AsyncClient(server_url) as client:
            return await client.encode(seqs, return_attention=True)

    result = asyncio.run(run())
    assert_matches_onnxruntime(result, seqs, embeddings_session, attention_session)


def test_embeddings_only_by_default(
    sdk_client: Client, embeddings_session: ort.InferenceSession
) -> None:
    seqs = sequences(RAGGED, seed=3)
    result = sdk_client.encode(seqs)
    assert result.attention is None and result.pooled is None
    assert result.embeddings is not None
    assert [e.shape for e in result.embeddings] == [(n, D_MODEL) for n in RAGGED]
    for seq, hidden in zip(seqs, result.embeddings, strict=True):
        np.testing.assert_allclose(
            hidden, ort_run(embeddings_session, seq)[graph_io.OUTPUT_HIDDEN], atol=ATOL_ORT
        )


def test_batch_array_input_stacks(
    sdk_client: Client, embeddings_session: ort.InferenceSession
) -> None:
    batch = np.stack(sequences((6, 6, 6), seed=4))  # (B, T, d)
    result = sdk_client.encode(batch)
    stacked = result.stack()
    assert stacked.shape == (3, 6, D_MODEL)
    for row, hidden in zip(batch, stacked, strict=True):
        np.testing.assert_allclose(
            hidden, ort_run(embeddings_session, row)[graph_io.OUTPUT_HIDDEN], atol=ATOL_ORT
        )


def test_stack_refuses_ragged_and_absent_fields(sdk_client: Client) -> None:
    result = sdk_client.encode(sequences((3, 5), seed=5))
    with pytest.raises(ValueError, match="differ in length"):
        result.stack()
    with pytest.raises(ValueError, match="attention"):
        result.stack("attention")


def test_one_2d_array_is_refused_before_sending(sdk_client: Client) -> None:
    with pytest.raises(ValueError, match=r"inputs\[None\]"):
        sdk_client.encode(sequences((4,), seed=6)[0])


@pytest.mark.parametrize("return_attention", [False, True])
def test_wire_formats_give_identical_arrays(server_url: str, return_attention: bool) -> None:
    seqs = sequences((7, 2), seed=7)
    # The per-layer arrays (attention, hidden states) are asked for together or not at all.
    options = {
        "return_attention": return_attention,
        "return_hidden_states": return_attention,
        "pooling": "max",
        "return_embeddings": True,
    }
    transport = RecordingTransport()
    with Client(server_url, transport=transport) as client:
        as_float = client.encode(seqs, wire_format="float", **options)
        # "float" really travels as nested floats, both ways ...
        assert isinstance(transport.request_json["inputs"][0], list)
        assert isinstance(transport.response_json["data"][0]["embeddings"], list)
        as_base64 = client.encode(seqs, wire_format="base64", **options)
        # ... and "base64" as Base64Array objects.
        assert isinstance(transport.request_json["inputs"][0], dict)
        assert isinstance(transport.response_json["data"][0]["embeddings"], dict)
    for field in ("embeddings", "attention", "hidden_states", "pooled"):
        got_float, got_base64 = getattr(as_float, field), getattr(as_base64, field)
        if field in ("attention", "hidden_states") and not return_attention:
            assert got_float is None and got_base64 is None
            continue
        assert got_float is not None and got_base64 is not None
        for a, b in zip(got_float, got_base64, strict=True):
            assert a.dtype == b.dtype == np.float32
            np.testing.assert_array_equal(a, b)  # atol 0: the same float32 values


HIDDEN_SELECTIONS: list[tuple[list[int] | None, bool]] = [
    (None, False),  # model_hidden.onnx, all L + 1 states
    ([0, -1], False),
    ([-1, 1, 0], True),  # model_attn.onnx: order kept
]


@pytest.mark.parametrize(("hidden_layers", "return_attention"), HIDDEN_SELECTIONS)
def test_hidden_states_match_onnxruntime(
    sdk_client: Client,
    hidden_session: ort.InferenceSession,
    attention_session: ort.InferenceSession,
    hidden_layers: list[int] | None,
    return_attention: bool,
) -> None:
    seqs = sequences((6, 1, 11), seed=12)
    result = sdk_client.encode(
        seqs,
        return_hidden_states=True,
        hidden_layers=hidden_layers,
        return_attention=return_attention,
    )
    assert result.hidden_states is not None and result.embeddings is not None
    assert (result.attention is not None) == return_attention
    chosen = hidden_layers if hidden_layers is not None else list(range(N_LAYERS + 1))
    session = attention_session if return_attention else hidden_session
    for seq, states, hidden in zip(seqs, result.hidden_states, result.embeddings, strict=True):
        assert states.dtype == np.float32
        assert states.shape == (len(chosen), len(seq), D_MODEL)
        want = ort_run(session, seq)[graph_io.OUTPUT_HIDDEN_STATES]  # (L + 1, n, d)
        np.testing.assert_allclose(states, want[chosen], rtol=0, atol=ATOL_ORT)
        if chosen[-1] in (-1, N_LAYERS):  # the last layer's output is the embeddings
            np.testing.assert_allclose(states[-1], hidden, rtol=0, atol=ATOL_ORT)


def test_hidden_states_are_absent_unless_asked(server_url: str) -> None:
    transport = RecordingTransport()
    with Client(server_url, transport=transport) as recording:
        # JSON, so the recorded request is the /v1/encode body.
        result = recording.encode(sequences((3,), seed=13), hidden_layers=[0], wire_format="base64")
    assert result.hidden_states is None
    # hidden_layers alone does not ask for them: neither field is sent.
    assert "return_hidden_states" not in transport.request_json
    assert "hidden_states" not in transport.request_json
    assert transport.response_json["data"][0]["hidden_states"] is None


def rollout(attn: np.ndarray) -> np.ndarray:
    """Attention rollout as docs/api.md defines it: [L', H, n, n] -> [1, 1, n, n]."""
    n = attn.shape[-1]
    result = np.eye(n)
    for layer in attn.astype(np.float64).mean(axis=1):  # (n, n)
        mixed = 0.5 * layer + 0.5 * np.eye(n)
        mixed /= mixed.sum(axis=-1, keepdims=True)
        result = mixed @ result
    return result[None, None]


SELECTIONS: list[tuple[list[int] | None, list[int] | None, Reduce | None]] = [
    (None, None, None),
    ([-1], [0, 2], None),
    ([1, 0], [3], "none"),
    (None, None, "mean"),
    ([0], [1, 2, 3], "max"),
    (None, None, "rollout"),
    ([-1], None, "rollout"),
]


@pytest.mark.parametrize(("layers", "heads", "reduce"), SELECTIONS)
def test_attention_selection_shapes_and_values(
    sdk_client: Client,
    attention_session: ort.InferenceSession,
    layers: list[int] | None,
    heads: list[int] | None,
    reduce: Reduce | None,
) -> None:
    seqs = sequences((5, 8), seed=8)
    result = sdk_client.encode(
        seqs, return_attention=True, layers=layers, heads=heads, reduce=reduce
    )
    n_layers = N_LAYERS if layers is None else len(layers)
    n_heads = N_HEADS if heads is None else len(heads)
    assert result.attention is not None
    for seq, attn in zip(seqs, result.attention, strict=True):
        n = len(seq)
        full = ort_run(attention_session, seq)[graph_io.OUTPUT_ATTENTIONS]  # (L, H, n, n)
        chosen = full[layers if layers is not None else slice(None)]
        chosen = chosen[:, heads if heads is not None else slice(None)]  # (L', H', n, n)
        if reduce in (None, "none"):
            assert attn.shape == (n_layers, n_heads, n, n)
            want = chosen
        elif reduce == "mean":
            assert attn.shape == (n_layers, 1, n, n)
            want = chosen.mean(axis=1, keepdims=True)
        elif reduce == "max":
            assert attn.shape == (n_layers, 1, n, n)
            want = chosen.max(axis=1, keepdims=True)
        else:
            assert attn.shape == (1, 1, n, n)
            want = rollout(chosen)
        np.testing.assert_allclose(attn, want, rtol=0, atol=ATOL_ORT)


POOLINGS: list[Pooling] = ["mean", "cls", "max", "last"]


@pytest.mark.parametrize("pooling", POOLINGS)
def test_pooling_with_normalize_gives_unit_vectors(
    sdk_client: Client, embeddings_session: ort.InferenceSession, pooling: Pooling
) -> None:
    seqs = sequences(RAGGED, seed=9)
    result = sdk_client.encode(seqs, pooling=pooling, normalize=True)
    assert result.embeddings is None  # pooling replaces the per-token embeddings by default
    assert result.pooled is not None
    reduce = {
        "mean": np.mean,
        "max": np.max,
        "cls": lambda h, axis: h[0],
        "last": lambda h, axis: h[-1],
    }[pooling]
    for seq, vector in zip(seqs, result.pooled, strict=True):
        assert vector.shape == (D_MODEL,)
        np.testing.assert_allclose(np.linalg.norm(vector), 1.0, rtol=0, atol=ATOL_UNIT)
        want = reduce(ort_run(embeddings_session, seq)[graph_io.OUTPUT_HIDDEN], axis=0)
        want = want / np.linalg.norm(want)
        np.testing.assert_allclose(vector, want, rtol=0, atol=ATOL_ORT)
    stacked = result.stack("pooled")
    assert stacked.shape == (len(RAGGED), D_MODEL)
