"""sentence-transformers' ``Dense`` modules at export: their weights read, applied to
pooled vectors (calibration) and written for the service (graph_io.DENSE_FILE).

The graphs end at token vectors and the service pools per request, so a Dense layer,
whose activation does not commute with pooling, runs in the service after pooling
(``service/dense.py``), from the file written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from model_export.manifest import Dense, DenseLayer, sha256_file
from model_export.st_folder import CheckpointError, DenseModule

# A Dense module's keys in its folder's weights (sentence-transformers' nn.Linear).
WEIGHT_KEY, BIAS_KEY = "linear.weight", "linear.bias"


@dataclass(frozen=True)
class DenseWeights:
    """One Dense layer: activation(x W^T + b)."""

    layer: DenseLayer
    weight: Tensor  # [out_features, in_features]
    bias: Tensor | None  # [out_features]


def dense_weights(module: DenseModule, state: dict[str, Tensor]) -> DenseWeights:
    """A Dense module's weights from its folder's tensors, shapes checked against its
    ``config.json``; CheckpointError names what does not fit."""
    layer, name = module.layer, module.path.name
    want = {WEIGHT_KEY: [layer.out_features, layer.in_features]}
    if layer.bias:
        want[BIAS_KEY] = [layer.out_features]
    if set(state) != set(want):
        raise CheckpointError(f"{name}: its weights hold {sorted(state)}, expected {sorted(want)}")
    for key, shape in want.items():
        if list(state[key].shape) != shape:
            raise CheckpointError(
                f"{name}: {key} has shape {list(state[key].shape)}, expected {shape}"
            )
    bias = state[BIAS_KEY].float() if layer.bias else None
    return DenseWeights(layer, state[WEIGHT_KEY].float(), bias)


def apply_dense(x: Tensor, dense: Sequence[DenseWeights]) -> Tensor:
    """[..., in] pooled vectors through every layer, in order."""
    for d in dense:
        x = torch.nn.functional.linear(x, d.weight, d.bias)
        if d.layer.activation == "tanh":
            x = torch.tanh(x)
        elif d.layer.activation == "relu":
            x = torch.relu(x)
    return x


def write_dense(dense: Sequence[DenseWeights], path: Path) -> Dense:
    """The layers' weights in graph_io.DENSE_FILE's layout (per layer W row-major, then
    b; float32 little-endian), and their manifest entry."""
    parts = [t.detach().reshape(-1) for d in dense for t in (d.weight, d.bias) if t is not None]
    np.concatenate([p.numpy() for p in parts]).astype("<f4").tofile(path)
    return Dense(path.name, sha256_file(path), tuple(d.layer for d in dense))
