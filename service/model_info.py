"""What the service knows of a model directory, read through its manifest (no onnxruntime).

Kept apart from ``runtime`` so the engine's and protocols' model types never pull
in the backend. A model directory is untrusted input: it is read only through
:mod:`model_export.manifest`, which bounds ``config.json`` and keeps every file
it names inside the model repository (symbolic links that leave it are refused
unless ``ATTNSERVE_FOLLOW_SYMLINKS`` allows them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from model_export.manifest import EncoderConfig, Manifest, ManifestError, Pooling, graph_io
from service.attention_scratch import longest_affordable
from service.dense import FLOAT_BYTES, DenseWeights, load_dense
from service.errors import ModelLoadError
from service.lane_sessions import lane_session_copies
from service.settings import Settings


@dataclass(frozen=True)
class ModelInfo:
    """What the service knows of a model: its manifest, where it lives, its served length."""

    manifest: Manifest
    path: Path
    max_seq_len: int  # the model's own length, capped by the server's (``served_length``)
    created: int  # Unix time its manifest was written (OpenAI's model "created")
    version: str = "1"  # its version in the repository (<name>/<version>/, or "1")
    # Each file the manifest names -> its real path, checked: the only paths opened.
    files: dict[str, Path] = field(default_factory=dict, compare=False)
    estimated_bytes: int = 0  # memory it takes loaded (the larger of files and weights)
    # sentence-transformers' Dense layers, applied to every pooled vector (service/dense.py)
    dense: tuple[DenseWeights, ...] = field(default=(), compare=False)
    # What its files must stay inside (the repository; None: the model directory).
    within: Path | None = None
    # What set ``max_seq_len``: the model, or the setting that capped it.
    max_seq_len_by: str = "the model"

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def config(self) -> EncoderConfig:
        return self.manifest.architecture

    @property
    def default_pooling(self) -> Pooling:
        """What ``pooling: model`` means: the manifest's pooling (sentence-transformers'),
        mean pooling when it names none."""
        return self.manifest.pooling or "mean"

    @property
    def has_tokenizer(self) -> bool:
        return self.manifest.has_tokenizer

    @property
    def pooled_width(self) -> int:
        """A served pooled vector's width: its last Dense layer's, else d_model."""
        return self.manifest.pooled_width

    def file(self, name: str) -> Path:
        """The checked path of a file the manifest names."""
        return self.files[name]

    def read(self, name: str, max_bytes: int) -> bytes:
        """A small file the manifest names, its bytes checked against its SHA-256 as they
        are read (``Manifest.read_file``: no swap after ``verify`` can change them);
        ModelLoadError if it cannot be."""
        try:
            return self.manifest.read_file(self.path, name, self.within, max_bytes=max_bytes)
        except ManifestError as exc:
            raise ModelLoadError(f"model {self.name!r}: {exc}") from exc
        except OSError as exc:
            raise ModelLoadError(
                f"model {self.name!r}: cannot read {name}: {exc.strerror}"
            ) from exc


# An absolute path in a library's message (onnxruntime names where external data resolved).
_ABSOLUTE_PATH = re.compile(r"/[^\s\"']+")


def cannot_load(info: ModelInfo, path: Path, shown: str, exc: Exception) -> ModelLoadError:
    """A library's load error naming ``path``, the file ``shown`` by its name in the model
    directory instead, and any other absolute path as "…": the repository's path, and
    whatever a hostile graph pointed at, stay out of answers."""
    said = _ABSOLUTE_PATH.sub("…", str(exc).replace(str(path), shown))
    return ModelLoadError(f"model {info.name!r}: cannot load {shown}: {said}")


def _prepacked_copies(manifest: Manifest, files: dict[str, Path], settings: Settings) -> int:
    """Bytes the pre-packed sessions add to a shared weight file: each holds its own copy
    of the encoder's share of it (the token embeddings are looked up, never packed), and
    so does each lane session of its graph not opened from the session cache
    (``lane_sessions.lane_session_copies``)."""
    if manifest.weights is None:
        return 0
    encoder = manifest.architecture.parameters()
    share = encoder / (encoder + manifest.embedding_parameters())
    labels = {graph_io.GRAPH_LABELS[graph] for graph in manifest.graphs}
    if manifest.text is not None and manifest.text.sparse_graph is not None:
        labels.add(graph_io.GRAPH_LABELS[graph_io.GRAPH_SPARSE])
    if manifest.head is not None:
        labels.add(graph_io.GRAPH_LABELS[manifest.head.graph])
    if manifest.late_interaction is not None:
        labels.add(graph_io.GRAPH_LABELS[graph_io.GRAPH_MULTI_VECTOR])
    copies = len(labels & settings.prepacked_graph_labels) * (1 + lane_session_copies(settings))
    return int(copies * share * files[manifest.weights].stat().st_size)


def read_model_info(
    model_dir: Path,
    settings: Settings,
    version: str = "1",
    *,
    budget: int | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ModelInfo:
    """Read the manifest (bounded), check what it would take against ``budget`` bytes
    (default ATTNSERVE_MODEL_MEMORY_BYTES) and then every file's SHA-256 against it.
    Errors name the model and files in its directory, never a path beyond it."""
    budget = settings.model_memory_bytes if budget is None else budget
    within = settings.model_repository
    if settings.follow_symlinks:  # anywhere: the file system's root
        within = Path(within.resolve().anchor)
    where = f"model {model_dir.name!r}"
    try:
        manifest = Manifest.read(model_dir, within)
        weights = manifest.estimated_bytes()
        if weights > budget:
            raise ManifestError(
                f"its architecture needs at least {weights / 2**20:,.0f} MiB, more than "
                f"the {budget / 2**20:,.0f} MiB of ATTNSERVE_MODEL_MEMORY_BYTES left"
            )
        files = manifest.verify(model_dir, within, max_bytes=budget, cancelled=cancelled)
        config = files.get(graph_io.CONFIG_FILE) or (model_dir / graph_io.CONFIG_FILE)
        created = int(config.stat().st_mtime)
        held = max(weights, sum(path.stat().st_size for path in files.values()))
        held += _prepacked_copies(manifest, files, settings)
        dense: tuple[DenseWeights, ...] = ()
        if manifest.dense is not None:
            size = manifest.dense.floats * FLOAT_BYTES
            data = manifest.read_file(model_dir, manifest.dense.file, within, max_bytes=size)
            dense = load_dense(manifest.dense, data)
    except ManifestError as exc:
        raise ModelLoadError(f"{where}: {exc}") from exc
    except OSError as exc:  # the directory changed under us: say so without its path
        raise ModelLoadError(f"{where}: cannot read it: {exc.strerror}") from exc
    max_seq_len, max_seq_len_by = served_length(manifest.architecture, settings)
    return ModelInfo(
        manifest=manifest,
        path=model_dir,
        max_seq_len=max_seq_len,
        max_seq_len_by=max_seq_len_by,
        created=created,
        version=version,
        files=files,
        estimated_bytes=held,
        dense=dense,
        within=within,
    )


def served_length(config: EncoderConfig, settings: Settings) -> tuple[int, str]:
    """The longest sequence served, and what set it: the model's own length, the
    server's ``ATTNSERVE_MAX_SEQ_LEN``, or the longest whose attention scratch fits in
    ``ATTNSERVE_MAX_INFLIGHT_BYTES`` (a longer one would be refused by admission anyway,
    and the start-up probe of the served length must fit the same budget)."""
    bounds = {
        "the model": config.max_seq_len,
        "ATTNSERVE_MAX_SEQ_LEN": settings.max_seq_len,
        "ATTNSERVE_MAX_INFLIGHT_BYTES": longest_affordable(config, settings.max_inflight_bytes),
    }
    by = min(bounds, key=lambda name: bounds[name])  # the first of equals: the model
    return bounds[by], by


# (session key, graph label, file, inputs, outputs) of one graph a runtime opens.
SessionGraph = tuple[str, str, str, tuple[str, ...], tuple[str, ...]]


def session_graphs(info: ModelInfo) -> list[SessionGraph]:
    """Each graph of ``info``'s export a runtime opens a session of: each the manifest
    lists (checked at open to have the outputs it records), the text graphs, a head."""
    tasks = info.config.lora_tasks  # a model with task adapters: each graph takes the task
    graphs: list[SessionGraph] = [
        (
            graph,
            graph,
            graph,
            graph_io.with_task(graph_io.GRAPH_INPUTS.get(graph, graph_io.INPUT_NAMES), tasks),
            outs,
        )
        for graph, outs in ((g, e.outputs) for g, e in info.manifest.graphs.items())
    ]
    text, ids = info.manifest.text, graph_io.TEXT_GRAPH_INPUTS
    if text is not None and text.graph is not None:
        text_graph = graph_io.GRAPH_TEXT
        graphs.append((text_graph, text_graph, text.graph, ids, graph_io.TEXT_GRAPH_OUTPUTS))
    # BM42 (format 4): the [CLS] attention row graph.
    if text is not None and text.sparse_graph is not None:
        sparse = text.sparse_graph
        graphs.append((sparse, graph_io.GRAPH_SPARSE, sparse, ids, graph_io.SPARSE_GRAPH_OUTPUTS))
    # A head (cross-encoder, classifier, SPLADE): token ids -> its answer per sequence.
    head = info.manifest.head
    if head is not None:
        graphs.append((head.graph, head.graph, head.graph, ids, graph_io.HEAD_GRAPHS[head.graph]))
    # Late interaction (format 9): token ids -> dense, multi-vector and lexical outputs.
    late = info.manifest.late_interaction
    if late is not None:
        graphs.append((late.graph, late.graph, late.graph, ids, late.outputs))
    if text is not None:  # run as GRAPH_TOKEN_EMBEDDINGS, whatever its file is named
        lookup = graph_io.GRAPH_TOKEN_EMBEDDINGS
        lookup_outputs = graph_io.ID_GRAPHS[lookup]
        inputs = graph_io.with_task(graph_io.TEXT_INPUT_NAMES, tasks)
        graphs.append((lookup, lookup, text.embeddings_graph, inputs, lookup_outputs))
    return graphs
