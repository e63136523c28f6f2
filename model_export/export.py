"""Export an encoder to a model directory: its ONNX graphs, validated, and config.json.

Layout written::

    <out>/model.onnx        embeddings only (attention weights are computed per
                            layer by softmax but never returned)
    <out>/model_hidden.onnx embeddings and every layer's hidden states
    <out>/model_attn.onnx   embeddings, attention weights, hidden states, value norms
    <out>/model_attn_compact.onnx  embeddings, each row's top-k attention and summaries
                            (model_export.compact_attention)
    <out>/model_attn_select.onnx  embeddings, the maps of chosen layers and heads, in
                            float32 or float16 (model_export.compact_attention)
    <out>/embeddings.onnx   token ids -> inputs_embeds (models with a tokenizer)
    <out>/sparse_model.onnx token ids -> BM42's [CLS] attention row (WordPiece models)
    <out>/weights.bin       every graph's weights, each distinct tensor once
                            (model_export.weights_file)
    <out>/tokenizer.json    the checkpoint's tokenizer
    <out>/config.json       the manifest (model_export.manifest): architecture,
                            SHA-256 of each file, pooling recipe, validation
                            results, exporter versions

The directory is written to a temporary sibling first and renamed into place,
so a failed export never leaves a half-written model that a server could load.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import onnx
import onnxruntime
import torch
from torch import Tensor, nn

from model_export import graph_io
from model_export.dense import DenseWeights, write_dense
from model_export.embedding_ranges import embedding_ranges
from model_export.export_plan import RANGES, SHARE_WEIGHTS, export_plan
from model_export.graph_modules import (
    GRAPH_MODULES,
    HEAD_GRAPH,
    SparseGraph,
    extra_inputs,
    task_example,
)
from model_export.heads import Head, HeadGraph
from model_export.late_interaction import (
    LateInteractionImport,
    MultiVectorGraph,
    validate_multi_vector_graph,
)
from model_export.manifest import (
    GraphFile,
    Manifest,
    Pooling,
    TextFrontEnd,
    sha256_file,
)
from model_export.manifest import (
    Head as ManifestHead,
)
from model_export.model import Encoder, TokenEmbeddings
from model_export.optimize import optimize_graph
from model_export.progress import Progress
from model_export.staging import staged_model_dir
from model_export.stopwords import ENGLISH
from model_export.validate import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    PYTORCH_OUTPUTS,
    TEXT_PATH,
    CheckResult,
    Reference,
    pytorch_references,
    results_json,
    validate_head_graph,
    validate_model_dir,
    validate_sparse_graph,
    validate_text_path,
    validate_token_embeddings,
)
from model_export.weights_file import share_weights

log = logging.getLogger(__name__)

Exporter = Literal["dynamo", "torchscript"]


def _export_text_frontend(
    embeddings: TokenEmbeddings,
    encoder: Encoder,
    tokenizer_file: Path | None,
    staging: Path,
    settings: tuple[int, Exporter],
    progress: Progress,
) -> list[str]:
    """Export the token-embedding graph and the BM42 graph (WordPiece tokenizers only);
    write the stopwords, copy the tokenizer. Returns the graphs written."""
    opset, exporter = settings
    ids = torch.ones(2, 8, dtype=torch.int64)
    types = torch.zeros_like(ids)
    tasks = encoder.config.lora_tasks
    written = _text_graphs(tokenizer_file, tasks)
    with progress.step("export", graph_io.GRAPH_TOKEN_EMBEDDINGS):
        _export_graph(
            embeddings,
            (ids, types, *task_example(tasks)),
            staging / graph_io.GRAPH_TOKEN_EMBEDDINGS,
            opset,
            exporter,
            list(graph_io.with_task(graph_io.TEXT_INPUT_NAMES, tasks)),
            [graph_io.INPUT_EMBEDS],
        )
    if graph_io.GRAPH_SPARSE in written:
        with progress.step("export", graph_io.GRAPH_SPARSE):
            _export_graph(
                SparseGraph(embeddings, encoder),
                (ids, types, torch.ones_like(ids)),
                staging / graph_io.GRAPH_SPARSE,
                opset,
                exporter,
                list(graph_io.TEXT_GRAPH_INPUTS),
                list(graph_io.SPARSE_GRAPH_OUTPUTS),
            )
        (staging / graph_io.STOPWORDS_FILE).write_text("\n".join(ENGLISH) + "\n")
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, staging / graph_io.TOKENIZER_FILE)
    return written


def _text_graphs(tokenizer_file: Path | None, tasks: int = 0) -> list[str]:
    """The graphs of the text front end: the token embeddings, and BM42's for a
    WordPiece tokenizer (or none) of a model without task adapters."""
    wordpiece = tokenizer_file is None or _splits_words_like_wordpiece(tokenizer_file)
    sparse = wordpiece and not tasks
    return [graph_io.GRAPH_TOKEN_EMBEDDINGS, *([graph_io.GRAPH_SPARSE] if sparse else [])]


def _validate_text_frontend(
    embeddings: TokenEmbeddings,
    references: list[Reference],
    staging: Path,
    atol: float,
    progress: Progress,
) -> list[CheckResult]:
    """The token-embedding graph, the text path (it then the embeddings-only graph) and
    the BM42 graph, each against PyTorch."""
    with progress.step("validate", graph_io.GRAPH_TOKEN_EMBEDDINGS):
        checks = validate_token_embeddings(
            embeddings, staging / graph_io.GRAPH_TOKEN_EMBEDDINGS, atol=atol
        )
    with progress.step("validate", TEXT_PATH):
        checks += validate_text_path(references, staging, atol=atol)
    if (staging / graph_io.GRAPH_SPARSE).is_file():
        with progress.step("validate", graph_io.GRAPH_SPARSE):
            checks += validate_sparse_graph(references, staging / graph_io.GRAPH_SPARSE, atol=atol)
    return checks


def _text_manifest(embeddings: TokenEmbeddings, staging: Path) -> TextFrontEnd:
    """The manifest's text section for the files ``_export_text_frontend`` wrote."""

    def digest(name: str) -> dict[str, str | None]:
        present = (staging / name).is_file()
        return {
            "file": name if present else None,
            "sha": sha256_file(staging / name) if present else None,
        }

    sparse, stopwords = digest(graph_io.GRAPH_SPARSE), digest(graph_io.STOPWORDS_FILE)
    tokenizer = digest(graph_io.TOKENIZER_FILE)
    return TextFrontEnd(
        embeddings_graph=graph_io.GRAPH_TOKEN_EMBEDDINGS,
        embeddings_sha256=sha256_file(staging / graph_io.GRAPH_TOKEN_EMBEDDINGS),
        vocab_size=embeddings.word.num_embeddings,
        type_vocab_size=embeddings.token_type.num_embeddings,
        max_positions=embeddings.max_positions,
        tokenizer=tokenizer["file"],
        tokenizer_sha256=tokenizer["sha"],
        sparse_graph=sparse["file"],
        sparse_graph_sha256=sparse["sha"],
        stopwords=stopwords["file"],
        stopwords_sha256=stopwords["sha"],
    )


def _splits_words_like_wordpiece(tokenizer_file: Path) -> bool:
    """BM42 merges a word's pieces by WordPiece's ``##`` continuations (as fastembed does):
    defined for WordPiece tokenizers only. Others (BPE, Unigram) get no BM42 graph, and
    the service says so (422) instead of answering with wrongly merged words."""
    model = json.loads(tokenizer_file.read_text(encoding="utf-8")).get("model", {})
    return isinstance(model, dict) and model.get("type") == "WordPiece"


@dataclass(frozen=True)
class ExportResult:
    model_dir: Path
    files: dict[str, str]  # every file written -> sha256
    checks: list[CheckResult]
    seconds: float


def _export_graph(
    module: nn.Module,
    example: tuple[Tensor, ...],
    path: Path,
    opset: int,
    exporter: Exporter,
    inputs: list[str],
    names: list[str],
) -> None:
    """Export ``module`` with dynamic batch and seq axes on every input."""
    with warnings.catch_warnings():
        # Both exporters warn about their own internals (and TorchScript about its
        # deprecation); nothing a user of this CLI can act on.
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch = torch.export.Dim(graph_io.BATCH_AXIS, min=1)
            seq = torch.export.Dim(graph_io.SEQ_AXIS, min=1)
            extra = {
                graph_io.INPUT_TASK: {0: batch},
                graph_io.INPUT_TOP_K: {0: torch.export.Dim("k", min=1)},
                graph_io.INPUT_LAYERS: None,  # one mark per layer
                # A model of one head has only [0] to select: a static axis of 1.
                graph_io.INPUT_HEADS: {0: torch.export.Dim("heads", min=1)}
                if len(example[-1]) > 1
                else None,
            }
            program = torch.onnx.export(
                module,
                example,
                input_names=inputs,
                output_names=names,
                opset_version=opset,
                dynamo=True,
                verbose=False,
                dynamic_shapes={name: extra.get(name, {0: batch, 1: seq}) for name in inputs},
            )
            assert program is not None
            program.save(str(path), external_data=False)
        else:
            torch.onnx.export(
                module,
                example,
                str(path),
                input_names=inputs,
                output_names=names,
                opset_version=opset,
                dynamo=False,
                dynamic_axes={name: graph_io.DYNAMIC_AXES[name] for name in inputs + names},
            )
    onnx.checker.check_model(str(path), full_check=True)


def export_model(
    encoder: Encoder,
    out_dir: str | Path,
    *,
    opset: int = graph_io.DEFAULT_OPSET,
    exporter: Exporter = "dynamo",
    optimize: bool = True,
    atol: float = DEFAULT_ATOL,
    embeddings: TokenEmbeddings | None = None,
    tokenizer_file: Path | None = None,
    name: str | None = None,
    seed: int | None = None,
    source: str | None = None,
    checkpoint: dict[str, Any] | None = None,
    pooling: Pooling | None = None,
    normalize: bool = False,
    matryoshka_dimensions: tuple[int, ...] = (),
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    include_prompt: bool = True,
    head: Head | None = None,
    compact_attention: bool = True,
    dense: tuple[DenseWeights, ...] = (),
    progress: Progress | None = None,
    task_names: tuple[str, ...] = (),
    default_task: str | None = None,
    late_interaction: LateInteractionImport | None = None,
) -> ExportResult:
    """Export ``encoder`` to ``out_dir`` and validate it; raise ValidationError on mismatch.

    ``exporter="dynamo"`` is PyTorch's supported path (a few seconds per graph);
    ``"torchscript"`` is the legacy exporter, sub-second, kept for fast test
    fixtures and for onnxruntime's transformer optimizer, which only fuses its
    patterns. With ``embeddings`` (and a ``tokenizer_file``) the directory also
    gets the text front end: ``embeddings.onnx``, BM42's ``sparse_model.onnx`` and
    ``tokenizer.json``. Every graph reads its weights from one ``weights.bin``.
    ``pooling``/``normalize``/``matryoshka_dimensions`` (and sentence-transformers'
    ``prompts``/``default_prompt_name``/``include_prompt``) go into the manifest as the model's
    sentence-embedding recipe, ``checkpoint`` (model_export.hub's provenance) into its
    record. ``head`` (with ``embeddings``) adds its graph from
    token ids (model_export.heads). ``dense`` (sentence-transformers' Dense layers,
    after ``pooling``) goes into ``dense.bin``, which the service applies to every
    pooled vector. ``optimize`` fuses each encoder graph
    with onnxruntime's transformer optimizer (``optimize.py``) before validation;
    the fusions applied are recorded in the manifest. Without ``compact_attention``
    the directory has neither ``model_attn_compact.onnx`` nor ``model_attn_select.onnx``
    (the service answers top-k rows, summaries, float16 maps and selected layers from
    the full maps instead). ``progress`` shows each step as it starts and times it.
    A model with task adapters (``lora_tasks``) names them in ``task_names`` (the
    manifest's ``tasks``, task id t = ``task_names[t - 1]``) with an optional
    ``default_task``; every graph takes the task, and it has no compact graphs, BM42
    graph, head or int8 ranges.
    """
    out_dir = Path(out_dir)
    start = time.perf_counter()
    encoder.eval()
    if head is not None and embeddings is None:
        raise ValueError("a head reads token ids: export it with its embeddings")
    tasks = encoder.config.lora_tasks
    if late_interaction is not None and (embeddings is None or tasks):
        raise ValueError("late interaction reads token ids: export it with its embeddings")
    if tasks and (head is not None or len(task_names) != tasks):
        raise ValueError(
            f"a model of {tasks} task adapters is exported with their {tasks} names "
            "and without a head"
        )
    progress = progress or Progress(out_dir.name)
    # The compact graphs do not take a task: a model with adapters answers their requests
    # from the full maps (as --no-compact-attention does).
    modules = {
        graph: module_class
        for graph, module_class in GRAPH_MODULES.items()
        if (compact_attention and not tasks) or graph not in graph_io.COMPACT_GRAPHS
    }
    head_graph = None if head is None else HEAD_GRAPH[head.task]
    # int8 ranges are the base model's: none for a model whose tasks move its vectors.
    with_ranges = (
        embeddings is not None and tokenizer_file is not None and head is None and not tasks
    )
    progress.plan(
        export_plan(
            list(modules),
            [] if embeddings is None else _text_graphs(tokenizer_file, tasks),
            head_graph,
            optimize=optimize,
            ranges=with_ranges,
            late_interaction=late_interaction is not None,
        )
    )
    with staged_model_dir(out_dir) as staging:
        # Example batch: the size 2 x 8 is arbitrary; both axes are declared dynamic.
        example = (torch.randn(2, 8, encoder.config.d_model), torch.ones(2, 8, dtype=torch.int64))
        for graph, module_class in modules.items():
            with progress.step("export", graph):
                _export_graph(
                    module_class(encoder),
                    example
                    + extra_inputs(graph, encoder.config.n_layers, encoder.config.n_heads)
                    + task_example(tasks),
                    staging / graph,
                    opset,
                    exporter,
                    list(
                        graph_io.with_task(
                            graph_io.GRAPH_INPUTS.get(graph, graph_io.INPUT_NAMES), tasks
                        )
                    ),
                    list(graph_io.GRAPH_OUTPUTS[graph]),
                )
        fused = {}
        for graph in modules if optimize else ():
            with progress.step("optimize", graph):
                fused[graph] = optimize_graph(
                    staging / graph,
                    encoder.config,
                    # A fused kernel keeps its attention weights to itself.
                    fuse_attention=graph not in graph_io.MAP_GRAPHS,
                )
        graphs = list(modules)
        if embeddings is not None:
            graphs += _export_text_frontend(
                embeddings, encoder, tokenizer_file, staging, (opset, exporter), progress
            )
        if head is not None and head_graph is not None:
            assert embeddings is not None
            with progress.step("export", head_graph):
                _export_graph(
                    HeadGraph(embeddings, encoder, head.module),
                    # Three distinct tensors: the dynamo exporter would merge one passed thrice.
                    (
                        ids := torch.ones(2, 8, dtype=torch.int64),
                        torch.zeros_like(ids),
                        ids.clone(),
                    ),
                    staging / head_graph,
                    opset,
                    exporter,
                    list(graph_io.TEXT_GRAPH_INPUTS),
                    list(graph_io.HEAD_GRAPHS[head_graph]),
                )
            graphs.append(head_graph)
        multi_vector = None
        if late_interaction is not None:
            assert embeddings is not None
            li = late_interaction
            multi_vector = MultiVectorGraph(embeddings, encoder, li.dense, li.normalize, li.sparse)
            with progress.step("export", graph_io.GRAPH_MULTI_VECTOR):
                _export_graph(
                    multi_vector,
                    (
                        ids := torch.ones(2, 8, dtype=torch.int64),
                        torch.zeros_like(ids),
                        ids.clone(),
                    ),
                    staging / graph_io.GRAPH_MULTI_VECTOR,
                    opset,
                    exporter,
                    list(graph_io.TEXT_GRAPH_INPUTS),
                    list(li.outputs),
                )
            graphs.append(graph_io.GRAPH_MULTI_VECTOR)
        # Validated as written: reading their weights from the one shared file.
        with progress.step(*SHARE_WEIGHTS):
            share_weights([staging / graph for graph in graphs], staging / graph_io.WEIGHTS_FILE)
        # PyTorch's outputs, computed once: every graph is checked against them.
        with progress.step("validate", PYTORCH_OUTPUTS):
            references = pytorch_references(encoder, embeddings)
        checks = validate_model_dir(
            encoder, staging, atol=atol, progress=progress, references=references
        )
        text = None
        if embeddings is not None:
            checks += _validate_text_frontend(embeddings, references, staging, atol, progress)
            text = _text_manifest(embeddings, staging)
        if head is not None and head_graph is not None:
            assert embeddings is not None
            with progress.step("validate", head_graph):
                path = staging / head_graph
                checks += validate_head_graph(references, head.module, path, atol)
        if multi_vector is not None:
            with progress.step("validate", graph_io.GRAPH_MULTI_VECTOR):
                path = staging / graph_io.GRAPH_MULTI_VECTOR
                checks += validate_multi_vector_graph(references, multi_vector, path, atol)
        ranges, ranges_record = None, None
        if with_ranges:
            assert embeddings is not None and tokenizer_file is not None
            with progress.step(*RANGES):
                ranges, ranges_record = embedding_ranges(
                    encoder, embeddings, tokenizer_file, pooling or "mean", dense
                )
        graph_sha = {f: sha256_file(staging / f) for f in modules}
        manifest = Manifest(
            name=name or out_dir.name,
            architecture=encoder.config,
            opset=opset,
            graphs={f: GraphFile(graph_sha[f], graph_io.GRAPH_OUTPUTS[f]) for f in modules},
            text=text,
            pooling=pooling,
            normalize=normalize,
            matryoshka_dimensions=matryoshka_dimensions,
            prompts=dict(prompts or {}),
            default_prompt_name=default_prompt_name,
            weights=graph_io.WEIGHTS_FILE,
            weights_sha256=sha256_file(staging / graph_io.WEIGHTS_FILE),
            include_prompt=include_prompt,
            tasks=task_names,
            default_task=default_task,
            head=None
            if head is None or head_graph is None
            else ManifestHead(
                head.task,
                head_graph,
                sha256_file(staging / head_graph),
                head.labels,
                head.activation,
                head.llm,
            ),
            quantization_ranges=ranges,
            dense=write_dense(dense, staging / graph_io.DENSE_FILE) if dense else None,
            late_interaction=None
            if late_interaction is None
            else late_interaction.section(
                sha256_file(staging / graph_io.GRAPH_MULTI_VECTOR), encoder.config.d_model
            ),
            record={
                "quantization_calibration": ranges_record,
                "seed": seed,
                "weights_source": source,
                # A checkpoint's origin: its Hub commit and each file's SHA-256 (hub.py).
                **({"checkpoint": checkpoint} if checkpoint else {}),
                "validation": {
                    "atol": atol,
                    "rtol": DEFAULT_RTOL,
                    "max_abs_diff": max(c.max_abs_diff for c in checks),
                    "checks": results_json(checks),
                },
                # onnxruntime contrib operators fused in at export, per graph (by count).
                "optimizations": fused,
                "exporter": {
                    "exporter": exporter,
                    "torch": torch.__version__,
                    "onnx": onnx.__version__,
                    "onnxruntime": onnxruntime.__version__,
                    "python": platform.python_version(),
                },
            },
        )
        manifest.write(staging)
        files = {p.name: graph_sha.get(p.name) or sha256_file(p) for p in sorted(staging.iterdir())}
    progress.close()
    seconds = time.perf_counter() - start
    log.info("exported %s in %.1fs", out_dir, seconds)
    return ExportResult(out_dir, files, checks, seconds)
