"""sentence-transformers' Dense layers (the manifest's ``dense``), applied to pooled vectors.

The graphs end at token vectors and pooling is per request, so a model's Dense layers
(LaBSE's, sentence-t5's...) run here, after pooling and before Matryoshka shortening,
normalisation and quantization: activation(W x + b), layer by layer, in float32 as
sentence-transformers runs them. Their weights are read once, at model load, from
the file the manifest names and hashes (its size checked against the layers first).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model_export.manifest import Dense, ManifestError

FLOAT_BYTES = 4


@dataclass(frozen=True)
class DenseWeights:
    weight: np.ndarray  # float32 [out, in]
    bias: np.ndarray | None  # float32 [out]
    activation: str  # manifest.DENSE_ACTIVATIONS


def load_dense(dense: Dense, data: bytes) -> tuple[DenseWeights, ...]:
    """The layers' weights from the file's verified bytes ``data`` (graph_io.DENSE_FILE's
    layout); ManifestError when they do not hold exactly the layers the manifest lists,
    or a non-finite value."""
    size = len(data)
    if size != dense.floats * FLOAT_BYTES:
        raise ManifestError(
            f"{dense.file} holds {size} bytes, its layers take {dense.floats * FLOAT_BYTES}"
        )
    values = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.isfinite(values).all():
        raise ManifestError(f"{dense.file} holds non-finite weights")
    layers, start = [], 0
    for layer in dense.layers:
        end = start + layer.out_features * layer.in_features
        weight = values[start:end].reshape(layer.out_features, layer.in_features)
        bias = None
        if layer.bias:
            start, end = end, end + layer.out_features
            bias = values[start:end]
        layers.append(DenseWeights(weight, bias, layer.activation))
        start = end
    return tuple(layers)


def apply_dense(vector: np.ndarray, layers: tuple[DenseWeights, ...]) -> np.ndarray:
    """A pooled float32 [in] vector through every layer: [out] of the last."""
    x = vector.astype(np.float32)
    for layer in layers:
        x = layer.weight @ x
        if layer.bias is not None:
            x = x + layer.bias
        if layer.activation == "tanh":
            x = np.tanh(x)
        elif layer.activation == "relu":
            x = np.maximum(x, 0)
    return x
