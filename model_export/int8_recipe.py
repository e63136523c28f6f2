"""The int8 recipes: how one graph is quantised, and what the manifest says of it.

``smooth-blockwise`` (the default) is three steps on the fp32 graph:

1. SmoothQuant (``model_export.smooth``, alpha ``SMOOTH_ALPHA``: 0.7) on the
   activations read by the attention's Q/K/V projections, its output
   projection and the feed-forward block's first projection, with per-channel
   scales from calibration activations;
2. dynamic int8 (``quantize_dynamic``: int8 weights per output channel, each
   activation quantised at run time with one scale per tensor) on those;
3. the feed-forward output MatMuls (which read the activation: a GELU's output, or
   a SwiGLU/GeGLU product, whose outlier channels no per-tensor scale holds) as
   ``MatMulNBits``: 8-bit weights in blocks of ``BLOCK`` along the input axis,
   ``accuracy_level`` 4 (int8 compute with one activation scale per block of each row).

``dynamic`` is the previous recipe: step 2 on every weight MatMul.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from model_export import graph_io

DYNAMIC, SMOOTH_BLOCKWISE = "dynamic", "smooth-blockwise"
RECIPES = (SMOOTH_BLOCKWISE, DYNAMIC)
SMOOTH_ALPHA = 0.7  # measured better than 0.5 on MiniLM and MPNet (docs/benchmarks.md)
BITS, BLOCK, ACCURACY_LEVEL = 8, 128, 4

Feeds = dict[str, np.ndarray]


def describe(recipe: str) -> dict[str, Any]:
    """What the manifest records of ``recipe`` (``quantization.recipe``)."""
    dynamic = "int8 dynamic (onnxruntime quantize_dynamic, per-channel weights)"
    if recipe == DYNAMIC:
        return {"name": DYNAMIC, "matmuls": dynamic}
    return {
        "name": SMOOTH_BLOCKWISE,
        "smoothquant_alpha": SMOOTH_ALPHA,
        "matmuls": f"SmoothQuant, then {dynamic}",
        "feed_forward_outputs": (
            f"MatMulNBits {BITS}-bit symmetric, block {BLOCK}, accuracy_level {ACCURACY_LEVEL}"
        ),
    }


def quantize_graph(
    recipe: str,
    src: Path,
    dst: Path,
    calibration: Sequence[Feeds],
    keep_fp32: Sequence[str] = (),
) -> None:
    """``src`` quantised by ``recipe`` into ``dst``; the MatMuls named in ``keep_fp32`` stay
    fp32. ``calibration``: feeds of ``src`` for the smoothing scales."""
    from model_export.quantize import feed_forward_outputs, quantize_graph_dynamic
    from model_export.smooth import smooth_file

    if recipe == DYNAMIC:
        quantize_graph_dynamic(src, dst, keep_fp32)
        return
    outputs = [n for n in feed_forward_outputs(src) if n not in keep_fp32]
    with tempfile.TemporaryDirectory() as tmp:
        smoothed, dynamic = Path(tmp) / "smoothed.onnx", Path(tmp) / "dynamic.onnx"
        smooth_file(src, smoothed, calibration, SMOOTH_ALPHA, exclude=[*outputs, *keep_fp32])
        quantize_graph_dynamic(smoothed, dynamic, [*outputs, *keep_fp32])
        blockwise(dynamic, dst, outputs)


def blockwise(
    src: Path,
    dst: Path,
    nodes: Sequence[str] | None,
    *,
    bits: int = BITS,
    block: int = BLOCK,
    level: int = ACCURACY_LEVEL,
) -> None:
    """The MatMuls named ``nodes`` (None: every one with a constant weight) as
    ``MatMulNBits`` (symmetric, ``accuracy_level`` ``ACCURACY_LEVEL``)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from model_export.quantize import batched_matmuls

    model = onnx.load(str(src))
    # Its nodes_to_include adds to the MatMuls it takes anyway: the others are excluded.
    others = [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and nodes is not None and node.name not in nodes
    ]
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=block,
        is_symmetric=True,
        accuracy_level=level or None,  # 0: unset, fp32 compute
        nodes_to_exclude=[*others, *batched_matmuls(src)],
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)


def graph_feeds(
    graph: str, embeds: np.ndarray, mask: np.ndarray, n_layers: int, n_heads: int
) -> Feeds:
    """An encoder graph's feeds for token embeddings ``embeds`` (B, T, d) and ``mask``:
    the attention-selection graphs' own inputs as validation sets them."""
    from model_export.validate import selection_feeds

    feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
    if graph == graph_io.GRAPH_COMPACT_ATTENTION:
        feeds[graph_io.INPUT_TOP_K] = np.zeros(min(3, mask.shape[1]), dtype=np.int64)
    if graph == graph_io.GRAPH_SELECTED_ATTENTION:
        feeds.update(selection_feeds(n_layers, n_heads, 0))
    return feeds
