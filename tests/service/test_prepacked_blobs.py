"""The session cache's blobs (service/prepacked_blobs.py): an optimised graph's weights and
their pre-packed forms moved into one content-addressed blob per initializer, each
pre-packed buffer at a page-aligned offset, every other field kept; a file that is not a
graph falls back to packing in memory. Graphs built with onnx, as onnxruntime writes them."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import onnx
import pytest

from service.prepacked_blobs import ALIGNMENT, BLOBS, rewrite
from service.prepacked_cache import DATA_FILE, SessionCache


def _graph(tmp_path: Path, data: bytes, entries: list[dict[str, str]]) -> Path:
    tensors = []
    for i, entry in enumerate(entries):
        tensor = onnx.TensorProto(name=f"w{i}", data_type=onnx.TensorProto.FLOAT)
        tensor.dims.extend([2, 3])
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in entry.items():
            tensor.external_data.add(key=key, value=value)
        tensors.append(tensor)
    small = onnx.helper.make_tensor("shape", onnx.TensorProto.INT64, [2], [1, 6])  # inline
    node = onnx.helper.make_node("Reshape", ["w0", "shape"], ["y"], name="reshape")
    out = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 6])
    graph = onnx.helper.make_graph([node], "g", [], [out], initializer=[*tensors, small])
    path = tmp_path / "model.onnx"
    path.write_bytes(onnx.helper.make_model(graph).SerializeToString())
    (tmp_path / DATA_FILE).write_bytes(data)
    return path


def test_each_initializer_and_its_prepacked_buffers_become_one_aligned_blob(
    tmp_path: Path,
) -> None:
    original, first, second = b"o" * 24, b"p" * 100, b"q" * 7
    data = original + b"\0" * 40 + first + second
    prepacked = "MatMul+123|64;100;0|164;7;0"
    entry = {"location": DATA_FILE, "offset": "0", "length": "24", "prepacked_2": prepacked}
    path = _graph(tmp_path, data, [entry, {**entry, "checksum": "abc"}])
    stored: dict[str, bytes] = {}

    def store(content: bytes) -> str:
        name = hashlib.sha256(content).hexdigest()
        stored[name] = content
        return name

    model = onnx.load_from_string(rewrite(path, tmp_path / DATA_FILE, store))
    (name,) = stored  # both initializers: the same bytes, one blob
    blob = stored[name]
    found = [{e.key: e.value for e in t.external_data} for t in model.graph.initializer[:2]]
    assert found[0] == {
        "location": f"{BLOBS}/{name}",
        "offset": "0",
        "length": "24",
        "prepacked_2": f"MatMul+123|{ALIGNMENT};100;0|{2 * ALIGNMENT};7;0",
    }
    assert found[1] == {**found[0], "checksum": "abc"}
    assert blob[:24] == original
    assert blob[ALIGNMENT : ALIGNMENT + 100] == first
    assert blob[2 * ALIGNMENT :] == second
    # Every other field as it was: dims, the inline constant, the node.
    assert list(model.graph.initializer[0].dims) == [2, 3]
    assert onnx.numpy_helper.to_array(model.graph.initializer[2]).tolist() == [1, 6]
    assert model.graph.node[0].op_type == "Reshape"


def test_data_past_the_file_or_elsewhere_is_refused(tmp_path: Path) -> None:
    past = {"location": DATA_FILE, "offset": "0", "length": "100"}
    with pytest.raises(ValueError, match="runs past"):
        rewrite(_graph(tmp_path, b"x" * 10, [past]), tmp_path / DATA_FILE, str)
    elsewhere = {**past, "location": "../other.bin", "length": "4"}
    with pytest.raises(ValueError, match=r"other\.bin"):
        rewrite(_graph(tmp_path, b"x" * 10, [elsewhere]), tmp_path / DATA_FILE, str)


def test_a_file_that_is_not_a_graph_packs_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def write(target: Path) -> None:
        target.write_bytes(b"\x0f not protobuf")  # wire type 7: no onnx message has it
        (target.parent / DATA_FILE).write_bytes(b"")

    cache = SessionCache(tmp_path / "sessions", max_bytes=10_000)
    with caplog.at_level(logging.WARNING, logger="service.prepacked_cache"):
        assert cache.graph("a" * 64, "garbled", write) is None
    assert "cannot share" in caplog.text and "wire type 7" in caplog.text
    assert sorted(p.name for p in cache.root.iterdir()) == [BLOBS]  # nothing kept
