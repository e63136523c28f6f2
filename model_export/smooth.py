"""SmoothQuant: move activation outliers into the weights before dynamic int8.

Dynamic int8 (``quantize_dynamic``) quantises each MatMul's activation with one
scale per tensor. A transformer's LayerNorm and GELU outputs carry a few
channels far larger than the rest (the outlier dimensions), so one scale spent
on them leaves the other channels a handful of levels. SmoothQuant (Xiao et
al., 2023) divides each input channel ``j`` by ``s_j`` and multiplies row ``j``
of the weight by it — ``(x / s) (s W) = x W`` exactly in real numbers — with
``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)`` from calibration activations,
so activation and weight share the range. Here the division is a ``Mul`` node
placed once per activation tensor (a LayerNorm output also feeds the residual
path, so it cannot be folded into the LayerNorm's weights), before every
quantised consumer reading it: ``MatMul`` with a constant 2-D weight and the
fused ``Attention`` (whose packed Q/K/V weight is its second input).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

# The migration strength: 0.5 splits the range evenly between activation and weight.
ALPHA = 0.5
# Consumers whose second input is a weight matrix [K, N] that reads input channel k in row k.
_WEIGHTED = frozenset({"MatMul", "Attention"})

Feeds = dict[str, np.ndarray]


def smoothable(model: onnx.ModelProto, exclude: Iterable[str] = ()) -> dict[str, list[int]]:
    """Activation tensor -> indices of the nodes that read it with a 2-D constant weight."""
    weights = {init.name: init for init in model.graph.initializer if len(init.dims) == 2}
    skip = set(exclude)
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(model.graph.node):
        weighted = node.op_type in _WEIGHTED and node.input[1] in weights
        if weighted and node.name not in skip and node.input[0] not in weights:
            readers.setdefault(node.input[0], []).append(i)
    return readers


def channel_maxima(
    model: onnx.ModelProto, tensors: Sequence[str], batches: Iterable[Feeds]
) -> dict[str, np.ndarray]:
    """max |x_j| per channel (last axis) of each named tensor over the calibration batches."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(
        helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in tensors
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    maxima: dict[str, np.ndarray] = {}
    for feeds in batches:
        mask = feeds.get("attention_mask")
        for name, value in zip(tensors, session.run(list(tensors), feeds), strict=True):
            rows = value.reshape(-1, value.shape[-1])  # (B*T, C)
            if mask is not None and mask.size == rows.shape[0]:
                rows = rows[mask.reshape(-1) > 0]  # padding rows are no one's activation
            top = np.abs(rows).max(axis=0)
            maxima[name] = top if name not in maxima else np.maximum(maxima[name], top)
    return maxima


def smooth(
    model: onnx.ModelProto,
    batches: Iterable[Feeds],
    alpha: float = ALPHA,
    exclude: Iterable[str] = (),
) -> int:
    """Smooth ``model`` in place with scales from ``batches`` (its feeds); the number of
    activation tensors smoothed."""
    readers = smoothable(model, exclude)
    maxima = channel_maxima(model, list(readers), batches)
    weights = {init.name: init for init in model.graph.initializer}
    nodes = list(model.graph.node)
    before: dict[int, onnx.NodeProto] = {}  # node index -> the Mul to place before it
    for n, (tensor, consumers) in enumerate(readers.items()):
        matrices = {
            nodes[i].input[1]: numpy_helper.to_array(weights[nodes[i].input[1]]) for i in consumers
        }
        w_max = np.max([np.abs(w).max(axis=1) for w in matrices.values()], axis=0)  # (K,)
        x_max = maxima[tensor]
        scale = (np.maximum(x_max, 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha)).astype(
            np.float32
        )
        scale = np.clip(scale, 1e-2, 1e2)  # a dead channel neither vanishes nor explodes
        for name, w in matrices.items():  # the weight rows grow by s ...
            weights[name].CopyFrom(
                numpy_helper.from_array((w * scale[:, None]).astype(np.float32), name)
            )
        inverse, smoothed = f"smooth_{n}_inverse", f"{tensor}_smoothed"
        model.graph.initializer.append(
            numpy_helper.from_array((1 / scale).astype(np.float32), inverse)
        )
        for i in consumers:  # ... as the activation shrinks by it
            nodes[i].input[0] = smoothed
        before[min(consumers)] = helper.make_node(
            "Mul", [tensor, inverse], [smoothed], f"smooth_{n}"
        )
    del model.graph.node[:]
    for i, node in enumerate(nodes):
        model.graph.node.extend([before[i], node] if i in before else [node])
    return len(readers)


def smooth_file(
    src: Path,
    dst: Path,
    batches: Iterable[Feeds],
    alpha: float = ALPHA,
    exclude: Iterable[str] = (),
) -> int:
    """``smooth`` a graph file (its weights inlined) into ``dst``."""
    model = onnx.load(str(src))
    count = smooth(model, batches, alpha, exclude)
    onnx.save(model, str(dst))
    return count
