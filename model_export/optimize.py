"""onnxruntime's transformer optimizer, applied once at export time.

The exported graphs spell LayerNorm after a residual add and the Erf-based GELU
after a bias add as chains of small ops; onnxruntime's own session-time
optimisation leaves them so. Its transformer optimizer (BERT model type) fuses
them into its CPU contrib kernels ``SkipLayerNormalization`` and ``BiasGelu``,
and, in graphs that do not output attention weights and use BERT's additive
mask (no causal mask, no window), each layer's attention into one ``Attention``
kernel (rotary graphs do not match its pattern and keep theirs unfused;
bias-free LayerNorms are not fused, see below). The result is saved, so no
server re-derives it at start. The export then
validates the fused graphs against PyTorch exactly as it did the plain ones:
a fusion that changed a number beyond ``atol`` fails the export.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from model_export.config import EncoderConfig
from model_export.weights_file import external_files, load_graph

log = logging.getLogger(__name__)

# A graph larger than this is fused in a child process. The optimizer holds several
# copies of the weights at its peak, and the allocator kept most of them after it: a
# 0.6B model's five 1.8 GB graphs, fused one after another in the exporting process,
# ran out of 24 GiB. A child's memory goes back to the system whole when it exits;
# smaller graphs skip the child's start (seconds: onnxruntime's optimizer imported).
IN_PROCESS_BYTES = 256 * 2**20

# The fusions attempted; each graph records those that applied, with their count.
FUSIONS = ("SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu", "Attention")


def spell_mask_as_bert(model: onnx.ModelProto) -> None:
    """Split ``Unsqueeze(attention_mask, [1, 2])`` into two single-axis Unsqueezes.

    The exporter folds BERT's ``mask[:, None, None, :]`` into one Unsqueeze; the
    attention fusion only recognises the mask through two. Same values either way.
    """
    graph = model.graph
    mask_unsqueezes = [
        node
        for node in graph.node
        if node.op_type == "Unsqueeze" and node.input[0] == "attention_mask"
    ]
    wanted = {node.input[1] for node in mask_unsqueezes}
    # Only the axes read: a copy of every initializer was a copy of the weights.
    constants = {
        node.output[0]: numpy_helper.to_array(node.attribute[0].t)
        for node in graph.node
        if node.op_type == "Constant"
        and node.output[0] in wanted
        and node.attribute
        and node.attribute[0].name == "value"
    }
    constants.update(
        {
            init.name: numpy_helper.to_array(init)
            for init in graph.initializer
            if init.name in wanted
        }
    )
    for node in mask_unsqueezes:
        axes = constants.get(node.input[1])
        if axes is None or axes.tolist() != [1, 2]:
            continue
        axis = f"{node.name}_axis1"
        middle = f"{node.name}_half"
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), axis))
        first = helper.make_node("Unsqueeze", ["attention_mask", axis], [middle], f"{node.name}_a")
        second = helper.make_node("Unsqueeze", [middle, axis], list(node.output), f"{node.name}_b")
        position = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(position, second)
        graph.node.insert(position, first)


def optimize_graph(path: Path, config: EncoderConfig, *, fuse_attention: bool) -> dict[str, int]:
    """Fuse ``path`` in place; the fused operators that now stand in it, by count. A graph
    over ``IN_PROCESS_BYTES`` is fused in a child process (see there)."""
    if _graph_bytes(path) <= IN_PROCESS_BYTES:
        fused = _optimize(path, config, fuse_attention)
    else:
        spawn = multiprocessing.get_context("spawn")  # no fork of a process running torch
        with ProcessPoolExecutor(1, mp_context=spawn) as child:
            fused = child.submit(_optimize, path, config, fuse_attention).result()
    log.info("%s: fused %s", path.name, fused or "nothing")
    return fused


def _graph_bytes(path: Path) -> int:
    """The graph's file and, when that is small, the external data it reads (the dynamo
    exporter writes a large model's weights beside its graph, ``<graph>.data``)."""
    size = path.stat().st_size
    if size > IN_PROCESS_BYTES:
        return size
    return size + sum((path.parent / name).stat().st_size for name in external_files(path))


def _optimize(path: Path, config: EncoderConfig, fuse_attention: bool) -> dict[str, int]:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_attention = fuse_attention
    # Its LayerNorm fusions (skip, bias-skip, embedding) read a LayerNorm's bias input
    # and fail on a bias-free one (ModernBERT's): those LayerNorms stay unfused.
    options.enable_skip_layer_norm = config.norm_bias
    options.enable_bias_skip_layer_norm = config.norm_bias
    options.enable_embed_layer_norm = config.norm_bias

    proto, read_from = load_graph(path)
    external = bool(read_from)  # it leaves as it came (over 2 GB it must)
    spell_mask_as_bert(proto)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimizer warns about its own internals
        model = optimize_model(
            proto,
            model_type="bert",
            num_heads=config.n_heads,
            hidden_size=config.d_model,
            optimization_options=options,
            opt_level=0,  # fusions only: onnxruntime still optimises at session start
        )
    fused = {
        op: count
        for op, count in model.get_fused_operator_statistics().items()
        if op in FUSIONS and count
    }
    model.save_model_to_file(str(path), use_external_data_format=external)
    # The optimizer's graph sits in reference cycles: left to the collector, each graph
    # optimised kept a copy of the weights alive (a 0.6B model's export ran out of 24 GiB).
    del model, proto
    gc.collect()
    return fused
