"""int8: a quantised copy of an exported model, served under its own name.

How each graph is quantised is a recipe (``model_export.int8_recipe``): by default
SmoothQuant-rebalanced dynamic int8 with the feed-forward outputs block-wise
(``smooth-blockwise``), or plain dynamic int8 (``dynamic``); the manifest records
which (``quantization.recipe``). The smoothing scales come from calibration
inputs: sentences of ``quantize_sentences`` apart from the agreement's, or seeded
random embeddings for a model without a tokenizer. int8 cannot meet the fp32
export's ``atol``, so instead of a strict check the copy's agreement with its
fp32 source is measured on a fixed set and recorded in its manifest
(``quantization``), and the copy is refused below ``MIN_COSINE``. The
token-embedding graph (a lookup) and the tokenizer are copied unchanged (with
BM42's graph, which stays fp32); an older export's one-run text graph is
quantised like the encoder graphs and judged on the sentences by itself
(``text_graph``). A source with a shared weight file (format 5) gives a
copy with one too: the int8 weights and the copied graphs', each once.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from model_export import graph_io
from model_export.int8_recipe import SMOOTH_BLOCKWISE, describe, graph_feeds, quantize_graph
from model_export.manifest import GraphFile, Manifest, sha256_file
from model_export.progress import Progress, Step
from model_export.staging import staged_model_dir
from model_export.validate import make_inputs
from model_export.weights_file import share_weights

# Sentence embeddings (mean-pooled last hidden state) of the int8 copy must point where
# the fp32 ones do, at least this closely, or the copy is not written.
MIN_COSINE = 0.98
# The fixed agreement set: lengths of the sequences, one batch per seed.
AGREEMENT_LENGTHS = (4, 9, 16, 31, 64)
AGREEMENT_SEEDS = (0, 1, 2, 3)
# For models with a tokenizer, real text too: what the model is served on.
SENTENCES = (
    "A man is playing a guitar.",
    "The new movie is awesome and everyone should see it.",
    "Stock markets fell sharply after the announcement.",
    "Photosynthesis turns light, water and carbon dioxide into sugar.",
    "Can you recommend a good restaurant near the station?",
    "The committee postponed its decision until next week.",
    "Neural networks learn representations from data.",
    "She walked her dog along the river every morning.",
)


class QuantizationError(ValueError):
    """The int8 copy disagrees with its fp32 source beyond ``MIN_COSINE``."""


# The steps besides each graph's quantisation (model_export.progress).
CHOOSE_FP32 = ("choose", "fp32 layers")
AGREEMENT = ("check", "agreement with fp32")


def quantize_model_dir(
    src: Path,
    dst: Path,
    name: str | None = None,
    keep_cosine: float | None = None,
    progress: Progress | None = None,
    recipe: str = SMOOTH_BLOCKWISE,
) -> dict[str, Any]:
    """Write ``dst``: ``src`` with int8 encoder graphs (quantised by ``recipe``); return the
    recorded agreement.

    With ``keep_cosine``, the fewest feed-forward output MatMuls (the same layers in
    every graph) stay fp32 for the sentence embeddings to reach that cosine with fp32
    on a selection set apart from the agreement sets (``sensitive_matmuls``). ``progress``
    shows each step as it starts."""
    manifest = Manifest.read(src)
    manifest.verify(src)
    if manifest.tasks:  # its agreement and calibration runs feed no task
        raise QuantizationError("int8 of a model with task adapters is not supported")
    text_graph = manifest.text_graph
    quantized_graphs = [*manifest.graphs, *([text_graph] if text_graph else [])]
    progress = progress or Progress(dst.name)
    progress.plan(
        [
            *([Step(*CHOOSE_FP32)] if keep_cosine is not None else []),
            *(Step("quantize", graph) for graph in quantized_graphs),
            Step(*AGREEMENT),
        ]
    )
    with staged_model_dir(dst) as staging:
        keep: dict[str, Any] = {}
        batches, selected_on = _calibration_batches(src, manifest)
        if keep_cosine is not None:
            with progress.step(*CHOOSE_FP32):
                keep = _choose_fp32_layers(src, batches, keep_cosine, recipe)
                keep["selected_on"] = selected_on
        for graph in quantized_graphs:
            with progress.step("quantize", graph):
                layers = feed_forward_outputs(src / graph)
                kept = [layers[i] for i in keep.get("fp32_layers", [])]
                calibration = _graph_calibration(src, manifest, graph, batches)
                quantize_graph(recipe, src / graph, staging / graph, calibration, kept)
        graphs = [*quantized_graphs]
        for extra in set(manifest.files()) - set(quantized_graphs) - {manifest.weights}:
            if extra.endswith(".onnx"):  # its weights, wherever they are, into the graph
                onnx.save(onnx.load(str(src / extra)), str(staging / extra))
                graphs.append(extra)
            else:
                shutil.copy2(src / extra, staging / extra)
        if manifest.weights is not None:  # the int8 weights and the rest, each once
            share_weights([staging / graph for graph in graphs], staging / manifest.weights)
        with progress.step(*AGREEMENT):
            agreement = measure_agreement(src, staging, manifest)
        # What the model is served on: its sentences, through each graph text can take.
        judged = [agreement[k] for k in ("text", "text_graph") if k in agreement]
        worst = min(a["cosine_min"] for a in judged or [agreement["random"]])
        if worst < MIN_COSINE:
            raise QuantizationError(
                f"int8 sentence embeddings reach cosine {worst:.4f} with "
                f"fp32, below {MIN_COSINE}: this model does not quantise well"
            )
        text = manifest.text
        if text is not None and text_graph is not None:
            text = dataclasses.replace(text, graph_sha256=sha256_file(staging / text_graph))
        if text is not None:  # copied graphs now read the new weight file
            sparse = text.sparse_graph
            text = dataclasses.replace(
                text,
                embeddings_sha256=sha256_file(staging / text.embeddings_graph),
                sparse_graph_sha256=None if sparse is None else sha256_file(staging / sparse),
            )
        late = manifest.late_interaction  # its graph, copied fp32, reads the new weights
        if late is not None:
            late = dataclasses.replace(late, sha256=sha256_file(staging / late.graph))
        quantized = dataclasses.replace(
            manifest,
            text=text,
            late_interaction=late,
            weights_sha256=(
                None if manifest.weights is None else sha256_file(staging / manifest.weights)
            ),
            name=name or f"{manifest.name}-int8",
            graphs={
                graph: GraphFile(sha256_file(staging / graph), entry.outputs)
                for graph, entry in manifest.graphs.items()
            },
            record={
                **manifest.record,
                "quantization": {
                    "type": f"int8 {recipe}",
                    "recipe": describe(recipe),
                    "calibrated_on": selected_on,
                    "source": manifest.name,
                    "agreement": agreement,
                    **({"keep": keep} if keep else {}),
                },
            },
        )
        quantized.write(staging)
    progress.close()
    return agreement


Batch = tuple[np.ndarray, np.ndarray]


def quantize_graph_dynamic(src: Path, dst: Path, keep_fp32: Sequence[str] = ()) -> None:
    """One graph, dynamically: int8 weights per output channel, activations at run time;
    the MatMul nodes named in ``keep_fp32`` stay fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        src,
        dst,
        weight_type=QuantType.QInt8,
        per_channel=True,
        nodes_to_exclude=[*batched_matmuls(src), *keep_fp32],
        # Shape inference does not know the fused contrib operators' outputs.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def quantize_graph_static(
    src: Path, dst: Path, reader: Any, *, quant_format: Any = None, method: Any = None
) -> None:
    """One graph, statically: int8 weights per output channel, uint8 activations whose
    ranges ``reader`` (a ``CalibrationDataReader``) calibrated. Only weight MatMuls: the
    attention products (both operands activations) stay fp32."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    quantize_static(
        src,
        dst,
        reader,
        quant_format=QuantFormat.QDQ if quant_format is None else quant_format,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax if method is None else method,
        op_types_to_quantize=["MatMul"],  # not Softmax: attention weights stay fp32
        nodes_to_exclude=batched_matmuls(src),
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": True},
    )


# The activation before these MatMuls: the feed-forward block's second projection reads
# the GELU's output, whose few very large channels (BERT's outlier dimensions) one
# per-tensor int8 scale cannot hold with the rest.
_GELUS = frozenset({"BiasGelu", "Gelu", "FastGelu"})
_SIGMOID = frozenset({"Sigmoid"})


def feed_forward_outputs(path: Path) -> list[str]:
    """The MatMul nodes that read a feed-forward activation (one per layer), in graph
    order: a GELU's output, a SiLU's (x·sigmoid(x)), or a gated unit's product of one
    of them with the up projection (SwiGLU, GeGLU)."""
    model = onnx.load(str(path), load_external_data=False)
    producer = {out: node for node in model.graph.node for out in node.output}

    def made_by(name: str, ops: frozenset[str]) -> bool:
        node = producer.get(name)
        return node is not None and node.op_type in ops

    def activation(name: str) -> bool:
        node = producer.get(name)
        if node is None:
            return False
        silu = node.op_type == "Mul" and any(made_by(i, _SIGMOID) for i in node.input)
        return node.op_type in _GELUS or silu

    def gated(name: str) -> bool:
        node = producer.get(name)
        return node is not None and node.op_type == "Mul" and any(map(activation, node.input))

    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and (activation(node.input[0]) or gated(node.input[0]))
    ]


def sensitive_matmuls(
    src: Path, batches: Sequence[Batch], min_cosine: float, recipe: str = SMOOTH_BLOCKWISE
) -> tuple[list[str], float]:
    """The fewest feed-forward output MatMuls to keep fp32 so that the ``recipe``'s int8
    graph's mean-pooled embeddings of ``batches`` (embeds, mask; also its calibration)
    reach ``min_cosine`` (min over sequences) against fp32: each candidate is scored
    alone, then kept in that order until the target is met. Returns (kept nodes, the
    cosine reached)."""
    reference = _session(src)
    want = [reference.run(None, _feeds(b))[0] for b in batches]

    def worst(keep: Sequence[str]) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            graph = Path(tmp) / "candidate.onnx"
            quantize_graph(recipe, src, graph, [_feeds(b) for b in batches], keep)
            session = _session(graph)
        cosines = [
            _cosines(w, session.run(None, _feeds(b))[0], b[1])
            for w, b in zip(want, batches, strict=True)
        ]
        return float(np.concatenate(cosines).min())

    reached = worst(())
    if reached >= min_cosine:
        return [], reached
    scores = {node: worst([node]) for node in feed_forward_outputs(src)}
    kept: list[str] = []
    for node in sorted(scores, key=lambda n: -scores[n]):
        kept.append(node)
        reached = worst(kept)
        if reached >= min_cosine:
            break
    return kept, reached


# The calibration set (smoothing scales, and ``keep_cosine``'s choice) without a
# tokenizer: seeded random embeddings (with one: quantize_sentences.KEEP_SENTENCES).
KEEP_RANDOM_SEEDS = (10, 11, 12, 13)
CALIBRATION_BATCH = 32


def _calibration_batches(src: Path, manifest: Manifest) -> tuple[list[Batch], str]:
    """Token embeddings and masks to calibrate on, and what they are."""
    text = manifest.text
    if text is not None and text.tokenizer is not None:
        from model_export.quantize_sentences import KEEP_SEED, KEEP_SENTENCES, sentences

        ids, mask = _sentence_ids(src, manifest, sentences(KEEP_SENTENCES, KEEP_SEED))
        embed = _session(src / text.embeddings_graph)
        step = CALIBRATION_BATCH
        batches = []
        for i in range(0, len(ids), step):  # padded to each batch's longest, as served
            width = int(mask[i : i + step].sum(1).max())
            part = ids[i : i + step, :width]
            feeds = {graph_io.INPUT_IDS: part, graph_io.INPUT_TOKEN_TYPES: np.zeros_like(part)}
            batches.append((embed.run(None, feeds)[0], mask[i : i + step, :width]))
        return batches, f"{KEEP_SENTENCES} sentences (quantize_sentences seed {KEEP_SEED})"
    d = manifest.architecture.d_model
    lengths = tuple(n for n in AGREEMENT_LENGTHS if n <= manifest.architecture.max_seq_len)
    batches = [make_inputs(lengths, d, seed) for seed in KEEP_RANDOM_SEEDS]
    return batches, f"random embeddings (seeds {list(KEEP_RANDOM_SEEDS)})"


def _graph_calibration(
    src: Path, manifest: Manifest, graph: str, batches: Sequence[Batch]
) -> list[dict[str, np.ndarray]]:
    """``batches`` as ``graph``'s feeds (a one-run text graph: the sentences' ids)."""
    arch = manifest.architecture
    if graph != manifest.text_graph:
        return [graph_feeds(graph, e, m, arch.n_layers, arch.n_heads) for e, m in batches]
    from model_export.quantize_sentences import KEEP_SEED, KEEP_SENTENCES, sentences

    ids, mask = _sentence_ids(src, manifest, sentences(KEEP_SENTENCES, KEEP_SEED))
    types = np.zeros_like(ids)
    return [
        {graph_io.INPUT_IDS: ids[i : i + 32], graph_io.INPUT_TOKEN_TYPES: types[i : i + 32],
         graph_io.INPUT_MASK: mask[i : i + 32]}
        for i in range(0, len(ids), 32)
    ]  # fmt: skip


def _choose_fp32_layers(
    src: Path, batches: Sequence[Batch], target: float, recipe: str
) -> dict[str, Any]:
    """Which layers' feed-forward output MatMul stays fp32 (indices, graph order)."""
    graph = src / graph_io.GRAPH_EMBEDDINGS
    kept, reached = sensitive_matmuls(graph, batches, target, recipe)
    if reached < target:
        raise QuantizationError(
            f"int8 reaches cosine {reached:.4f} with every feed-forward output kept fp32, "
            f"below the {target} asked"
        )
    order = feed_forward_outputs(graph)
    return {
        "target_cosine": target,
        "cosine_min": round(reached, 6),
        "fp32_layers": sorted(order.index(node) for node in kept),
    }


def _feeds(batch: Batch) -> dict[str, np.ndarray]:
    return {graph_io.INPUT_EMBEDS: batch[0], graph_io.INPUT_MASK: batch[1]}


def _cosines(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per sequence: cosine of the mean-pooled hidden states a and b [B, T, d]."""
    weights = mask[..., None].astype(np.float32)  # (B, T, 1)
    pa, pb = ((x * weights).sum(1) / weights.sum(1) for x in (a, b))  # (B, d)
    out: np.ndarray = (pa * pb).sum(1) / (np.linalg.norm(pa, axis=1) * np.linalg.norm(pb, axis=1))
    return out


def batched_matmuls(path: Path) -> list[str]:
    """MatMul nodes whose constant operand is not a 2-D matrix (the value norms' per-head
    output projection, [h, d_k, d]): int8's DynamicQuantizeMatMul takes 2-D weights only,
    so these stay fp32."""
    model = onnx.load(str(path), load_external_data=False)
    ranks = {init.name: len(init.dims) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            ranks[node.output[0]] = len(node.attribute[0].t.dims)
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and any(ranks.get(i, 2) != 2 for i in node.input[1:])
    ]


def _inputs(model_dir: Path, manifest: Manifest) -> dict[str, list[Batch]]:
    """The agreement sets: seeded random embeddings ("random"), and for models with a
    tokenizer the sentences ("text")."""
    d = manifest.architecture.d_model
    lengths = tuple(n for n in AGREEMENT_LENGTHS if n <= manifest.architecture.max_seq_len)
    sets = {"random": [make_inputs(lengths, d, seed) for seed in AGREEMENT_SEEDS]}
    text = manifest.text
    if text is not None and text.tokenizer is not None:
        ids, mask = _sentence_ids(model_dir, manifest)
        embed = _session(model_dir / text.embeddings_graph)
        feeds = {graph_io.INPUT_IDS: ids, graph_io.INPUT_TOKEN_TYPES: np.zeros_like(ids)}
        sets["text"] = [(embed.run(None, feeds)[0], mask)]
    return sets


def measure_agreement(fp32_dir: Path, int8_dir: Path, manifest: Manifest) -> dict[str, Any]:
    """Per agreement set: cosine of mean-pooled sentence embeddings (min, mean) and the
    largest absolute difference of attention weights, int8 against fp32."""
    graph = graph_io.GRAPH_ATTENTION
    fp32, int8 = _session(fp32_dir / graph), _session(int8_dir / graph)
    names = list(manifest.graphs[graph].outputs)
    agreement = {
        name: _agreement(fp32, int8, names, batches)
        for name, batches in _inputs(fp32_dir, manifest).items()
    }
    text_graph = manifest.text_graph
    if text_graph is not None and manifest.has_tokenizer:
        agreement["text_graph"] = _text_graph_agreement(
            _session(fp32_dir / text_graph), _session(int8_dir / text_graph), fp32_dir, manifest
        )
    return agreement


def _text_graph_agreement(
    fp32: ort.InferenceSession, int8: ort.InferenceSession, model_dir: Path, manifest: Manifest
) -> dict[str, Any]:
    """Cosine of mean-pooled sentence embeddings of the int8 text graph against fp32."""
    ids, mask = _sentence_ids(model_dir, manifest)
    feeds = {
        graph_io.INPUT_IDS: ids,
        graph_io.INPUT_TOKEN_TYPES: np.zeros_like(ids),
        graph_io.INPUT_MASK: mask,
    }
    weights = mask[..., None].astype(np.float32)
    pooled = [
        (out[0] * weights).sum(1) / weights.sum(1)
        for out in (fp32.run(None, feeds), int8.run(None, feeds))
    ]
    a, b = pooled
    cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {
        "sequences": len(cosines),
        "cosine_min": round(float(cosines.min()), 6),
        "cosine_mean": round(float(cosines.mean()), 6),
    }


def _sentence_ids(model_dir: Path, manifest: Manifest, texts: Sequence[str] = SENTENCES) -> Batch:
    """``texts`` tokenized with the model's tokenizer, padded: (ids, mask)."""
    from tokenizers import Tokenizer

    assert manifest.text is not None and manifest.text.tokenizer is not None
    tokenizer = Tokenizer.from_file(str(model_dir / manifest.text.tokenizer))
    tokenizer.enable_padding()
    encoded = tokenizer.encode_batch(list(texts))
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    return ids, mask


def _agreement(
    fp32: ort.InferenceSession, int8: ort.InferenceSession, names: list[str], batches: list[Batch]
) -> dict[str, Any]:
    cosines: list[float] = []
    attention_diff = 0.0
    for embeds, mask in batches:
        feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
        want = dict(zip(names, fp32.run(names, feeds), strict=True))
        got = dict(zip(names, int8.run(names, feeds), strict=True))
        weights = mask[..., None].astype(np.float32)
        for row in range(len(embeds)):
            a = (want[graph_io.OUTPUT_HIDDEN][row] * weights[row]).sum(0) / weights[row].sum()
            b = (got[graph_io.OUTPUT_HIDDEN][row] * weights[row]).sum(0) / weights[row].sum()
            cosines.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
        attention_diff = max(
            attention_diff,
            float(np.abs(want[graph_io.OUTPUT_ATTENTIONS] - got[graph_io.OUTPUT_ATTENTIONS]).max()),
        )
    return {
        "sequences": len(cosines),
        "cosine_min": round(min(cosines), 6),
        "cosine_mean": round(float(np.mean(cosines)), 6),
        "attention_max_abs_diff": round(attention_diff, 6),
    }


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
