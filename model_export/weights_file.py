"""One weight file per model directory, shared by every graph that holds the weights.

Each exported graph starts with its own copy of the weights: six graphs held
one model's weights four times over (a MiniLM directory was 351 MB for 91 MB of
weights). :func:`share_weights` moves every large initializer of the given
graphs into one ``weights.bin`` beside them, each distinct tensor once (found by
its bytes, so the same matrix under two names or shapes is stored once), and
rewrites the graphs to read it as ONNX external data.

Each tensor starts on a page boundary, so onnxruntime maps the file instead of
reading it: sessions of one model then share the pages of every weight they do
not pre-pack (``service.runtime``). onnxruntime refuses external data whose
path leaves the graph's directory, symbolic links resolved.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_model

# Tensors smaller than this stay inside their graph (scales, shapes, biases of tiny models).
MIN_SHARED_BYTES = 1024
# onnxruntime maps external data that starts at a multiple of the page size.
ALIGNMENT = 4096


def share_weights(graphs: list[Path], weights: Path) -> int:
    """Move the large initializers of ``graphs`` (in one directory) into ``weights``, each
    distinct tensor once; rewrite the graphs in place, and remove the external data files
    they read before (a large model's ``<graph>.data``), now superseded. Returns the
    file's size in bytes."""
    offsets: dict[bytes, tuple[int, int]] = {}  # digest of the bytes -> (offset, length)
    size = 0
    superseded: set[str] = set()
    with weights.open("wb") as out:
        for path in graphs:
            model, read_from = load_graph(path)
            superseded |= read_from
            _fold_transposed_weights(model.graph)
            for tensor in model.graph.initializer:
                data = numpy_helper.to_array(tensor).tobytes()
                if len(data) < MIN_SHARED_BYTES:
                    continue
                digest = hashlib.sha256(data).digest() + bytes([tensor.data_type])
                if digest not in offsets:
                    padding = -size % ALIGNMENT
                    out.write(bytes(padding))
                    offsets[digest] = (size + padding, len(data))
                    out.write(data)
                    size += padding + len(data)
                offset, length = offsets[digest]
                _point_at(tensor, weights.name, offset, length)
            onnx.save(model, str(path))
    for name in superseded - {weights.name}:
        (weights.parent / name).unlink(missing_ok=True)
    return size


def _fold_transposed_weights(graph: onnx.GraphProto) -> None:
    """Replace each Transpose of a weight by the transposed weight. The exporter leaves
    one where a weight is used both as it is and transposed (the attention graph's
    value norms read W_Oᵀ); folded, those bytes equal the transposed copy the other
    graphs hold, and are stored once."""
    weights = {tensor.name: tensor for tensor in graph.initializer}
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in weights:
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        folded = numpy_helper.to_array(weights[node.input[0]]).transpose(perm)
        graph.initializer.append(
            numpy_helper.from_array(np.ascontiguousarray(folded), node.output[0])
        )
        graph.node.remove(node)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for tensor in list(graph.initializer):
        if tensor.name not in used:
            graph.initializer.remove(tensor)


def _point_at(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make ``tensor`` read ``length`` bytes at ``offset`` of ``location``, not its own."""
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def external_files(path: Path) -> set[str]:
    """The files a graph reads its external data from (none for a self-contained one)."""
    return _locations(onnx.load(str(path), load_external_data=False))


def load_graph(path: Path) -> tuple[onnx.ModelProto, set[str]]:
    """The graph with any external data it reads loaded, and the files that data came
    from, in one parse."""
    model = onnx.load(str(path), load_external_data=False)
    files = _locations(model)
    if files:
        load_external_data_for_model(model, str(path.parent))
    return model, files


def _locations(model: onnx.ModelProto) -> set[str]:
    return {
        entry.value
        for tensor in model.graph.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
