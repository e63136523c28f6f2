"""Weights stored once: every graph of an export reads one weight file, each distinct
tensor in it once, at offsets onnxruntime can map."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from model_export import graph_io
from model_export.manifest import Manifest
from model_export.weights_file import ALIGNMENT, MIN_SHARED_BYTES, external_files, share_weights
from tests.support.onnx_runs import new_session


def external_ranges(path: Path) -> list[tuple[str, int, int]]:
    """(location, offset, length) of each external tensor of a graph."""
    model = onnx.load(str(path), load_external_data=False)
    ranges = []
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            ranges.append((entries["location"], int(entries["offset"]), int(entries["length"])))
        else:  # what stays inside is small
            assert len(numpy_helper.to_array(tensor).tobytes()) < MIN_SHARED_BYTES, tensor.name
    return ranges


def test_every_graph_reads_its_weights_from_the_one_file_each_tensor_once(
    tiny_model_dir: Path,
) -> None:
    manifest = Manifest.read(tiny_model_dir)
    assert manifest.weights == graph_io.WEIGHTS_FILE
    assert graph_io.WEIGHTS_FILE in manifest.files()  # its SHA-256 is checked at load
    weights = (tiny_model_dir / graph_io.WEIGHTS_FILE).read_bytes()
    ranges = {r for graph in manifest.graphs for r in external_ranges(tiny_model_dir / graph)}
    assert ranges and {location for location, _, _ in ranges} == {graph_io.WEIGHTS_FILE}
    assert all(offset % ALIGNMENT == 0 for _, offset, _ in ranges)
    # No two ranges hold the same bytes, and nothing else is in the file but padding.
    contents = [weights[offset : offset + length] for _, offset, length in sorted(ranges)]
    assert len({hashlib.sha256(c).digest() for c in contents}) == len(contents)
    assert len(weights) - sum(map(len, contents)) < ALIGNMENT * len(contents)
    # Shared: the attention graph reads ranges the embeddings graph reads too.
    by_graph = {g: set(external_ranges(tiny_model_dir / g)) for g in manifest.graphs}
    assert by_graph[graph_io.GRAPH_EMBEDDINGS] & by_graph[graph_io.GRAPH_ATTENTION]


def test_equal_tensors_under_other_names_are_stored_once_and_graphs_still_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Two self-contained copies of a graph (each with its weights inside, as an export
    first writes them): shared, the file holds one graph's weights, and both answer as
    before, to the bit."""
    source = tiny_model_dir / graph_io.GRAPH_EMBEDDINGS
    graphs = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for graph in graphs:
        onnx.save(onnx.load(str(source)), str(graph))
    inline = sum(
        len(numpy_helper.to_array(t).tobytes()) for t in onnx.load(str(graphs[0])).graph.initializer
    )
    feeds = {
        graph_io.INPUT_EMBEDS: np.random.default_rng(0).standard_normal((2, 5, 32), np.float32),
        graph_io.INPUT_MASK: np.array([[1] * 5, [1, 1, 1, 0, 0]], dtype=np.int64),
    }
    before = new_session(graphs[0]).run(None, feeds)[0]
    size = share_weights(graphs, tmp_path / graph_io.WEIGHTS_FILE)
    assert size == (tmp_path / graph_io.WEIGHTS_FILE).stat().st_size
    assert size < inline + ALIGNMENT * len(onnx.load(str(graphs[0])).graph.initializer)
    for graph in graphs:
        assert external_files(graph) == {graph_io.WEIGHTS_FILE}
        np.testing.assert_array_equal(new_session(graph).run(None, feeds)[0], before)


def test_a_graph_with_its_own_external_data_is_shared_and_its_data_file_removed(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A large model's graph comes from the exporter with its weights in ``<graph>.data``
    beside it: shared, it reads the one weight file, answers as before, and the data
    file it superseded is gone (it was shipped in the model directory, a second copy)."""
    graph = tmp_path / "big.onnx"
    onnx.save(
        onnx.load(str(tiny_model_dir / graph_io.GRAPH_EMBEDDINGS)),
        str(graph),
        save_as_external_data=True,
        location="big.onnx.data",
    )
    assert external_files(graph) == {"big.onnx.data"}
    feeds = {
        graph_io.INPUT_EMBEDS: np.random.default_rng(1).standard_normal((1, 4, 32), np.float32),
        graph_io.INPUT_MASK: np.ones((1, 4), dtype=np.int64),
    }
    before = new_session(graph).run(None, feeds)[0]
    share_weights([graph], tmp_path / graph_io.WEIGHTS_FILE)
    assert external_files(graph) == {graph_io.WEIGHTS_FILE}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", graph_io.WEIGHTS_FILE]
    np.testing.assert_array_equal(new_session(graph).run(None, feeds)[0], before)


def test_a_transposed_weight_is_stored_as_the_transpose_others_hold(tmp_path: Path) -> None:
    """The attention graph's value norms read W_Oᵀ through a Transpose node: folded, its
    bytes equal the pre-transposed copy a plain MatMul holds, and are stored once."""
    w = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 32])
    z = onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 32])

    def graph(name: str, nodes: list[onnx.NodeProto], init: dict[str, np.ndarray]) -> Path:
        tensors = [numpy_helper.from_array(v, k) for k, v in init.items()]
        outputs = [y, z] if len(nodes) > 1 else [y]
        model = onnx.helper.make_model(
            onnx.helper.make_graph(nodes, name, [x], outputs, tensors),
            opset_imports=[onnx.helper.make_opsetid("", 17)],
        )
        model.ir_version = 10
        onnx.save(model, str(tmp_path / name))
        return tmp_path / name

    plain = graph("plain.onnx", [onnx.helper.make_node("MatMul", ["x", "wt"], ["y"])], {"wt": w.T})
    folded = graph(
        "folded.onnx",
        [
            onnx.helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
            onnx.helper.make_node("MatMul", ["x", "wt"], ["y"]),
            onnx.helper.make_node("MatMul", ["x", "wt"], ["z"]),
        ],
        {"w": w},
    )
    share_weights([plain, folded], tmp_path / graph_io.WEIGHTS_FILE)
    assert (tmp_path / graph_io.WEIGHTS_FILE).stat().st_size == w.nbytes
    ones = {"x": np.ones((1, 16), np.float32)}
    want = np.ones((1, 16), np.float32) @ w.T
    np.testing.assert_array_equal(new_session(folded).run(["z"], ones)[0], want)
    np.testing.assert_array_equal(new_session(plain).run(None, ones)[0], want)


@pytest.mark.parametrize("graph", [graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_ATTENTION])
def test_a_graph_without_its_weight_file_fails_to_load(
    tmp_path: Path, tiny_model_dir: Path, graph: str
) -> None:
    """The graphs depend on the file: a graph copied alone is not a model (a positive
    control for the sharing: the weights are really not inside it)."""
    (tmp_path / graph).write_bytes((tiny_model_dir / graph).read_bytes())
    with pytest.raises(Exception, match=graph_io.WEIGHTS_FILE):
        new_session(tmp_path / graph)
