"""Export to a model directory: files, config.json, dynamic axes, ONNX/PyTorch parity, failures."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from model_export import graph_io
from model_export.config import EncoderConfig, preset
from model_export.export import export_model
from model_export.manifest import FORMAT_VERSION, Manifest
from model_export.model import Encoder
from model_export.validate import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    HALF_RTOL,
    ValidationError,
    compact_as_checked,
    differences,
    selected_as_checked,
    selection_feeds,
    validate_model_dir,
)
from tests.conftest import TINY_SEED
from tests.model_export.reference import ragged_batch
from tests.support.onnx_runs import new_session

PARITY_ATOL = 1e-4  # ONNX Runtime vs PyTorch, fp32 (observed ~1e-6)

# Batches run through every graph: one token, long sequences, ragged with padding.
SHAPE_CASES: list[tuple[int, ...]] = [(1,), (2,), (100,), (3, 1, 2), (17, 5, 9, 1), (100, 37, 1)]

# Mask and architecture variants, exported with the fast TorchScript exporter.
VARIANTS: dict[str, dict[str, Any]] = {
    "causal": {"causal": True},
    "window": {"window": 2},
    "causal+window": {"causal": True, "window": 3},
    "additive": {"scoring": "additive"},
    "pre-LN": {"norm_placement": "pre"},
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dims(value_info: onnx.ValueInfoProto) -> list[str | int]:
    """A graph input's or output's shape: symbolic names as str, fixed sizes as int."""
    return [
        d.dim_param if d.HasField("dim_param") else d.dim_value
        for d in value_info.type.tensor_type.shape.dim
    ]


# The axis of each output that runs over (query) tokens, after the batch axis.
TOKEN_AXIS = {
    graph_io.OUTPUT_HIDDEN: 1,  # (B, T, d)
    graph_io.OUTPUT_ATTENTIONS: 3,  # (B, L, h, T, T): query rows
    graph_io.OUTPUT_HIDDEN_STATES: 2,  # (B, L + 1, T, d)
    graph_io.OUTPUT_VALUE_NORMS: 3,  # (B, L, h, T)
    graph_io.OUTPUT_TOP_WEIGHTS: 3,  # (B, L, h, T, k)
    graph_io.OUTPUT_TOP_INDICES: 3,  # checked as the weights they point at (float32)
    graph_io.OUTPUT_SUMMARIES: 3,  # (B, L, h, T, 6)
    graph_io.OUTPUT_SELECTED: 3,  # (B, L', h', T, T)
    graph_io.OUTPUT_SELECTED_HALF: 3,
}


def torch_outputs(encoder: Encoder, embeds: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    with torch.no_grad():
        hidden, attn, states, norms = encoder(
            torch.from_numpy(embeds),
            torch.from_numpy(mask),
            hidden_states=True,
            value_norms=True,
        )
    assert attn is not None and states is not None and norms is not None
    return {
        graph_io.OUTPUT_HIDDEN: hidden.numpy(),
        graph_io.OUTPUT_ATTENTIONS: attn.numpy(),
        graph_io.OUTPUT_HIDDEN_STATES: states.numpy(),
        graph_io.OUTPUT_VALUE_NORMS: norms.numpy(),
    }


def assert_parity(encoder: Encoder, model_dir: Path, lengths: tuple[int, ...], seed: int) -> None:
    """Every graph equals PyTorch within PARITY_ATOL; padded positions exactly 0 in ONNX too."""
    embeds, mask = ragged_batch(lengths, encoder.config.d_model, seed=seed)
    want = torch_outputs(encoder, embeds, mask)
    padded = ~mask.astype(bool)
    for graph, names in graph_io.GRAPH_OUTPUTS.items():
        feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
        compact = graph == graph_io.GRAPH_COMPACT_ATTENTION
        if compact:  # the three largest keys of each row (or every key of a shorter batch)
            feeds[graph_io.INPUT_TOP_K] = np.zeros(min(3, mask.shape[1]), dtype=np.int64)
        if graph == graph_io.GRAPH_SELECTED_ATTENTION:  # float32, float16 and dropped layers
            feeds.update(selection_feeds(encoder.config.n_layers, encoder.config.n_heads, seed))
        got = new_session(model_dir / graph).run(list(names), feeds)
        if compact:
            got = compact_as_checked(got, want[graph_io.OUTPUT_ATTENTIONS], want)
        if graph == graph_io.GRAPH_SELECTED_ATTENTION:
            want.update(selected_as_checked(want[graph_io.OUTPUT_ATTENTIONS], feeds))
        for name, value in zip(names, got, strict=True):
            assert value.shape == want[name].shape, (graph, name)
            half = name == graph_io.OUTPUT_SELECTED_HALF
            assert value.dtype == (np.float16 if half else np.float32), (graph, name)
            np.testing.assert_allclose(  # float16: within its rounding, 2^-11 relative
                value.astype(np.float32),
                want[name],
                rtol=HALF_RTOL if half else 0,
                atol=PARITY_ATOL,
                err_msg=f"{graph} {name}",
            )
            # (B, T, ...) with the token axis second, indexed by the (B, T) padding mask.
            by_token = np.moveaxis(value, TOKEN_AXIS[name], 1)
            assert (by_token[padded] == 0.0).all(), (graph, name)


def read_config(model_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((model_dir / graph_io.CONFIG_FILE).read_text())
    return data


# --- the session fixture: tiny, exported with the default (dynamo) exporter ---------------


def test_directory_holds_exactly_the_three_graphs_their_weights_and_config(
    tiny_model_dir: Path,
) -> None:
    assert sorted(p.name for p in tiny_model_dir.iterdir()) == sorted(
        [
            graph_io.GRAPH_EMBEDDINGS,
            graph_io.GRAPH_HIDDEN_STATES,
            graph_io.GRAPH_ATTENTION,
            graph_io.GRAPH_COMPACT_ATTENTION,
            graph_io.GRAPH_SELECTED_ATTENTION,
            graph_io.WEIGHTS_FILE,
            graph_io.CONFIG_FILE,
        ]
    )
    # No staging directory (`.tiny.*`) left next to it.
    assert not list(tiny_model_dir.parent.glob(f".{tiny_model_dir.name}.*"))


def test_config_json_records_architecture_and_io(
    tiny_model_dir: Path, tiny_config: EncoderConfig
) -> None:
    config = read_config(tiny_model_dir)
    assert config["format_version"] == FORMAT_VERSION == 9
    assert Manifest.read(tiny_model_dir).to_dict() == config  # the typed contract reads it all
    assert config["name"] == "tiny"
    assert config["seed"] == TINY_SEED
    assert config["architecture"] == tiny_config.to_dict()
    assert EncoderConfig.from_dict(config["architecture"]) == tiny_config
    assert config["opset"] >= 17
    assert list(config["inputs"]) == list(graph_io.INPUT_NAMES)
    assert config["inputs"][graph_io.INPUT_EMBEDS] == {
        "dtype": "float32",
        "shape": [graph_io.BATCH_AXIS, graph_io.SEQ_AXIS, "d_model"],
    }
    assert config["inputs"][graph_io.INPUT_MASK] == {
        "dtype": "int64",
        "shape": [graph_io.BATCH_AXIS, graph_io.SEQ_AXIS],
    }
    assert list(config["graphs"]) == list(graph_io.GRAPH_OUTPUTS)
    for graph, outputs in graph_io.GRAPH_OUTPUTS.items():
        recorded = config["graphs"][graph]["outputs"]
        assert list(recorded) == list(outputs)
        for name in outputs:
            dtype = graph_io.DTYPES.get(name, "float32")
            assert recorded[name] == {"dtype": dtype, "shape": graph_io.SHAPES[name]}


def test_config_json_sha256_matches_files(tiny_model_dir: Path) -> None:
    config = read_config(tiny_model_dir)
    for graph in graph_io.GRAPH_OUTPUTS:
        recorded = config["graphs"][graph]["sha256"]
        assert len(recorded) == 64
        assert recorded == sha256(tiny_model_dir / graph)


def test_config_json_validation_results_within_atol(tiny_model_dir: Path) -> None:
    validation = read_config(tiny_model_dir)["validation"]
    assert validation["atol"] == DEFAULT_ATOL
    checks = validation["checks"]
    # Every (graph, output) pair was checked, on more than one shape.
    pairs = {(c["graph"], c["output"]) for c in checks}
    assert pairs == {(g, o) for g, outs in graph_io.GRAPH_OUTPUTS.items() for o in outs}
    assert len({tuple(c["shape"]) for c in checks}) >= 4
    assert all(0.0 <= c["max_abs_diff"] <= c["atol"] == validation["atol"] for c in checks)
    assert validation["max_abs_diff"] == max(c["max_abs_diff"] for c in checks)
    assert validation["max_abs_diff"] <= validation["atol"]


def test_config_json_exporter_versions(tiny_model_dir: Path) -> None:
    exporter = read_config(tiny_model_dir)["exporter"]
    assert exporter["exporter"] == "dynamo"
    assert exporter["torch"] == torch.__version__
    assert exporter["onnx"] == onnx.__version__
    assert exporter["onnxruntime"] == ort.__version__
    assert exporter["python"].count(".") == 2


@pytest.mark.parametrize("graph", list(graph_io.GRAPH_OUTPUTS))
def test_graph_opset_and_names(tiny_model_dir: Path, graph: str) -> None:
    model = onnx.load(str(tiny_model_dir / graph))
    onnx.checker.check_model(model)
    default_domain = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    assert default_domain == [read_config(tiny_model_dir)["opset"]]
    inputs = graph_io.GRAPH_INPUTS.get(graph, graph_io.INPUT_NAMES)
    assert [i.name for i in model.graph.input] == list(inputs)
    # model.onnx has only last_hidden_state; model_hidden.onnx adds hidden_states;
    # model_attn.onnx has all three, attentions before hidden_states, then value norms.
    assert [o.name for o in model.graph.output] == list(graph_io.GRAPH_OUTPUTS[graph])
    assert [o.name for o in model.graph.output] == {
        graph_io.GRAPH_EMBEDDINGS: [graph_io.OUTPUT_HIDDEN],
        graph_io.GRAPH_HIDDEN_STATES: [graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_HIDDEN_STATES],
        graph_io.GRAPH_ATTENTION: [
            graph_io.OUTPUT_HIDDEN,
            graph_io.OUTPUT_ATTENTIONS,
            graph_io.OUTPUT_HIDDEN_STATES,
            graph_io.OUTPUT_VALUE_NORMS,
        ],
        graph_io.GRAPH_COMPACT_ATTENTION: [
            graph_io.OUTPUT_HIDDEN,
            graph_io.OUTPUT_TOP_WEIGHTS,
            graph_io.OUTPUT_TOP_INDICES,
            graph_io.OUTPUT_SUMMARIES,
        ],
        graph_io.GRAPH_SELECTED_ATTENTION: [
            graph_io.OUTPUT_HIDDEN,
            graph_io.OUTPUT_SELECTED,
            graph_io.OUTPUT_SELECTED_HALF,
        ],
    }[graph]


def assert_declared_axes(model_dir: Path, config: EncoderConfig, *, attentions: bool) -> None:
    """Inputs, last_hidden_state and hidden_states: symbolic batch and seq; attentions if
    ``attentions``."""
    batch, seq = graph_io.BATCH_AXIS, graph_io.SEQ_AXIS
    for graph in graph_io.GRAPH_OUTPUTS:
        model = onnx.load(str(model_dir / graph))
        inputs = {i.name: i for i in model.graph.input}
        outputs = {o.name: o for o in model.graph.output}
        assert inputs[graph_io.INPUT_EMBEDS].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert inputs[graph_io.INPUT_MASK].type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert dims(inputs[graph_io.INPUT_EMBEDS]) == [batch, seq, config.d_model]
        assert dims(inputs[graph_io.INPUT_MASK]) == [batch, seq]
        assert dims(outputs[graph_io.OUTPUT_HIDDEN]) == [batch, seq, config.d_model]
        if graph_io.OUTPUT_HIDDEN_STATES in graph_io.GRAPH_OUTPUTS[graph]:
            assert dims(outputs[graph_io.OUTPUT_HIDDEN_STATES]) == [
                batch,
                config.n_layers + 1,
                seq,
                config.d_model,
            ]
        if attentions and graph_io.OUTPUT_ATTENTIONS in outputs:
            assert dims(outputs[graph_io.OUTPUT_ATTENTIONS]) == [
                batch,
                config.n_layers,
                config.n_heads,
                seq,
                seq,
            ]


def test_graphs_have_dynamic_batch_and_seq_axes(
    tiny_model_dir: Path, tiny_config: EncoderConfig
) -> None:
    assert_declared_axes(tiny_model_dir, tiny_config, attentions=True)


@pytest.mark.parametrize("lengths", SHAPE_CASES, ids=str)
def test_onnx_matches_pytorch_at_many_shapes(
    tiny_model_dir: Path, tiny_encoder: Encoder, lengths: tuple[int, ...]
) -> None:
    assert_parity(tiny_encoder, tiny_model_dir, lengths, seed=len(lengths) * 1000 + lengths[0])


def test_validate_model_dir_checks_all_three_graphs_on_every_case(
    tiny_model_dir: Path, tiny_encoder: Encoder
) -> None:
    results = validate_model_dir(tiny_encoder, tiny_model_dir)
    assert len(results) == 5 * 14  # five default cases x (1 + 2 + 4 + 4 + 3) outputs
    assert all(r.passed and r.max_abs_diff <= DEFAULT_ATOL for r in results)
    shapes = {(r.output, tuple(r.shape)) for r in results}
    assert (graph_io.OUTPUT_HIDDEN, (1, 1, 32)) in shapes  # batch 1, seq 1
    assert (graph_io.OUTPUT_ATTENTIONS, (4, 2, 4, 16, 16)) in shapes  # ragged with padding
    # Every (graph, output) pair on every case, hidden_states of both graphs that have them.
    cases = {r.case for r in results}
    assert len(cases) == 5
    assert {(r.graph, r.output, r.case) for r in results} == {
        (g, o, c) for g, outs in graph_io.GRAPH_OUTPUTS.items() for o in outs for c in cases
    }
    for graph in (graph_io.GRAPH_HIDDEN_STATES, graph_io.GRAPH_ATTENTION):
        states = {
            tuple(r.shape)
            for r in results
            if r.graph == graph and r.output == graph_io.OUTPUT_HIDDEN_STATES
        }
        assert (1, 3, 1, 32) in states, graph  # batch 1, layers + 1, seq 1, d_model
        assert (4, 3, 16, 32) in states, graph  # ragged with padding


def test_validation_error_names_output_shape_and_diff(
    tiny_model_dir: Path, tiny_config: EncoderConfig
) -> None:
    other = Encoder(tiny_config, seed=TINY_SEED + 1)  # same architecture, other weights
    with pytest.raises(ValidationError) as info:
        validate_model_dir(other, tiny_model_dir)
    error = info.value
    assert isinstance(error, AssertionError)
    assert (error.graph, error.output, error.shape) == (
        graph_io.GRAPH_EMBEDDINGS,
        graph_io.OUTPUT_HIDDEN,
        (1, 1, 32),  # the first case: a single token
    )
    assert error.atol == DEFAULT_ATOL
    assert error.max_abs_diff > 10 * DEFAULT_ATOL
    message = str(error)
    assert "model.onnx" in message
    assert "'last_hidden_state'" in message
    assert "[1, 1, 32]" in message
    assert f"{error.max_abs_diff:.3g}" in message
    assert "atol 0.0001" in message


def test_tolerance_grows_with_the_value_as_numpy_allclose() -> None:
    # The failure a fresh AMD EPYC machine gave on MiniLM's hidden states: 1.004e-4 off
    # at a value near -1.46 (2.6e-7 relative), which atol alone refused.
    want = np.array([-1.4580495, 10.5, 0.0], dtype=np.float32)
    got = want + np.array([1.0037e-4, 0.0, 0.0], dtype=np.float32)
    diff, excess = differences(got, want)
    assert excess <= DEFAULT_ATOL < diff == float(np.max(np.abs(got - want)))
    assert np.allclose(got, want, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
    # At zero only atol is allowed; a large value gets rtol * |value| more, no further.
    assert differences(want + np.float32(2 * DEFAULT_ATOL), want)[1] > DEFAULT_ATOL
    beyond = want.copy()
    beyond[1] += DEFAULT_ATOL + 10.5 * DEFAULT_RTOL + 1e-5
    assert differences(beyond, want)[1] > DEFAULT_ATOL
    assert differences(want[:2], want) == (float("inf"), float("inf"))
    assert differences(np.full(3, np.nan, dtype=np.float32), want)[1] == float("inf")


@pytest.mark.parametrize(
    ("right", "wrong"),
    [
        ((graph_io.GRAPH_EMBEDDINGS,), graph_io.GRAPH_HIDDEN_STATES),
        ((graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_HIDDEN_STATES), graph_io.GRAPH_ATTENTION),
    ],
)
def test_validation_error_from_the_hidden_states_or_attention_graph(
    tmp_path: Path,
    tiny_model_dir: Path,
    tiny_encoder: Encoder,
    tiny_config: EncoderConfig,
    right: tuple[str, ...],
    wrong: str,
) -> None:
    # A directory whose ``right`` graphs are tiny's but whose ``wrong`` one (checked next)
    # holds other weights.
    mixed = tmp_path / "mixed"
    export_model(Encoder(tiny_config, seed=TINY_SEED + 1), mixed, exporter="torchscript")
    for graph in right:  # with tiny's weights inside it, not read from mixed's weight file
        onnx.save(onnx.load(str(tiny_model_dir / graph)), str(mixed / graph))
    pattern = "^" + wrong.replace(".", r"\.") + ": output 'last_hidden_state'"
    with pytest.raises(ValidationError, match=pattern):
        validate_model_dir(tiny_encoder, mixed)


def assert_hidden_states_graphs(model_dir: Path, config: EncoderConfig, seed: int) -> None:
    """Both graphs with hidden states: (B, L + 1, T, d); the first the input, the last
    last_hidden_state, both exactly (the graph copies them: atol 0); the two graphs agree
    exactly too (the same computation, attention weights aside)."""
    embeds, mask = ragged_batch((9, 3, 1), config.d_model, seed=seed)
    real = mask.astype(bool)
    feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
    states = {}
    for graph in (graph_io.GRAPH_HIDDEN_STATES, graph_io.GRAPH_ATTENTION):
        hidden, value = new_session(model_dir / graph).run(
            [graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_HIDDEN_STATES], feeds
        )
        assert value.shape == (3, config.n_layers + 1, 9, config.d_model), graph
        np.testing.assert_array_equal(value[:, 0][real], embeds[real], err_msg=graph)
        np.testing.assert_array_equal(value[:, -1], hidden, err_msg=graph)
        states[graph] = value
    np.testing.assert_array_equal(
        states[graph_io.GRAPH_HIDDEN_STATES], states[graph_io.GRAPH_ATTENTION]
    )


def test_hidden_states_graphs_give_input_then_each_layer(
    tiny_model_dir: Path, tiny_config: EncoderConfig
) -> None:
    assert_hidden_states_graphs(tiny_model_dir, tiny_config, seed=5)


# --- failed exports leave nothing behind ---------------------------------------------------


@pytest.mark.parametrize("atol", [-1.0])  # below any |diff| - rtol * |value|
def test_failed_export_leaves_no_directory(
    tmp_path: Path, tiny_encoder: Encoder, atol: float
) -> None:
    out_dir = tmp_path / "models" / "failed"
    with pytest.raises(ValidationError, match="last_hidden_state"):
        export_model(tiny_encoder, out_dir, exporter="torchscript", atol=atol)
    assert not out_dir.exists()
    assert list(out_dir.parent.iterdir()) == []  # no `.failed.*` staging directory either


def test_failed_export_keeps_the_previous_model_and_success_replaces_it(
    tmp_path: Path, tiny_config: EncoderConfig
) -> None:
    out_dir = tmp_path / "m"
    first = export_model(Encoder(tiny_config, seed=1), out_dir, exporter="torchscript")
    assert first.model_dir == out_dir
    before = {p.name: sha256(p) for p in out_dir.iterdir()}
    # ExportResult.files: the SHA-256 of what is on disk (at least the three graphs).
    assert set(graph_io.GRAPH_OUTPUTS) <= set(first.files)
    assert all(before[name] == digest for name, digest in first.files.items())

    second = Encoder(tiny_config, seed=2)
    with pytest.raises(ValidationError):
        export_model(second, out_dir, exporter="torchscript", atol=-1.0)
    assert {p.name: sha256(p) for p in out_dir.iterdir()} == before  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["m"]

    (out_dir / "stale.txt").write_text("left over from an older export")
    result = export_model(second, out_dir, exporter="torchscript")
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        [
            graph_io.GRAPH_EMBEDDINGS,
            graph_io.GRAPH_HIDDEN_STATES,
            graph_io.GRAPH_ATTENTION,
            graph_io.GRAPH_COMPACT_ATTENTION,
            graph_io.GRAPH_SELECTED_ATTENTION,
            graph_io.WEIGHTS_FILE,
            graph_io.CONFIG_FILE,
        ]
    )
    # New weights in the weight file, recorded and returned (the graphs only point at them).
    assert result.files[graph_io.WEIGHTS_FILE] != first.files[graph_io.WEIGHTS_FILE]
    for graph in graph_io.GRAPH_OUTPUTS:
        assert result.files[graph] == sha256(out_dir / graph)
        assert read_config(out_dir)["graphs"][graph]["sha256"] == result.files[graph]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert_parity(second, out_dir, (6, 2), seed=11)


# --- mask and architecture variants, TorchScript exporter ----------------------------------


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Encoder, Path]:
    encoder = Encoder(preset("tiny", **VARIANTS[request.param]), seed=21)
    out_dir = tmp_path_factory.mktemp("variants") / request.param
    result = export_model(encoder, out_dir, exporter="torchscript", name=request.param)
    assert all(check.passed for check in result.checks)
    return encoder, out_dir


@pytest.mark.parametrize("lengths", [(1,), (9, 3, 1, 6), (100, 37)], ids=str)
def test_variant_onnx_matches_pytorch(
    variant: tuple[Encoder, Path], lengths: tuple[int, ...]
) -> None:
    encoder, model_dir = variant
    assert_parity(encoder, model_dir, lengths, seed=sum(lengths))


def test_variant_masks_are_exact_in_onnx(variant: tuple[Encoder, Path]) -> None:
    encoder, model_dir = variant
    config = encoder.config
    embeds, mask = ragged_batch((12, 5), config.d_model, seed=3)
    (attn,) = new_session(model_dir / graph_io.GRAPH_ATTENTION).run(
        [graph_io.OUTPUT_ATTENTIONS], {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
    )
    i, j = np.indices((12, 12))
    forbidden = np.zeros((12, 12), dtype=bool)
    if config.causal:
        forbidden |= j > i
    if config.window is not None:
        forbidden |= np.abs(i - j) > config.window
    assert (attn[..., forbidden] == 0.0).all()
    assert (attn[0][..., ~forbidden] > 0.0).all()  # the full-length row: allowed means > 0
    assert read_config(model_dir)["architecture"] == config.to_dict()
    assert read_config(model_dir)["exporter"]["exporter"] == "torchscript"


def test_variant_hidden_states_graphs_give_input_then_each_layer(
    variant: tuple[Encoder, Path],
) -> None:
    encoder, model_dir = variant
    assert_hidden_states_graphs(model_dir, encoder.config, seed=6)


def test_variant_inputs_and_embeddings_have_dynamic_axes(variant: tuple[Encoder, Path]) -> None:
    encoder, model_dir = variant
    assert_declared_axes(model_dir, encoder.config, attentions=False)


def test_torchscript_attentions_declare_layers_and_seq_axes(tmp_path: Path) -> None:
    config = preset("tiny")
    export_model(Encoder(config, seed=0), tmp_path / "m", exporter="torchscript")
    assert_declared_axes(tmp_path / "m", config, attentions=True)
