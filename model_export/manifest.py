"""The model directory's typed, versioned contract: ``config.json`` as a :class:`Manifest`.

``model_export`` writes it; the service reads a model directory only through
this module (torch-free, numpy-free). Names of files, inputs and outputs come
from :mod:`model_export.graph_io`, the architecture from
:class:`~model_export.config.EncoderConfig`; both are re-exported here so a
reader needs nothing else from ``model_export``.

Format versions: 1 (the first release: no pooling section, no hidden states) is
still read, with the defaults of the time (no default pooling, no
normalisation); 2 adds ``pooling``, ``normalize``, ``matryoshka_dimensions``
and per-layer hidden states (``model_hidden.onnx``, and a ``hidden_states``
output of ``model_attn.onnx``); 3 adds the text graph (``text.graph``: token
ids to ``last_hidden_state`` in one run); 4 adds BM42's sparse graph
(``text.sparse_graph``: the last layer's [CLS] attention row), its stopword
list (``text.stopwords``) and the attention graph's ``value_norms`` output.
Within format 4, sentence-transformers' ``prompts``/``default_prompt_name`` were
added (absent: no prompts). 5 adds pooling ``last`` and ``include_prompt``
(absent: prompts pooled in), which no reader of 4 would honour, and stores every
graph's weights once, in one shared file (``weights``: ONNX external data that the graphs read),
and has no ``text.graph``: text asking only for embeddings then runs
``embeddings.onnx`` and ``model.onnx`` back to back. Each graph records its
outputs, so a reader knows what a directory can answer whatever its version; a
version-2 directory with a tokenizer still serves text, through
``embeddings.onnx`` and then the encoder. 8 adds sentence-transformers' ``Dense``
layers (``dense``: applied after pooling, before Matryoshka shortening and
normalisation), which a reader of 7 would leave out, answering other vectors.

A model directory is untrusted input (poll mode loads whatever appears on a shared
volume), so reading one is bounded: ``config.json`` is at most
``MAX_CONFIG_BYTES`` and ``MAX_CONFIG_DEPTH`` deep, every size in it has a sane
range, every file it names is a plain name in the directory that, symbolic links
followed, stays inside a given root (the model repository), the files are
sized before any is hashed, and no error quotes a digest or a path beyond the
directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from model_export import graph_io
from model_export.config import SIZE_BOUNDS, ConfigError, EncoderConfig
from model_export.manifest_sections import (
    DENSE_ACTIVATIONS,
    MAX_DENSE_FEATURES,
    MAX_DENSE_LAYERS,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    TEXT_SIZE_BOUNDS,
    Dense,
    DenseLayer,
    Head,
    LateInteraction,
    LlmReranker,
    PromptTemplate,
    TextFrontEnd,
)
from model_export.model_files import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_NAME_BYTES,
    Cancelled,
    ManifestError,
    check_file_name,
    json_depth,
    open_model_file,
    resolve_file,
    sha256_file,
    sha256_stream,
)

__all__ = [
    "DENSE_ACTIVATIONS",
    "FORMAT_VERSION",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_DENSE_FEATURES",
    "MAX_DENSE_LAYERS",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "MAX_NAME_BYTES",
    "POOLINGS",
    "SIZE_BOUNDS",
    "TEXT_SIZE_BOUNDS",
    "Cancelled",
    "ConfigError",
    "Dense",
    "DenseLayer",
    "EncoderConfig",
    "GraphFile",
    "Head",
    "LateInteraction",
    "LlmReranker",
    "Manifest",
    "ManifestError",
    "Pooling",
    "PromptTemplate",
    "TextFrontEnd",
    "check_file_name",
    "graph_io",
    "json_depth",
    "open_model_file",
    "resolve_file",
    "sha256_file",
]

# 6: the compact attention graph (graph_io.GRAPH_COMPACT_ATTENTION); older exports answer
# the same requests from their full maps. 7: the selected-maps graph
# (graph_io.GRAPH_SELECTED_ATTENTION); older exports select and cast after the full maps.
# 8: Dense layers after pooling (``dense``). 9: late interaction (``late_interaction``:
# the multi-vector graph).
FORMAT_VERSION: Final = 9
READABLE_VERSIONS: Final = (1, 2, 3, 4, 5, 6, 7, 8, 9)

# "last": the last token of each sequence (sentence-transformers' ``lasttoken``).
Pooling = Literal["mean", "cls", "max", "last"]
POOLINGS: Final[tuple[str, ...]] = ("mean", "cls", "max", "last")
# sentence-transformers' prompts (config_sentence_transformers.json), bounded: a model
# directory is untrusted, and a prompt is prepended to every text a request names it for.
MAX_PROMPTS: Final = 64
MAX_PROMPT_NAME: Final = 64
MAX_PROMPT_CHARS: Final = 2048


@dataclass(frozen=True)
class GraphFile:
    """One ONNX graph of the model directory: its digest and its outputs, in order."""

    sha256: str
    outputs: tuple[str, ...]


def _tasks(raw: object) -> tuple[str, ...]:
    """tasks as read from JSON: a list (names checked after)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ManifestError("tasks must be a list of names")
    return tuple(raw)


def _ranges(raw: object) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """quantization_ranges as read from JSON: two lists of numbers (checked after)."""
    if raw is None:
        return None
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(r, list) for r in raw)):
        raise ManifestError("quantization_ranges must be [mins, maxes]")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for r in raw for v in r):
        raise ManifestError("quantization_ranges must hold numbers only")
    mins, maxes = (tuple(float(v) for v in r) for r in raw)
    return mins, maxes


@dataclass(frozen=True)
class Manifest:
    """Everything a server needs to know about a model directory, and its provenance.

    ``pooling``/``normalize`` are the model's own sentence-embedding recipe
    (sentence-transformers' ``1_Pooling/config.json``), used by protocols that
    answer one vector per text (OpenAI embeddings). ``matryoshka_dimensions``
    lists the prefix lengths the model was trained to be truncated to; empty
    means truncation is not supported. ``prompts`` (name -> text prepended to a
    text) and ``default_prompt_name`` are sentence-transformers' (e.g. E5's
    ``query: ``); a request names one, or gets the default. ``include_prompt``
    false (sentence-transformers' ``1_Pooling``, as INSTRUCTOR's) leaves a prompt's
    tokens, [CLS] with them, out of the pooled vector: the model was trained so.
    """

    name: str
    architecture: EncoderConfig
    opset: int
    graphs: dict[str, GraphFile]
    text: TextFrontEnd | None = None
    pooling: Pooling | None = None
    normalize: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    prompts: dict[str, str] = field(default_factory=dict, hash=False)
    default_prompt_name: str | None = None
    # format 5: the file every graph reads its weights from (graph_io.WEIGHTS_FILE).
    weights: str | None = None
    weights_sha256: str | None = None
    include_prompt: bool = True
    # A head (cross-encoder, classifier, SPLADE): what the model answers besides embeddings.
    head: Head | None = None
    # int8/uint8 sentence embeddings: (mins, maxes) per dimension of the model's own
    # sentence vectors, from calibration sentences at export (provenance in ``record``).
    quantization_ranges: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    # format 8: sentence-transformers' Dense layers, after pooling (the served vector's width)
    dense: Dense | None = None
    # Task adapters (architecture.lora_tasks, Jina v3): their names, task id t naming
    # tasks[t - 1] (0: none), and the one a request without a task gets (None: none).
    tasks: tuple[str, ...] = ()
    default_task: str | None = None
    # format 9: multi-vector (ColBERT, bge-m3) outputs from graph_io.GRAPH_MULTI_VECTOR
    late_interaction: LateInteraction | None = None
    format_version: int = FORMAT_VERSION
    # Provenance: recorded for people, never read by the server.
    record: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.format_version not in READABLE_VERSIONS:
            raise ManifestError(
                f"format_version {self.format_version!r} is not supported (this version reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}): re-export the model"
            )
        for name in self.graphs:
            check_file_name(name, "a graph's file")
        if self.weights is not None:
            check_file_name(self.weights, "weights")
        if (self.weights is None) != (self.weights_sha256 is None):
            raise ManifestError("weights and weights_sha256 go together")
        missing = sorted(set(graph_io.REQUIRED_GRAPHS) - set(self.graphs))
        if missing:
            raise ManifestError(f"graphs lacks {', '.join(missing)}")
        for name, graph in self.graphs.items():
            unknown = set(graph.outputs) - set(graph_io.GRAPH_OUTPUTS.get(name, ()))
            if unknown or graph.outputs[:1] != (graph_io.OUTPUT_HIDDEN,):
                raise ManifestError(f"graphs.{name} has unexpected outputs {list(graph.outputs)}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ManifestError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        self._check_prompts()
        self._check_tasks()
        self._check_ranges()
        if self.head is not None and self.text is None:
            raise ManifestError("head: a head reads token ids, so the model needs its text")
        if self.late_interaction is not None:
            if self.text is None:
                raise ManifestError("late_interaction: it reads token ids, so it needs text")
            if self.format_version < 9:
                raise ManifestError("late_interaction: written since format_version 9")
        dense = self.dense
        if dense is not None:
            if self.pooling is None or dense.layers[0].in_features != self.architecture.d_model:
                raise ManifestError("dense: its layers follow a pooling of d_model-wide vectors")
            if self.format_version < 8:
                raise ManifestError("dense: written since format_version 8")
        width = self.pooled_width
        for dim in self.matryoshka_dimensions:
            if isinstance(dim, bool) or not isinstance(dim, int) or not 0 < dim <= width:
                raise ManifestError(
                    f"matryoshka_dimensions must be integers in 1..{width}, got {dim!r}"
                )

    def _check_prompts(self) -> None:
        if not isinstance(self.prompts, dict) or len(self.prompts) > MAX_PROMPTS:
            raise ManifestError(f"prompts must be an object of at most {MAX_PROMPTS} prompts")
        for name, prompt in self.prompts.items():
            if not (isinstance(name, str) and 0 < len(name) <= MAX_PROMPT_NAME):
                raise ManifestError(f"a prompt's name must be 1..{MAX_PROMPT_NAME} characters")
            if not (isinstance(prompt, str) and len(prompt) <= MAX_PROMPT_CHARS):
                raise ManifestError(f"prompt {name!r} must be text of at most {MAX_PROMPT_CHARS}")
        default = self.default_prompt_name
        if default is not None and default not in self.prompts:
            raise ManifestError(f"default_prompt_name {default!r} is not one of the prompts")
        if not isinstance(self.include_prompt, bool):
            raise ManifestError(f"include_prompt must be a boolean, got {self.include_prompt!r}")

    def _check_tasks(self) -> None:
        tasks = self.tasks
        if len(tasks) != self.architecture.lora_tasks:
            raise ManifestError(
                f"tasks names {len(tasks)} tasks, but the architecture has "
                f"{self.architecture.lora_tasks} task adapters"
            )
        for name in tasks:
            if not (isinstance(name, str) and 0 < len(name) <= MAX_PROMPT_NAME):
                raise ManifestError(f"a task's name must be 1..{MAX_PROMPT_NAME} characters")
        if len(set(tasks)) != len(tasks):
            raise ManifestError(f"tasks has duplicates: {list(tasks)}")
        if self.default_task is not None and self.default_task not in tasks:
            raise ManifestError(f"default_task {self.default_task!r} is not one of the tasks")

    def task_id(self, name: str | None) -> int:
        """The graphs' task input for task ``name`` (None: the default task, else none):
        0 for no adapter, t for tasks[t - 1]; KeyError for a name it does not have."""
        name = self.default_task if name is None else name
        if name is None:
            return 0
        if name not in self.tasks:
            raise KeyError(name)
        return self.tasks.index(name) + 1

    def _check_ranges(self) -> None:
        ranges = self.quantization_ranges
        if ranges is None:
            return
        width = self.pooled_width
        if not (
            isinstance(ranges, tuple)
            and len(ranges) == 2
            and all(len(r) == width for r in ranges)
            and all(isinstance(v, float) and math.isfinite(v) for r in ranges for v in r)
        ):
            raise ManifestError(
                f"quantization_ranges must be [mins, maxes] of {width} finite numbers each"
            )

    @property
    def pooled_width(self) -> int:
        """The width of a served pooled vector: the last Dense layer's, else d_model."""
        dense = self.dense
        return self.architecture.d_model if dense is None else dense.layers[-1].out_features

    @property
    def task(self) -> str:
        """What the model answers besides token vectors, for errors and model listings:
        ``embed`` (no head), ``rerank`` (one logit), ``classify`` or ``splade``."""
        head = self.head
        if head is None:
            return "embed"
        return "rerank" if head.reranks else head.task

    @property
    def has_tokenizer(self) -> bool:
        return self.text is not None and self.text.tokenizer is not None

    @property
    def text_graph(self) -> str | None:
        """The one-run text graph (format 3), if the directory has it."""
        return None if self.text is None else self.text.graph

    @property
    def has_value_norms(self) -> bool:
        """The attention graph gives value norms (format 4): attention norms can be asked."""
        return graph_io.OUTPUT_VALUE_NORMS in self.graphs[graph_io.GRAPH_ATTENTION].outputs

    @property
    def has_hidden_states(self) -> bool:
        """Per-layer hidden states (written since format_version 2): both graphs give them."""
        hidden = self.graphs.get(graph_io.GRAPH_HIDDEN_STATES)
        return (
            hidden is not None
            and graph_io.OUTPUT_HIDDEN_STATES in hidden.outputs
            and graph_io.OUTPUT_HIDDEN_STATES in self.graphs[graph_io.GRAPH_ATTENTION].outputs
        )

    def embedding_parameters(self) -> int:
        """Weights of the token-embedding tables and their LayerNorm (0 without a text
        front end)."""
        text = self.text
        if text is None:
            return 0
        rows = text.vocab_size + text.max_positions + text.type_vocab_size + 2
        return rows * self.architecture.d_model

    def estimated_bytes(self) -> int:
        """The least memory its graphs take loaded, from the architecture alone: one byte
        per weight (an int8 export), once with a shared weight file, else in each graph
        that holds it."""
        encoder = self.architecture.parameters()
        embeddings = self.embedding_parameters()
        if self.weights is not None:
            return encoder + embeddings
        total = len(self.graphs) * encoder
        text = self.text
        if text is not None:
            one_run = sum(g is not None for g in (text.graph, text.sparse_graph))
            total += embeddings + one_run * (encoder + embeddings)
        return total

    def files(self) -> dict[str, str]:
        """Every file the model directory must hold -> its SHA-256."""
        files = {name: graph.sha256 for name, graph in self.graphs.items()}
        if self.weights is not None and self.weights_sha256 is not None:
            files[self.weights] = self.weights_sha256
        if self.head is not None:
            files[self.head.graph] = self.head.graph_sha256
        if self.dense is not None:
            files[self.dense.file] = self.dense.sha256
        if self.late_interaction is not None:
            files[self.late_interaction.graph] = self.late_interaction.sha256
        if self.text is not None:
            files[self.text.embeddings_graph] = self.text.embeddings_sha256
            if self.text.tokenizer is not None and self.text.tokenizer_sha256 is not None:
                files[self.text.tokenizer] = self.text.tokenizer_sha256
            for name in ("graph", "sparse_graph", "stopwords"):
                file, digest = getattr(self.text, name), getattr(self.text, f"{name}_sha256")
                if file is not None and digest is not None:
                    files[file] = digest
        return files

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "name": self.name,
            "architecture": self.architecture.to_dict(),
            "opset": self.opset,
            "inputs": {
                n: {"dtype": dt, "shape": graph_io.SHAPES[n]}
                for n, dt in ((graph_io.INPUT_EMBEDS, "float32"), (graph_io.INPUT_MASK, "int64"))
            },
            "graphs": {
                f: {
                    "outputs": {
                        o: {"dtype": graph_io.DTYPES.get(o, "float32"), "shape": graph_io.SHAPES[o]}
                        for o in g.outputs
                    },
                    "sha256": g.sha256,
                }
                for f, g in self.graphs.items()
            },
            "text": None if self.text is None else asdict(self.text),
            "pooling": self.pooling,
            "normalize": self.normalize,
            "matryoshka_dimensions": list(self.matryoshka_dimensions),
            "prompts": dict(self.prompts),
            "default_prompt_name": self.default_prompt_name,
            **(
                {"weights": self.weights, "weights_sha256": self.weights_sha256}
                if self.weights is not None
                else {}
            ),
            "include_prompt": self.include_prompt,
            **({"head": self._head_dict()} if self.head is not None else {}),
            **(
                {"quantization_ranges": [list(r) for r in self.quantization_ranges]}
                if self.quantization_ranges is not None
                else {}
            ),
            **({"dense": asdict(self.dense)} if self.dense is not None else {}),
            **(
                {"tasks": list(self.tasks), "default_task": self.default_task} if self.tasks else {}
            ),
            **(
                {"late_interaction": asdict(self.late_interaction)}
                if self.late_interaction is not None
                else {}
            ),
            **self.record,
        }

    def _head_dict(self) -> dict[str, Any]:
        """The head as written: ``llm`` only for an LLM reranker (older heads unchanged)."""
        assert self.head is not None
        head = asdict(self.head)
        if head["llm"] is None:
            del head["llm"]
        return head

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Manifest:
        """Parse a ``config.json`` object; ManifestError names what is wrong."""
        known = {"format_version", "name", "architecture", "opset", "inputs", "graphs", "text"}
        known |= {"pooling", "normalize", "matryoshka_dimensions"}
        known |= {"prompts", "default_prompt_name", "include_prompt", "weights", "weights_sha256"}
        known |= {"head", "quantization_ranges", "dense", "tasks", "default_task"}
        known |= {"late_interaction"}
        try:
            text = raw.get("text")
            dims = raw.get("matryoshka_dimensions") or []
            if not isinstance(dims, list):
                raise ManifestError("matryoshka_dimensions must be a list")
            return cls(
                format_version=raw["format_version"],
                name=str(raw["name"]),
                architecture=EncoderConfig.from_dict(raw["architecture"]),
                opset=int(raw["opset"]),
                graphs={
                    f: GraphFile(str(g["sha256"]), tuple(g["outputs"]))
                    for f, g in raw["graphs"].items()
                },
                text=TextFrontEnd.from_dict(text) if text else None,
                pooling=raw.get("pooling"),
                normalize=bool(raw.get("normalize", False)),
                matryoshka_dimensions=tuple(dims),
                prompts=raw.get("prompts") or {},
                default_prompt_name=raw.get("default_prompt_name"),
                weights=raw.get("weights"),
                weights_sha256=raw.get("weights_sha256"),
                include_prompt=raw.get("include_prompt", True),
                head=Head.from_dict(raw["head"]) if raw.get("head") else None,
                quantization_ranges=_ranges(raw.get("quantization_ranges")),
                dense=Dense.from_dict(raw["dense"]) if raw.get("dense") is not None else None,
                tasks=_tasks(raw.get("tasks")),
                default_task=raw.get("default_task"),
                late_interaction=LateInteraction.from_dict(raw["late_interaction"])
                if raw.get("late_interaction") is not None
                else None,
                record={k: v for k, v in raw.items() if k not in known},
            )
        except ManifestError:
            raise
        except KeyError as exc:
            raise ManifestError(f"lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as exc:  # ConfigError is a ValueError
            raise ManifestError(str(exc)) from exc

    @classmethod
    def read(cls, model_dir: Path, within: Path | None = None) -> Manifest:
        """Read ``config.json`` of ``model_dir`` (files are not checked: see ``verify``);
        its size and nesting are bounded before it is parsed. ``within``: see
        ``resolve_file``."""
        config = graph_io.CONFIG_FILE
        try:
            with open_model_file(model_dir, config, within) as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
        except FileNotFoundError:
            raise ManifestError(f"{config} is missing") from None
        except OSError as exc:
            raise ManifestError(f"{config} is not readable: {exc.strerror}") from None
        if len(data) > MAX_CONFIG_BYTES:
            raise ManifestError(f"{config} is larger than {MAX_CONFIG_BYTES} bytes")
        if json_depth(data) > MAX_CONFIG_DEPTH:
            raise ManifestError(f"{config} nests deeper than {MAX_CONFIG_DEPTH} levels")
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise ManifestError(f"{config} is not readable JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ManifestError(f"{config} is not a JSON object")
        try:
            return cls.from_dict(raw)
        except ManifestError as exc:
            raise ManifestError(f"{config} is invalid: {exc}") from None

    def write(self, model_dir: Path) -> None:
        (model_dir / graph_io.CONFIG_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def read_file(
        self, model_dir: Path, name: str, within: Path | None = None, *, max_bytes: int
    ) -> bytes:
        """The bytes of a small file the manifest names (a tokenizer, stopwords, Dense
        weights), read once through ``open_model_file`` and checked against its SHA-256
        here: what the caller uses is what was verified, whatever the path points at by
        now (``verify`` hashed it earlier, by then maybe swapped). ManifestError beyond
        ``max_bytes``, for a name it does not list, or for other bytes."""
        want = self.files().get(name)
        if want is None:
            raise ManifestError(f"{name} is not a file of this model")
        with open_model_file(model_dir, name, within) as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ManifestError(f"{name} is larger than the {max_bytes:,} bytes it may take")
        if hashlib.sha256(data).hexdigest() != want:
            raise ManifestError(
                f"{name} is corrupt: it does not match the SHA-256 recorded in "
                f"{graph_io.CONFIG_FILE}"
            )
        return data

    def verify(
        self,
        model_dir: Path,
        within: Path | None = None,
        *,
        max_bytes: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, Path]:
        """Check that every file is present and matches its recorded SHA-256; each file's
        name -> its real path (see ``resolve_file``). Files larger than ``max_bytes`` in
        total are refused before any is hashed; ``cancelled`` is asked between chunks."""
        paths = {name: resolve_file(model_dir, name, within) for name in self.files()}
        with contextlib.ExitStack() as opened:
            files = {}
            for name in paths:
                try:
                    files[name] = opened.enter_context(open_model_file(model_dir, name, within))
                except (FileNotFoundError, IsADirectoryError):
                    raise ManifestError(f"{name} is missing") from None
            total = sum(os.fstat(f.fileno()).st_size for f in files.values())
            if max_bytes is not None and total > max_bytes:
                raise ManifestError(
                    f"its files take {total / 2**20:,.0f} MiB, more than the "
                    f"{max_bytes / 2**20:,.0f} MiB it may take"
                )
            for name, want in self.files().items():
                # Only whether it matches: the digest of a file is not for an error message.
                if sha256_stream(files[name], name, cancelled) != want:
                    raise ManifestError(
                        f"{name} is corrupt: it does not match the SHA-256 recorded in "
                        f"{graph_io.CONFIG_FILE}"
                    )
        return paths
