"""Per-layer hidden states over HTTP (``return_hidden_states``, ``hidden_states.layers``).

Hidden states are transformers' ``output_hidden_states``: the input embeddings, then
each layer's output, [L + 1, n, d] per sequence. They come from ``model_hidden.onnx``
(or ``model_attn.onnx`` when attention is asked for too); a model directory exported
before them keeps serving everything else and answers a request for them with 422.

Tolerances: the server runs the same ONNX graphs as a direct onnxruntime run, padded
the same way or differently, so values match to float32 noise: ATOL_ORT (1e-5; a
wrong layer or token is off by ~1e-1). The first state is the request's own input,
copied by the graph: it comes back bit for bit (atol 0), and so do the two wire
formats, which carry the same float32 values.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from model_export import graph_io
from model_export.manifest import GraphFile, Manifest, sha256_file
from tests.conftest import running_server
from tests.service.helpers import TIMEOUT, as_array, b64_array, encode
from tests.support.inputs import sequences
from tests.support.metrics import scrape
from tests.support.onnx_runs import ort_outputs
from tests.support.tiny import D_MODEL, MODEL, N_HEADS, N_LAYERS

ATOL_ORT = 1e-5  # same graph, possibly other padding: float32 noise only
STATES = N_LAYERS + 1  # the input embeddings, then each layer's output
RAGGED = (9, 4, 1)  # three sequences of different lengths: padded twice in a batch of them
WIRE_FORMATS = ("float", "base64")
# A response budget that one 64-token sequence's embeddings fit in as base64 (~11 kB),
# but not with its hidden states (~44 kB for all L + 1, ~22 kB for one more state).
BUDGET = 20_000
LONG = 64


def wire_inputs(seqs: list[np.ndarray], wire_format: str) -> list[Any]:
    """Inputs as nested floats or base64 objects, in the wire format of the answer."""
    return [s.tolist() if wire_format == "float" else b64_array(s) for s in seqs]


def post(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/encode", json=body)


def states_of(body: dict[str, Any]) -> list[np.ndarray]:
    return [as_array(item["hidden_states"]) for item in body["data"]]


def inference_runs(url: str) -> dict[str, float]:
    """The server's onnxruntime runs of tiny so far, by graph label."""
    return scrape(url).by("graph", "attnserve_inference_seconds_count", model=MODEL)


# -- values -------------------------------------------------------------------------------


def test_hidden_states_match_onnxruntime_in_both_wire_formats(
    http_client: httpx.Client, hidden_session: ort.InferenceSession
) -> None:
    seqs = sequences(RAGGED, seed=61)
    want = ort_outputs(hidden_session, seqs)  # the same three as one padded batch
    answers: dict[str, list[np.ndarray]] = {}
    for wire_format in WIRE_FORMATS:
        body = encode(
            http_client,
            wire_inputs(seqs, wire_format),
            return_hidden_states=True,
            encoding_format=wire_format,
        )
        assert body["usage"] == {"sequences": 3, "tokens": sum(RAGGED)}
        items = body["data"]
        for seq, item, expected in zip(seqs, items, want, strict=True):
            n = len(seq)
            raw = item["hidden_states"]
            assert isinstance(raw, dict if wire_format == "base64" else list)
            states = as_array(raw)
            assert states.shape == (STATES, n, D_MODEL)  # trimmed to this sequence's tokens
            np.testing.assert_allclose(
                states, expected[graph_io.OUTPUT_HIDDEN_STATES], rtol=0, atol=ATOL_ORT
            )
            np.testing.assert_array_equal(states[0], seq)  # the input itself, atol 0
            embeddings = as_array(item["embeddings"])
            np.testing.assert_allclose(states[-1], embeddings, rtol=0, atol=ATOL_ORT)
            assert item["attention"] is None  # not asked for
        answers[wire_format] = states_of(body)
    for as_float, as_base64 in zip(answers["float"], answers["base64"], strict=True):
        np.testing.assert_array_equal(as_float, as_base64)  # atol 0: the same float32 values


@pytest.mark.parametrize(
    "layers",
    [[0, -1], [-1], [2, 1, 0], [-STATES, STATES - 1, 1]],
    ids=["first+last", "last", "reversed", "bounds"],
)
def test_hidden_states_layers_select_in_order(
    http_client: httpx.Client, hidden_session: ort.InferenceSession, layers: list[int]
) -> None:
    seqs = sequences(RAGGED, seed=62)
    body = encode(
        http_client,
        seqs,
        return_hidden_states=True,
        hidden_states={"layers": layers},
        encoding_format="base64",
    )
    want = ort_outputs(hidden_session, seqs)
    for seq, item, expected in zip(seqs, body["data"], want, strict=True):
        states = as_array(item["hidden_states"])
        assert states.shape == (len(layers), len(seq), D_MODEL)
        all_states = expected[graph_io.OUTPUT_HIDDEN_STATES]  # (L + 1, n, d)
        np.testing.assert_allclose(states, all_states[layers], rtol=0, atol=ATOL_ORT)
        if layers[-1] in (-1, STATES - 1):  # the last selected is the last layer's output
            embeddings = as_array(item["embeddings"])
            np.testing.assert_allclose(states[-1], embeddings, rtol=0, atol=ATOL_ORT)


def test_with_attention_the_attention_graph_gives_the_same_states(
    http_client: httpx.Client,
    hidden_session: ort.InferenceSession,
    attention_session: ort.InferenceSession,
) -> None:
    seqs = sequences(RAGGED, seed=63)
    options = {"return_hidden_states": True, "hidden_states": {"layers": [0, -1]}}
    alone = encode(http_client, seqs, encoding_format="base64", **options)
    both = encode(http_client, seqs, encoding_format="base64", return_attention=True, **options)
    with_attention = ort_outputs(attention_session, seqs)
    without = ort_outputs(hidden_session, seqs)
    for i, seq in enumerate(seqs):
        n = len(seq)
        states = as_array(both["data"][i]["hidden_states"])
        assert states.shape == (2, n, D_MODEL)
        np.testing.assert_allclose(
            states,
            with_attention[i][graph_io.OUTPUT_HIDDEN_STATES][[0, -1]],
            rtol=0,
            atol=ATOL_ORT,
        )
        # The two graphs agree with each other, so both answers do.
        np.testing.assert_allclose(
            with_attention[i][graph_io.OUTPUT_HIDDEN_STATES],
            without[i][graph_io.OUTPUT_HIDDEN_STATES],
            rtol=0,
            atol=ATOL_ORT,
        )
        np.testing.assert_allclose(
            states, as_array(alone["data"][i]["hidden_states"]), rtol=0, atol=ATOL_ORT
        )
        attention = as_array(both["data"][i]["attention"])
        assert attention.shape == (N_LAYERS, N_HEADS, n, n)
        np.testing.assert_allclose(
            attention, with_attention[i][graph_io.OUTPUT_ATTENTIONS], rtol=0, atol=ATOL_ORT
        )


def test_each_request_runs_the_lightest_graph(http_client: httpx.Client, server_url: str) -> None:
    """Hidden states alone never run the attention graph (its maps are the costly part)."""
    seqs = sequences((5, 2), seed=64)
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "embeddings"),
        ({"return_hidden_states": True}, "hidden_states"),
        ({"return_hidden_states": True, "return_attention": True}, "attention"),
    ]
    for options, graph in cases:
        before = inference_runs(server_url)
        body = encode(http_client, seqs, **options)
        after = inference_runs(server_url)
        ran = {g for g in after if after[g] != before.get(g, 0.0)}
        assert ran == {graph}, (options, before, after)
        asked = options.get("return_hidden_states", False)
        assert all((item["hidden_states"] is not None) == asked for item in body["data"])


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layers", "bad"),
    [([STATES], [3]), ([0, -STATES - 1], [-4]), ([5, 1, -9], [5, -9])],
)
@pytest.mark.parametrize("asked", [True, False], ids=["asked", "not-asked"])
def test_out_of_range_layer_is_422_naming_the_field(
    http_client: httpx.Client, layers: list[int], bad: list[int], asked: bool
) -> None:
    """Valid indices are -(L + 1)..L (-3..2 on the 2-layer tiny), checked even when the
    hidden states are not asked for: a wrong index is wrong either way."""
    (seq,) = sequences((3,), seed=65)
    body: dict[str, Any] = {"inputs": [seq.tolist()], "hidden_states": {"layers": layers}}
    if asked:
        body["return_hidden_states"] = True
    r = post(http_client, body)
    assert r.status_code == 422, r.text
    error = r.json()
    assert error["error_type"] == "invalid_input"
    assert error["error"].startswith("hidden_states.layers: ")
    assert str(bad) in error["error"]
    assert f"-{STATES}..{STATES - 1}" in error["error"]


@pytest.mark.parametrize(
    "hidden_states",
    [{"layers": []}, {"layers": [0.5]}, {"layer": [0]}, {"layers": "0"}],
    ids=["empty", "float", "unknown-key", "string"],
)
def test_malformed_hidden_states_options_are_422(
    http_client: httpx.Client, hidden_states: dict[str, Any]
) -> None:
    (seq,) = sequences((2,), seed=66)
    r = post(
        http_client,
        {"inputs": [seq.tolist()], "return_hidden_states": True, "hidden_states": hidden_states},
    )
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "invalid_input"
    assert r.json()["error"].startswith("hidden_states.")


# -- the response budget ------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_budget_url(model_repository: Path) -> Iterator[str]:
    """A real server on tiny whose answers may be at most BUDGET bytes."""
    with running_server(model_repository, max_response_bytes=str(BUDGET)) as url:
        yield url


def test_hidden_states_count_in_the_response_budget(small_budget_url: str) -> None:
    (seq,) = sequences((LONG,), seed=67)
    base = {"inputs": [b64_array(seq)], "encoding_format": "base64"}
    with httpx.Client(base_url=small_budget_url, timeout=TIMEOUT) as client:
        plain = post(client, base)
        assert plain.status_code == 200, plain.text
        assert len(plain.content) <= BUDGET
        for layers in (None, [-1]):  # all L + 1 states, or just one more [n, d] array
            body: dict[str, Any] = {**base, "return_hidden_states": True}
            if layers is not None:
                body["hidden_states"] = {"layers": layers}
            r = post(client, body)
            assert r.status_code == 413, r.text
            assert r.json()["error_type"] == "payload_too_large"
            assert f"{BUDGET:,} bytes" in r.json()["error"]
            assert "hidden-state layers" in r.json()["error"]  # the hint names the way out
        # The same request without hidden states is still accepted.
        again = post(client, {**base, "return_hidden_states": False})
        assert again.status_code == 200, again.text


# -- a model exported without hidden states -----------------------------------------------


def export_without_hidden_states(source: Path, target: Path) -> None:
    """A copy of ``source`` as the first release exported it: no model_hidden.onnx, and a
    model_attn.onnx with last_hidden_state and attentions only (the ONNX file itself
    stripped of hidden_states, since the server checks each file's outputs)."""
    shutil.copytree(source, target)
    (target / graph_io.GRAPH_HIDDEN_STATES).unlink()
    attention = target / graph_io.GRAPH_ATTENTION
    model = onnx.load(str(attention))
    later = (graph_io.OUTPUT_HIDDEN_STATES, graph_io.OUTPUT_VALUE_NORMS)
    kept = [o for o in model.graph.output if o.name not in later]
    assert [o.name for o in kept] == [graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_ATTENTIONS]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    onnx.checker.check_model(model)
    onnx.save(model, str(attention))
    manifest = Manifest.read(source)
    graphs = {
        graph_io.GRAPH_EMBEDDINGS: manifest.graphs[graph_io.GRAPH_EMBEDDINGS],
        graph_io.GRAPH_ATTENTION: GraphFile(
            sha256_file(attention), (graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_ATTENTIONS)
        ),
    }
    old = dataclasses.replace(manifest, graphs=graphs, format_version=1)
    assert not old.has_hidden_states
    old.write(target)


@pytest.fixture(scope="module")
def first_release_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    repo = tmp_path_factory.mktemp("first-release-models")
    export_without_hidden_states(tiny_model_dir, repo / MODEL)
    return repo / MODEL


@pytest.fixture(scope="module")
def first_release_client(first_release_dir: Path) -> Iterator[httpx.Client]:
    """A real server on tiny as exported without hidden states (it loads and warms up)."""
    with (
        running_server(first_release_dir.parent) as url,
        httpx.Client(base_url=url, timeout=TIMEOUT) as client,
    ):
        yield client


def test_a_model_without_hidden_states_still_serves_the_rest(
    first_release_client: httpx.Client,
    first_release_dir: Path,
    embeddings_session: ort.InferenceSession,
    attention_session: ort.InferenceSession,
) -> None:
    client = first_release_client
    assert client.get("/health/ready").status_code == 200
    card = client.get(f"/v1/models/{MODEL}").json()
    assert set(card["sha256"]) == {
        graph_io.GRAPH_EMBEDDINGS,
        graph_io.GRAPH_ATTENTION,
        graph_io.WEIGHTS_FILE,
    }
    assert card["hidden_states"] is False
    assert card["sha256"][graph_io.GRAPH_ATTENTION] == sha256_file(
        first_release_dir / graph_io.GRAPH_ATTENTION
    )
    seqs = sequences(RAGGED, seed=68)
    plain = encode(client, seqs)
    with_attention = encode(client, seqs, return_attention=True)
    # The stripped graph computes what tiny's does, so tiny's sessions are the reference.
    want_plain = ort_outputs(embeddings_session, seqs)
    want_attention = ort_outputs(attention_session, seqs)
    for i in range(len(seqs)):
        assert plain["data"][i]["hidden_states"] is None
        np.testing.assert_allclose(
            as_array(plain["data"][i]["embeddings"]),
            want_plain[i][graph_io.OUTPUT_HIDDEN],
            rtol=0,
            atol=ATOL_ORT,
        )
        item = with_attention["data"][i]
        assert item["hidden_states"] is None
        np.testing.assert_allclose(
            as_array(item["attention"]),
            want_attention[i][graph_io.OUTPUT_ATTENTIONS],
            rtol=0,
            atol=ATOL_ORT,
        )


@pytest.mark.parametrize("return_attention", [False, True])
def test_a_model_without_hidden_states_refuses_them_with_422(
    first_release_client: httpx.Client, return_attention: bool
) -> None:
    (seq,) = sequences((4,), seed=69)
    r = post(
        first_release_client,
        {
            "inputs": [seq.tolist()],
            "return_hidden_states": True,
            "return_attention": return_attention,
        },
    )
    assert r.status_code == 422, r.text
    error = r.json()
    assert error["error_type"] == "unsupported_by_model"
    assert error["error"].startswith("return_hidden_states: ")
    assert "re-export" in error["error"]
    # The server serves on.
    assert encode(first_release_client, [seq])["data"][0]["embeddings"] is not None


def test_a_model_without_value_norms_refuses_attention_norms(
    first_release_client: httpx.Client,
) -> None:
    """Attention norms need the attention graph's value_norms (format 4): 422 naming the
    field and the fix, while weights are still served."""
    seqs = sequences(RAGGED, seed=69)
    body = {
        "inputs": [s.tolist() for s in seqs],
        "return_attention": True,
        "attention": {"measure": "norms"},
    }
    r = first_release_client.post("/v1/encode", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "unsupported_by_model"
    assert r.json()["error"].startswith("attention.measure: ") and "re-export" in r.json()["error"]
    body["attention"] = {"measure": "weights"}
    assert first_release_client.post("/v1/encode", json=body).status_code == 200
