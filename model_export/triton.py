"""A Triton / KServe model repository from an exported model directory (torch-free).

Each graph becomes one Triton model, ``<repo>/<name><suffix>/1/model.onnx`` with
a ``config.pbtxt`` (platform ``onnxruntime_onnx``, batch axis implicit through
``max_batch_size``, ``dynamic_batching``)::

    <name>                    model.onnx: last_hidden_state
    <name>_hidden             model_hidden.onnx: + hidden_states
    <name>_attn               model_attn.onnx: + attentions (+ hidden_states)
    <name>_token_embeddings   embeddings.onnx: input_ids, token_type_ids -> inputs_embeds

A model directory with a shared weight file (format 5) gives each Triton model a
``weights.bin`` of its own beside ``model.onnx``, holding only the weights that
graph reads (Triton models are directories apart).

Triton batches two requests only when their non-batch shapes are equal, so
sequences of different lengths are not batched together there (attnserve's own
batcher groups them by length instead).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx

from model_export import graph_io
from model_export.manifest import Manifest
from model_export.weights_file import share_weights

SUFFIXES = {
    graph_io.GRAPH_EMBEDDINGS: "",
    graph_io.GRAPH_HIDDEN_STATES: "_hidden",
    graph_io.GRAPH_ATTENTION: "_attn",
    graph_io.GRAPH_TOKEN_EMBEDDINGS: "_token_embeddings",
    graph_io.GRAPH_TEXT: "_text",
}
MODEL_VERSION = "1"
DEFAULT_MAX_BATCH_SIZE = 64


def tensor_dims(name: str, manifest: Manifest) -> list[int]:
    """Non-batch dims of a graph input or output; -1 for the sequence axis."""
    cfg = manifest.architecture
    sizes = {"d_model": cfg.d_model, "layers": cfg.n_layers, "heads": cfg.n_heads}
    sizes["layers + 1"] = cfg.n_layers + 1
    return [-1 if axis == graph_io.SEQ_AXIS else sizes[axis] for axis in graph_io.SHAPES[name][1:]]


def _tensor(name: str, data_type: str, dims: list[int]) -> str:
    return (
        f'  {{\n    name: "{name}"\n    data_type: {data_type}\n'
        f"    dims: [ {', '.join(map(str, dims))} ]\n  }}"
    )


def config_pbtxt(
    model: str, inputs: list[str], outputs: list[str], manifest: Manifest, max_batch_size: int
) -> str:
    """Triton's ModelConfig in protobuf text format."""
    types = {graph_io.INPUT_MASK: "TYPE_INT64", graph_io.INPUT_IDS: "TYPE_INT64"}
    types[graph_io.INPUT_TOKEN_TYPES] = "TYPE_INT64"
    ins = [_tensor(n, types.get(n, "TYPE_FP32"), tensor_dims(n, manifest)) for n in inputs]
    outs = [_tensor(n, "TYPE_FP32", tensor_dims(n, manifest)) for n in outputs]
    sep = ",\n"
    return (
        f'name: "{model}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{sep.join(ins)}\n]\noutput [\n{sep.join(outs)}\n]\n"
        "dynamic_batching { }\n"
        "instance_group [\n  {\n    kind: KIND_CPU\n    count: 1\n  }\n]\n"
    )


def write_repository(
    model_dir: Path, repo: Path, *, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
) -> list[str]:
    """Write every graph of ``model_dir`` as a Triton model under ``repo``; their names."""
    manifest = Manifest.read(model_dir)
    manifest.verify(model_dir)
    graphs: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
        name: (graph_io.INPUT_NAMES, g.outputs)
        for name, g in manifest.graphs.items()
        # The compact graphs' k, layer and head inputs have no batch axis, which
        # Triton's batching requires of every input: not served there.
        if name in SUFFIXES
    }
    if manifest.text is not None:
        graphs[manifest.text.embeddings_graph] = (
            graph_io.TEXT_INPUT_NAMES,
            (graph_io.INPUT_EMBEDS,),
        )
        if manifest.text.graph is not None:
            graphs[manifest.text.graph] = (
                graph_io.TEXT_GRAPH_INPUTS,
                graph_io.TEXT_GRAPH_OUTPUTS,
            )
    written = []
    for graph, (inputs, outputs) in graphs.items():
        model = manifest.name + SUFFIXES[graph]
        version_dir = repo / model / MODEL_VERSION
        version_dir.mkdir(parents=True, exist_ok=True)
        if manifest.weights is None:
            shutil.copyfile(model_dir / graph, version_dir / "model.onnx")
        else:  # its own weights only, beside it, as ONNX external data
            graph_file = version_dir / "model.onnx"
            onnx.save(onnx.load(str(model_dir / graph)), str(graph_file))
            share_weights([graph_file], version_dir / manifest.weights)
        config = config_pbtxt(model, list(inputs), list(outputs), manifest, max_batch_size)
        (repo / model / "config.pbtxt").write_text(config)
        written.append(model)
    return written
