"""Compact attention (top-k rows, thresholds, float16 maps, selected layers and heads,
per-head summaries) through a real server on all-MiniLM-L6-v2, against transformers'
eager attentions on held-out sentences (none of them is used by the export or its
validation).

Tolerances: kept weights 1e-4 of eager's (as the full maps); top-k indices equal to
eager's sorted order (ties to the lower key) wherever eager's neighbouring weights are
more than 1e-4 apart, and where they are closer the kept keys' eager weights equal
eager's top values within 1e-4; float16 maps 1e-3; summaries 1e-5 of a numpy
computation from eager's maps (entropy, weights) and 1e-5 relative for the distance.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.pretrained.reference import ATTENTION_ATOL
from tests.support.metrics import scrape

HELD_OUT = [
    "Rivers carve canyons over millions of years.",
    "She sold the old piano to a collector in Vienna.",
    "Why?",
    "Compact answers keep only what the reader looks at: a few keys per query.",
]
FP16_ATOL = 1e-3
SUMMARY_ATOL = 1e-5
LAYERS, HEADS = 6, 12


@pytest.fixture(scope="module")
def eager() -> list[np.ndarray]:
    """Per held-out sentence, eager BertModel's maps [L, H, n, n] (its real tokens)."""
    from transformers import BertModel, BertTokenizerFast

    from model_export.hf_import import minilm_l6_dir

    path = minilm_l6_dir()
    tokenizer = BertTokenizerFast.from_pretrained(path)
    model = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    maps = []
    for sentence in HELD_OUT:
        batch = tokenizer([sentence], return_tensors="pt")
        with torch.no_grad():
            out = model(**batch, output_attentions=True)
        maps.append(torch.stack(out.attentions, dim=1)[0].numpy())
    return maps


def decode(value: Any) -> np.ndarray:
    if isinstance(value, dict):
        dtype = {"float32": "<f4", "float16": "<f2", "int32": "<i4"}[value["dtype"]]
        return np.frombuffer(base64.b64decode(value["data"]), dtype).reshape(value["shape"])
    return np.asarray(value)


def encode(url: str, attention: dict[str, Any], fmt: str = "base64", **extra: Any) -> Any:
    body = {
        "inputs": HELD_OUT,
        "return_attention": True,
        "attention": attention,
        "return_embeddings": False,
        "encoding_format": fmt,
        **extra,
    }
    r = httpx.post(f"{url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def reference_summaries(maps: np.ndarray) -> np.ndarray:
    """[..., n, n] -> [..., n, 6], written from the definitions in docs/api.md."""
    n = maps.shape[-1]
    i = np.arange(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(maps > 0, maps * np.log(maps), 0.0)
    previous = np.zeros(maps.shape[:-1])
    following = np.zeros(maps.shape[:-1])
    for row in range(n):
        if row > 0:
            previous[..., row] = maps[..., row, row - 1]
        if row < n - 1:
            following[..., row] = maps[..., row, row + 1]
    return np.stack(
        [
            -terms.sum(-1),
            maps[..., 0],
            maps[..., i, i],
            previous,
            following,
            (maps * np.abs(i[:, None] - i[None, :])).sum(-1),
        ],
        axis=-1,
    )


def check_top_rows(values: np.ndarray, indices: np.ndarray, want: np.ndarray, k: int) -> None:
    """``values``/``indices`` [.., n, k] against eager maps ``want`` [.., n, n]."""
    order = np.argsort(-want, axis=-1, kind="stable")[..., :k]  # ties to the lower key
    want_values = np.take_along_axis(want, order, axis=-1)
    assert values.shape == indices.shape == (*want.shape[:-1], k)
    assert np.abs(values - want_values).max() <= ATTENTION_ATOL
    pointed = np.take_along_axis(want, indices.astype(np.int64), axis=-1)
    assert np.abs(pointed - want_values).max() <= ATTENTION_ATOL
    # Where eager's sorted neighbours are clearly apart, the keys are eager's own.
    full = np.sort(want, axis=-1)[..., ::-1]
    gaps = np.diff(-full, axis=-1)[..., :k]  # gap after each of the first k
    before = np.concatenate([np.full((*gaps.shape[:-1], 1), np.inf), gaps[..., :-1]], -1)
    clear = (gaps > ATTENTION_ATOL) & (before > ATTENTION_ATOL)
    assert clear.mean() > 0.5  # the check below is not vacuous
    assert np.array_equal(indices[clear], order[clear])


@pytest.mark.parametrize("k", [1, 3])
def test_top_k_equals_eager(minilm_server_url: str, eager: list[np.ndarray], k: int) -> None:
    data = encode(minilm_server_url, {"top_k": k})
    for item, want in zip(data, eager, strict=True):
        values, indices = decode(item["attention"]), decode(item["attention_indices"])
        assert item["attention_indices"]["dtype"] == "int32"
        check_top_rows(values, indices, want, k)


def test_top_k_of_every_key_is_the_full_map(minilm_server_url: str) -> None:
    """k = n answers every weight: scattered back, the full map the full graph serves."""
    full = encode(minilm_server_url, {})
    for index, item in enumerate(full):
        dense = decode(item["attention"])
        n = dense.shape[-1]
        body = {
            "inputs": [HELD_OUT[index]],
            "return_attention": True,
            "attention": {"top_k": n},
            "return_embeddings": False,
        }
        r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
        got = r.json()["data"][0]
        values, indices = np.asarray(got["attention"]), np.asarray(got["attention_indices"])
        scattered = np.zeros_like(dense)
        np.put_along_axis(scattered, indices, values, axis=-1)
        # Two graphs, fused differently by onnxruntime: rounding apart (observed 1.0e-6).
        assert np.abs(scattered - dense).max() <= 1e-5


def test_selection_and_json_agree_with_base64(minilm_server_url: str) -> None:
    attention = {"top_k": 2, "layers": [-1, 0], "heads": [5, 2, 7]}
    every = encode(minilm_server_url, {"top_k": 2})
    picked = encode(minilm_server_url, attention)
    as_json = encode(minilm_server_url, attention, fmt="float")
    for whole, item, plain in zip(every, picked, as_json, strict=True):
        chosen = np.ix_([5, 0], [5, 2, 7])
        assert np.array_equal(decode(item["attention"]), decode(whole["attention"])[chosen])
        indices = decode(item["attention_indices"])
        assert np.array_equal(indices, decode(whole["attention_indices"])[chosen])
        assert np.array_equal(np.asarray(plain["attention_indices"]), indices)
        assert np.array_equal(np.asarray(plain["attention"], np.float32), decode(item["attention"]))


def test_threshold_keeps_the_weights_above_it(
    minilm_server_url: str, eager: list[np.ndarray]
) -> None:
    threshold = 0.2
    for item, want in zip(encode(minilm_server_url, {"threshold": threshold}), eager, strict=True):
        values, indices = decode(item["attention"]), decode(item["attention_indices"])
        kept = indices >= 0
        assert np.all(values[~kept] == 0) and np.all(values[kept] > threshold)
        counts = (want > threshold).sum(axis=-1)
        near = np.abs(want - threshold) <= ATTENTION_ATOL  # either side is right there
        exact = ~near.any(axis=-1)
        assert np.array_equal(kept.sum(axis=-1)[exact], counts[exact])
        assert values.shape[-1] == max(int(kept.sum(axis=-1).max()), 1)
        pointed = np.take_along_axis(want, np.where(kept, indices, 0), axis=-1)
        assert np.abs(np.where(kept, pointed - values, 0)).max() <= ATTENTION_ATOL


def test_reduced_maps_are_cut_after_reduction(minilm_server_url: str) -> None:
    """mean over heads, then top-k (numpy): the top keys of the served mean map."""
    mean = encode(minilm_server_url, {"reduce": "mean"})
    cut = encode(minilm_server_url, {"reduce": "mean", "top_k": 2})
    for whole, item in zip(mean, cut, strict=True):
        check_top_rows(decode(item["attention"]), decode(item["attention_indices"]),
                       decode(whole["attention"]), 2)  # fmt: skip


def graphs_run(url: str, send: Callable[[], Any]) -> tuple[Any, set[str]]:
    """``send()``'s answer and the graphs (metric labels) that ran for it after the text
    became token embeddings."""
    before = scrape(url).by("graph", "attnserve_inference_seconds_count")
    answer = send()
    after = scrape(url).by("graph", "attnserve_inference_seconds_count")
    ran = {graph for graph in after if after[graph] > before.get(graph, 0.0)}
    return answer, ran - {"token_embeddings"}


def test_float16_maps(minilm_server_url: str, eager: list[np.ndarray]) -> None:
    """Cast inside the selected-maps graph, layer by layer: eager's within 1e-3."""
    data, ran = graphs_run(
        minilm_server_url, lambda: encode(minilm_server_url, {"dtype": "float16"})
    )
    assert ran == {"selected_attention"}
    for item, want in zip(data, eager, strict=True):
        assert item["attention"]["dtype"] == "float16"
        got = decode(item["attention"])
        assert got.dtype == np.float16 and got.shape == want.shape
        assert np.abs(got.astype(np.float32) - want).max() <= FP16_ATOL
    # top-k values in float16 too
    item = encode(minilm_server_url, {"dtype": "float16", "top_k": 2})[0]
    assert decode(item["attention"]).dtype == np.float16


SELECTIONS: list[dict[str, Any]] = [
    {"layers": [4, 0], "heads": [11, 3, 1]},
    {"layers": [-1]},
    {"heads": [6]},
    {"layers": [2, 3], "heads": [0, 9], "dtype": "float16"},
    {"layers": [5], "dtype": "float16"},
]


@pytest.mark.parametrize("attention", SELECTIONS, ids=lambda a: json.dumps(a))
def test_selected_maps_equal_eager(
    minilm_server_url: str, eager: list[np.ndarray], attention: dict[str, Any]
) -> None:
    """Fewer layers or heads: only theirs leave the selected-maps graph, in the asked
    order, eager's within 1e-4 (float32) or 1e-3 (float16)."""
    data, ran = graphs_run(minilm_server_url, lambda: encode(minilm_server_url, attention))
    assert ran == {"selected_attention"}
    layers = [layer % LAYERS for layer in attention.get("layers", range(LAYERS))]
    heads = attention.get("heads", list(range(HEADS)))
    half = attention.get("dtype") == "float16"
    for item, want in zip(data, eager, strict=True):
        got = decode(item["attention"])
        assert got.dtype == (np.float16 if half else np.float32)
        assert got.shape == (len(layers), len(heads), *want.shape[2:])
        tolerance = FP16_ATOL if half else ATTENTION_ATOL
        assert np.abs(got.astype(np.float32) - want[np.ix_(layers, heads)]).max() <= tolerance


def test_selections_asked_at_once_each_get_their_own(
    minilm_server_url: str, eager: list[np.ndarray]
) -> None:
    """Requests of different selections queued together: a run holds one selection,
    so each answer is its own layers and heads (eager's within 1e-3 for all)."""
    with ThreadPoolExecutor(len(SELECTIONS) * 2) as pool:
        answers = list(pool.map(lambda a: encode(minilm_server_url, a), SELECTIONS * 2))
    for attention, data in zip(SELECTIONS * 2, answers, strict=True):
        layers = [layer % LAYERS for layer in attention.get("layers", range(LAYERS))]
        heads = attention.get("heads", list(range(HEADS)))
        for item, want in zip(data, eager, strict=True):
            got = decode(item["attention"]).astype(np.float32)
            assert np.abs(got - want[np.ix_(layers, heads)]).max() <= FP16_ATOL


@pytest.mark.parametrize(
    "attention",
    [
        {"layers": [5, 1], "reduce": "mean"},
        {"layers": [3, 0], "heads": [2, 8], "reduce": "max"},
        {"layers": [1, 3], "reduce": "rollout"},
        {"heads": [4, 2], "top_k": 3, "reduce": "mean"},
        {"layers": [0], "heads": [1, 5], "summaries": ["entropy"], "dtype": "float16"},
    ],
    ids=lambda a: json.dumps(a),
)
def test_selected_graph_answers_as_the_full_graph(
    minilm_server_url: str, attention: dict[str, Any]
) -> None:
    """Reductions, rollout, top rows and summaries of a selection: the same answer from
    the selected-maps graph as from the full graph (which hidden states make the server
    run), 1e-6 apart (two graphs' float32 rounding), float16 maps one float16 ulp at
    0.5..1 (2^-11: that rounding can round them apart)."""
    selected, ran = graphs_run(minilm_server_url, lambda: encode(minilm_server_url, attention))
    assert ran == {"selected_attention"}
    full, ran = graphs_run(
        minilm_server_url,
        lambda: encode(
            minilm_server_url, attention, return_hidden_states=True, hidden_states={"layers": [0]}
        ),
    )
    assert ran == {"attention"}
    for new, old in zip(selected, full, strict=True):
        new_maps, old_maps = decode(new["attention"]), decode(old["attention"])
        assert new_maps.dtype == old_maps.dtype and new_maps.shape == old_maps.shape
        tolerance = 2.0**-11 if new_maps.dtype == np.float16 else 1e-6
        difference = np.abs(new_maps.astype(np.float32) - old_maps.astype(np.float32))
        assert difference.max() <= tolerance
        if new["attention_indices"] is not None:
            # The same keys, but where near-ties may swap: each key but the last (whose
            # follower is not answered) more than 1e-5 from its kept neighbours.
            new_keys, old_keys = decode(new["attention_indices"]), decode(old["attention_indices"])
            apart = np.abs(np.diff(old_maps, axis=-1)) > 1e-5  # (.., k - 1): i to i + 1
            clear = apart.copy()
            clear[..., 1:] &= apart[..., :-1]
            assert clear.any() and np.array_equal(
                new_keys[..., :-1][clear], old_keys[..., :-1][clear]
            )
        for name, value in (new["attention_summaries"] or {}).items():
            assert np.abs(decode(value) - decode(old["attention_summaries"][name])).max() <= 1e-6


@pytest.mark.parametrize("maps", [False, True])
def test_summaries_equal_numpy_from_eager_maps(
    minilm_server_url: str, eager: list[np.ndarray], maps: bool
) -> None:
    """From the compact graph (no maps) and from the full maps' path: the same numbers."""
    names = ["entropy", "first", "self", "previous", "next", "distance"]
    per_token = encode(
        minilm_server_url, {"summaries": names, "summaries_per_token": True, "maps": maps}
    )
    per_sequence = encode(minilm_server_url, {"summaries": names, "maps": maps})
    for token_item, item, want in zip(per_token, per_sequence, eager, strict=True):
        assert (item["attention"] is None) == (not maps)
        rows = reference_summaries(want.astype(np.float64))  # (L, H, n, 6)
        assert list(item["attention_summaries"]) == names
        for s, name in enumerate(names):
            got_rows = decode(token_item["attention_summaries"][name])
            got = decode(item["attention_summaries"][name])
            assert got_rows.shape == rows.shape[:-1] and got.shape == (LAYERS, HEADS)
            tolerance = SUMMARY_ATOL * max(1.0, float(np.abs(rows[..., s]).max()))
            assert np.abs(got_rows - rows[..., s]).max() <= tolerance, name
            assert np.abs(got - rows[..., s].mean(-1)).max() <= tolerance, name


def test_summaries_of_selected_heads(minilm_server_url: str) -> None:
    every = encode(minilm_server_url, {"summaries": ["entropy"], "maps": False})
    picked = encode(
        minilm_server_url, {"summaries": ["entropy"], "maps": False, "layers": [2], "heads": [-1]}
    )
    for whole, item in zip(every, picked, strict=True):
        want = decode(whole["attention_summaries"]["entropy"])[2:3, 11:12]
        assert np.array_equal(decode(item["attention_summaries"]["entropy"]), want)


@pytest.mark.parametrize(
    ("attention", "field"),
    [
        ({"top_k": 0}, "top_k"),
        ({"top_k": -3}, "top_k"),
        ({"top_k": 4}, "top_k"),  # "Why?" has 4 tokens: fine; 5 is not (below)
        ({"top_k": 500}, "top_k"),
        ({"threshold": -0.1}, "threshold"),
        ({"threshold": 1.5}, "threshold"),
        ({"top_k": 2, "threshold": 0.1}, "threshold"),
        ({"summaries": ["entropy", "surprise"]}, "summaries"),
        ({"maps": False}, "maps"),
        ({"dtype": "float64"}, "dtype"),
    ],
)
def test_bad_options_name_their_field(
    minilm_server_url: str, attention: dict[str, Any], field: str
) -> None:
    body = {"inputs": HELD_OUT, "return_attention": True, "attention": attention}
    if attention == {"top_k": 4}:
        attention["top_k"] = 5  # one more key than "Why?" has
    r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=60)
    assert r.status_code == 422, r.text
    error = r.json()
    assert error["error_type"] == "invalid_input"
    assert f"attention.{field}" in error["error"], error


def test_open_inference_http_and_grpc_carry_compact_attention(
    minilm_server_url: str, minilm_grpc_address: str
) -> None:
    """tritonclient over /v2 binary and gRPC: FP16 top-k values, INT32 keys and the
    summaries, equal to the native answer (base64 of the same bytes)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    attention = {"top_k": 3, "dtype": "float16", "summaries": ["entropy", "distance"]}
    native = encode(minilm_server_url, attention)
    params = {
        "attention_top_k": 3,
        "attention_dtype": "FP16",
        "attention_summaries": "entropy,distance",
    }
    names = ["attentions", "attention_indices", "attention_summaries"]
    texts = np.array([s.encode() for s in HELD_OUT], dtype=np.object_)
    http = httpclient.InferenceServerClient(minilm_server_url.removeprefix("http://"))
    text = httpclient.InferInput("text", [len(HELD_OUT)], "BYTES")
    text.set_data_from_numpy(texts, binary_data=True)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
    got_http = http.infer("minilm-l6", [text], outputs=wanted, parameters=params)
    rpc = grpcclient.InferenceServerClient(minilm_grpc_address)
    text_rpc = grpcclient.InferInput("text", [len(HELD_OUT)], "BYTES")
    text_rpc.set_data_from_numpy(texts)
    wanted_rpc = [grpcclient.InferRequestedOutput(n) for n in names]
    got_rpc = rpc.infer("minilm-l6", [text_rpc], outputs=wanted_rpc, parameters=params)
    for got in (got_http, got_rpc):
        values = got.as_numpy("attentions")
        indices = got.as_numpy("attention_indices")
        summaries = got.as_numpy("attention_summaries")
        assert values.dtype == np.float16 and indices.dtype == np.int32
        assert summaries.shape == (len(HELD_OUT), 2, LAYERS, HEADS)
        for row, item in enumerate(native):
            n = decode(item["attention"]).shape[2]
            assert np.array_equal(values[row, :, :, :n], decode(item["attention"]))
            assert np.array_equal(indices[row, :, :, :n], decode(item["attention_indices"]))
            assert not values[row, :, :, n:].any()  # padded query rows
            for s, name in enumerate(["entropy", "distance"]):
                want = decode(item["attention_summaries"][name])
                assert np.array_equal(summaries[row, s], want)


def test_open_inference_selects_layers_and_heads(
    minilm_server_url: str, minilm_grpc_address: str
) -> None:
    """attention_layers/attention_heads (comma-separated) over /v2 binary and gRPC: the
    native answer's maps, from the selected-maps graph."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    native = encode(minilm_server_url, {"layers": [-1, 2], "heads": [7, 0], "dtype": "float16"})
    params = {"attention_layers": "-1,2", "attention_heads": "7, 0", "attention_dtype": "FP16"}
    texts = np.array([s.encode() for s in HELD_OUT], dtype=np.object_)
    http = httpclient.InferenceServerClient(minilm_server_url.removeprefix("http://"))
    text = httpclient.InferInput("text", [len(HELD_OUT)], "BYTES")
    text.set_data_from_numpy(texts, binary_data=True)
    wanted = [httpclient.InferRequestedOutput("attentions", binary_data=True)]
    rpc = grpcclient.InferenceServerClient(minilm_grpc_address)
    text_rpc = grpcclient.InferInput("text", [len(HELD_OUT)], "BYTES")
    text_rpc.set_data_from_numpy(texts)
    wanted_rpc = [grpcclient.InferRequestedOutput("attentions")]
    got_http, ran = graphs_run(
        minilm_server_url,
        lambda: http.infer("minilm-l6", [text], outputs=wanted, parameters=params),
    )
    assert ran == {"selected_attention"}
    got_rpc = rpc.infer("minilm-l6", [text_rpc], outputs=wanted_rpc, parameters=params)
    for got in (got_http, got_rpc):
        maps = got.as_numpy("attentions")
        assert maps.dtype == np.float16 and maps.shape[1:3] == (2, 2)
        for row, item in enumerate(native):
            n = decode(item["attention"]).shape[2]
            assert np.array_equal(maps[row, :, :, :n, :n], decode(item["attention"]))


def test_open_inference_refuses_mismatched_attention_parameters(minilm_server_url: str) -> None:
    url = f"{minilm_server_url}/v2/models/minilm-l6/infer"
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Why?"]}
    for outputs, params, says in [
        (["attention_indices"], {}, "attention_top_k"),
        (["attention_summaries"], {}, "attention_summaries"),
        (["attentions"], {"attention_top_k": 0}, "top_k"),
        (["attentions"], {"attention_top_k": 9}, "top_k"),
        (["attentions"], {"attention_dtype": "FP64"}, "attention_dtype"),
        (["attentions"], {"attention_threshold": "high"}, "attention_threshold"),
        (["attention_summaries"], {"attention_summaries": "entropy,mood"}, "summaries"),
        (["attentions"], {"attention_layers": "0,x"}, "attention_layers"),
        (["attentions"], {"attention_layers": "0,²"}, "attention_layers"),
        (["attentions"], {"attention_heads": True}, "attention_heads"),
        (["attentions"], {"attention_heads": "12"}, "heads"),
        (["attentions"], {"attention_layers": "1,1"}, "repeated"),
        # Empty items are refused in every list alike (summaries took "entropy,,first").
        (["attentions"], {"attention_layers": "0,,1"}, "attention_layers"),
        (["attention_summaries"], {"attention_summaries": "entropy,,first"}, "empty items"),
    ]:
        body = {
            "inputs": [text],
            "outputs": [{"name": n} for n in outputs],
            "parameters": params,
        }
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == 422, (params, r.text)
        assert says in r.json()["error"], (params, r.json())


def test_sdk_asks_for_and_reads_compact_attention(minilm_server_url: str) -> None:
    from attnserve_client import Client

    attention = {"top_k": 2, "dtype": "float16", "summaries": ["self", "first"]}
    native = encode(minilm_server_url, attention)
    with Client(minilm_server_url) as client:
        got = client.encode(HELD_OUT, return_attention=True, attention_options=attention)
    assert got.attention is not None and got.attention_indices is not None
    assert got.attention_summaries is not None
    for row, item in enumerate(native):
        assert got.attention[row].dtype == np.float16
        assert np.array_equal(got.attention[row], decode(item["attention"]))
        assert np.array_equal(got.attention_indices[row], decode(item["attention_indices"]))
        assert list(got.attention_summaries[row]) == ["self", "first"]
        for name, value in got.attention_summaries[row].items():
            assert np.array_equal(value, decode(item["attention_summaries"][name]))


@pytest.mark.parametrize("measure", ["weights", "norms"])
def test_a_vanishing_threshold_keeps_every_key_on_every_protocol(
    minilm_server_url: str, minilm_grpc_address: str, measure: str
) -> None:
    """A threshold of 5e-324 (1/t overflows a float) is priced as the full map: the
    native answer keeps every key of every row (as many as the sentence has tokens), and
    /v2 and gRPC answer 200 (an OverflowError gave 500 and UNKNOWN)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    tiny = 5e-324
    for item in encode(minilm_server_url, {"threshold": tiny, "measure": measure}):
        indices = decode(item["attention_indices"])
        assert indices.shape[-1] == indices.shape[-2] == len(item["tokens"])
    params = {"attention_threshold": tiny, "attention_measure": measure}
    texts = np.array([s.encode() for s in HELD_OUT], dtype=np.object_)
    http = httpclient.InferenceServerClient(minilm_server_url.removeprefix("http://"))
    text = httpclient.InferInput("text", [len(HELD_OUT)], "BYTES")
    text.set_data_from_numpy(texts, binary_data=True)
    wanted = [httpclient.InferRequestedOutput("attentions", binary_data=True)]
    got = http.infer("minilm-l6", [text], outputs=wanted, parameters=params)
    assert got.as_numpy("attentions").shape[-1] == max(
        len(item["tokens"]) for item in encode(minilm_server_url, {"threshold": tiny})
    )
    rpc = grpcclient.InferenceServerClient(minilm_grpc_address)
    text_rpc = grpcclient.InferInput("text", [len(HELD_OUT)], "BYTES")
    text_rpc.set_data_from_numpy(texts)
    wanted_rpc = [grpcclient.InferRequestedOutput("attentions")]
    got_rpc = rpc.infer("minilm-l6", [text_rpc], outputs=wanted_rpc, parameters=params)
    assert np.array_equal(got_rpc.as_numpy("attentions"), got.as_numpy("attentions"))
