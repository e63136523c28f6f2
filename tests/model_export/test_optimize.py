"""Export-time fusions: onnxruntime's transformer optimizer, recorded and validated."""

from __future__ import annotations

import dataclasses
import gc
import json
import resource
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from model_export import graph_io, optimize
from model_export.config import EncoderConfig
from model_export.export import export_model
from model_export.model import Encoder
from model_export.optimize import optimize_graph
from model_export.validate import make_inputs, selection_feeds
from tests.conftest import TINY_SEED
from tests.support.onnx_runs import new_session

# What the tiny preset (2 post-LN layers, GELU, no causal mask or window) fuses into, per
# graph: the residual add + LayerNorm twice per layer, the bias add + Erf-based GELU once
# per layer, and each layer's attention into one kernel, except in the graph that must
# output the attention weights.
LAYER_FUSIONS = {"BiasGelu": 2, "SkipLayerNormalization": 4}
EXPECTED = {
    graph_io.GRAPH_EMBEDDINGS: {"Attention": 2, **LAYER_FUSIONS},
    graph_io.GRAPH_HIDDEN_STATES: {"Attention": 2, **LAYER_FUSIONS},
    graph_io.GRAPH_ATTENTION: LAYER_FUSIONS,
    graph_io.GRAPH_COMPACT_ATTENTION: LAYER_FUSIONS,
    graph_io.GRAPH_SELECTED_ATTENTION: LAYER_FUSIONS,
}
# Fused and plain graphs of the same weights: float32 reordering only.
ATOL = 1e-5


def op_counts(path: Path) -> Counter[str]:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("graph", list(graph_io.GRAPH_OUTPUTS))
def test_exported_graphs_are_fused_and_say_so(tiny_model_dir: Path, graph: str) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["optimizations"][graph] == EXPECTED[graph]
    ops = op_counts(tiny_model_dir / graph)
    assert {op: ops[op] for op in EXPECTED[graph]} == EXPECTED[graph]
    assert ops["Erf"] == 0  # every GELU chain was fused
    if "Attention" in EXPECTED[graph]:
        assert ops["Softmax"] == 0  # no attention left unfused


def test_no_optimize_keeps_the_plain_graphs_and_the_same_answers(
    tmp_path: Path, tiny_config: EncoderConfig, tiny_model_dir: Path
) -> None:
    plain = tmp_path / "plain"
    export_model(
        Encoder(tiny_config, seed=TINY_SEED), plain, exporter="torchscript", optimize=False
    )
    assert json.loads((plain / "config.json").read_text())["optimizations"] == {}
    assert op_counts(plain / graph_io.GRAPH_EMBEDDINGS)["Erf"] == tiny_config.n_layers
    embeds, mask = make_inputs((7, 3, 5), tiny_config.d_model, seed=3)
    for graph in graph_io.GRAPH_OUTPUTS:
        feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
        if graph == graph_io.GRAPH_COMPACT_ATTENTION:
            feeds[graph_io.INPUT_TOP_K] = np.zeros(3, dtype=np.int64)
        if graph == graph_io.GRAPH_SELECTED_ATTENTION:
            feeds.update(selection_feeds(tiny_config.n_layers, tiny_config.n_heads, case=0))
        fused, unfused = new_session(tiny_model_dir / graph), new_session(plain / graph)
        for got, want in zip(fused.run(None, feeds), unfused.run(None, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


@pytest.mark.slow  # about 20 s on 2 cores: its own export and validation
def test_a_causal_window_mask_keeps_attention_unfused_and_validated(
    tmp_path: Path, tiny_config: EncoderConfig
) -> None:
    # The fused kernel knows only key padding: a causal or windowed model must keep
    # its own masked softmax, and its export is still validated against PyTorch.
    config = dataclasses.replace(tiny_config, causal=True, window=1)
    out = tmp_path / "local"
    export_model(Encoder(config, seed=TINY_SEED), out)
    recorded = json.loads((out / "config.json").read_text())["optimizations"]
    for graph in graph_io.GRAPH_OUTPUTS:
        assert recorded[graph] == LAYER_FUSIONS
        assert op_counts(out / graph)["Softmax"] == config.n_layers


def test_optimizing_a_graph_leaves_no_copy_of_it_alive(
    tmp_path: Path, tiny_config: EncoderConfig
) -> None:
    """The optimizer leaves the graph's protobuf messages in reference cycles: each graph
    optimised kept its weights alive until the collector happened to run, and a 0.6B
    model's export (five graphs of 1.8 GB) ran out of 24 GiB. With the collector held off,
    as it may be at any moment, no message of the optimised graph outlives the call."""
    plain = tmp_path / "plain"
    export_model(
        Encoder(tiny_config, seed=TINY_SEED), plain, exporter="torchscript", optimize=False
    )
    graph = plain / graph_io.GRAPH_EMBEDDINGS
    optimize_graph(graph, tiny_config, fuse_attention=True)  # its imports, once

    def messages() -> int:
        return sum(type(o).__name__.endswith("Proto") for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        before = messages()
        optimize_graph(graph, tiny_config, fuse_attention=True)
        left = messages() - before
    finally:
        gc.enable()
    assert left == 0


def test_a_graph_past_the_bound_is_fused_in_a_child_the_same_way(
    tmp_path: Path, tiny_config: EncoderConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every graph over the bound (here: all of them) fused in a child process, whose
    run the system accounts to this one: the same fusions as the exporting process's."""
    plain = tmp_path / "plain"
    export_model(
        Encoder(tiny_config, seed=TINY_SEED), plain, exporter="torchscript", optimize=False
    )
    shutil.copytree(plain, tmp_path / "copy")
    in_process = tmp_path / "copy" / graph_io.GRAPH_EMBEDDINGS
    here = optimize_graph(in_process, tiny_config, fuse_attention=True)
    graph = plain / graph_io.GRAPH_EMBEDDINGS

    monkeypatch.setattr(optimize, "IN_PROCESS_BYTES", 0)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    there = optimize_graph(graph, tiny_config, fuse_attention=True)
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime > children_before
    assert there == here == EXPECTED[graph_io.GRAPH_EMBEDDINGS]
    assert op_counts(graph) == op_counts(in_process)
