"""SmoothQuant's rebalancing is exact before quantisation: the smoothed fp32 graph
answers as the original does, and the activations its quantiser sees are flatter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from model_export import graph_io
from model_export.manifest import Manifest
from model_export.smooth import channel_maxima, smooth_file, smoothable
from model_export.validate import make_inputs

# float32 reassociation only: (x / s)(s W) against x W.
ATOL = 1e-4


def test_smoothed_graph_answers_as_the_original(tiny_model_dir: Path, tmp_path: Path) -> None:
    d = Manifest.read(tiny_model_dir).architecture.d_model
    calibration = [
        dict(zip(graph_io.INPUT_NAMES, make_inputs((5, 9, 3), d, seed), strict=True))
        for seed in (1, 2)
    ]
    # A few large channels, as a trained model's LayerNorm outputs have.
    for feeds in calibration:
        feeds[graph_io.INPUT_EMBEDS][..., :2] *= 30
    src = tiny_model_dir / graph_io.GRAPH_EMBEDDINGS
    dst = tmp_path / "smoothed.onnx"
    assert smooth_file(src, dst, calibration, alpha=0.7) > 0
    model = onnx.load(str(dst))
    assert sum(n.op_type == "Mul" and n.name.startswith("smooth_") for n in model.graph.node)
    held_out = dict(zip(graph_io.INPUT_NAMES, make_inputs((7, 4), d, 3), strict=True))
    want, got = (
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, held_out)[0]
        for p in (src, dst)
    )
    np.testing.assert_allclose(got, want, atol=ATOL)
    # What the quantiser now reads: each channel's range nearer the others'.
    original = onnx.load(str(src))
    tensors = list(smoothable(original))
    before = channel_maxima(original, tensors, calibration)
    after = channel_maxima(model, [f"{t}_smoothed" for t in tensors], calibration)
    spread = [before[t].max() / before[t].mean() for t in tensors]
    flatter = [after[f"{t}_smoothed"].max() / after[f"{t}_smoothed"].mean() for t in tensors]
    assert np.mean(flatter) < np.mean(spread), (spread, flatter)
