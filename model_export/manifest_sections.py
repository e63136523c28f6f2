"""The manifest's optional sections, each a typed, checked part of ``config.json``: the
text front end (token ids in), sentence-transformers' Dense layers (after pooling) and
a head (classify or SPLADE). Read through :mod:`model_export.manifest`, which
re-exports them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Final

from model_export import graph_io
from model_export.config import check_size
from model_export.model_files import ManifestError, check_file_name

# Sane ranges of the text front end's sizes (XLM-R's vocabulary is 250,002).
TEXT_SIZE_BOUNDS: Final[dict[str, int]] = {
    "vocab_size": 1 << 24,
    "type_vocab_size": 1 << 16,
    "max_positions": 1 << 20,
}


@dataclass(frozen=True)
class TextFrontEnd:
    """Token ids -> the encoder's input embeddings (``embeddings.onnx``), a tokenizer,
    and (format 3) ``graph``: ids -> ``last_hidden_state`` in one run."""

    embeddings_graph: str
    embeddings_sha256: str
    vocab_size: int
    type_vocab_size: int
    max_positions: int
    tokenizer: str | None = None
    tokenizer_sha256: str | None = None
    graph: str | None = None
    graph_sha256: str | None = None
    sparse_graph: str | None = None  # format 4: ids -> the last layer's [CLS] attention row
    sparse_graph_sha256: str | None = None
    stopwords: str | None = None  # format 4: words left out of BM42 vectors, one per line
    stopwords_sha256: str | None = None

    def __post_init__(self) -> None:
        for name, bound in TEXT_SIZE_BOUNDS.items():
            check_size(f"text.{name}", getattr(self, name), bound, ManifestError)
        check_file_name(self.embeddings_graph, "text.embeddings_graph")
        for name in ("tokenizer", "graph", "sparse_graph", "stopwords"):
            if getattr(self, name) is not None:
                check_file_name(getattr(self, name), f"text.{name}")
        if (self.tokenizer is None) != (self.tokenizer_sha256 is None):
            raise ManifestError("text.tokenizer and text.tokenizer_sha256 go together")
        for name in ("graph", "sparse_graph", "stopwords"):
            if (getattr(self, name) is None) != (getattr(self, f"{name}_sha256") is None):
                raise ManifestError(f"text.{name} and text.{name}_sha256 go together")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TextFrontEnd:
        try:
            return cls(**data)
        except TypeError as exc:  # unknown or missing keys
            raise ManifestError(f"text: {exc}") from None


DENSE_ACTIVATIONS: Final = ("identity", "tanh", "relu")
# Dense widths a model may have (EmbeddingGemma's widest is 3,072), and layers in a row.
MAX_DENSE_FEATURES: Final = 1 << 16
MAX_DENSE_LAYERS: Final = 8


@dataclass(frozen=True)
class DenseLayer:
    """sentence-transformers' ``Dense``: activation(W x + b), W [out_features, in_features]."""

    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of DENSE_ACTIVATIONS

    def __post_init__(self) -> None:
        for name in ("in_features", "out_features"):
            check_size(f"dense.{name}", getattr(self, name), MAX_DENSE_FEATURES, ManifestError)
        if not isinstance(self.bias, bool) or self.activation not in DENSE_ACTIVATIONS:
            raise ManifestError(
                f"dense: bias must be a boolean, activation one of {DENSE_ACTIVATIONS}"
            )

    @property
    def floats(self) -> int:
        return self.out_features * (self.in_features + int(self.bias))


@dataclass(frozen=True)
class Dense:
    """The Dense layers applied in order to a pooled vector; their weights are ``file``
    (graph_io.DENSE_FILE's layout), ``floats`` float32 values in all."""

    file: str
    sha256: str
    layers: tuple[DenseLayer, ...]

    def __post_init__(self) -> None:
        check_file_name(self.file, "dense.file")
        if not 0 < len(self.layers) <= MAX_DENSE_LAYERS:
            raise ManifestError(f"dense.layers must list 1..{MAX_DENSE_LAYERS} layers")
        for before, after in itertools.pairwise(self.layers):
            if after.in_features != before.out_features:
                raise ManifestError("dense.layers: each layer's in_features is the last's out")

    @property
    def floats(self) -> int:
        return sum(layer.floats for layer in self.layers)

    @classmethod
    def from_dict(cls, data: object) -> Dense:
        if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
            raise ManifestError("dense must be an object with a list of layers")
        if not all(isinstance(layer, dict) for layer in data["layers"]):
            raise ManifestError("dense.layers must be objects")
        try:
            layers = tuple(DenseLayer(**layer) for layer in data["layers"])
            return cls(**{**data, "layers": layers})
        except TypeError as exc:  # unknown or missing keys
            raise ManifestError(f"dense: {exc}") from None


HEAD_TASKS: Final = ("classify", "splade")
ACTIVATIONS: Final = ("sigmoid", "softmax", "identity")
MAX_LABELS: Final = 4096
MAX_LABEL_CHARS: Final = 256


@dataclass(frozen=True)
class Head:
    """The model's head, run as one graph from token ids (``graph_io.HEAD_GRAPHS``).

    ``classify``: a sequence-classification head, one logit per label (``labels``,
    the checkpoint's ``id2label`` in order); one label is a reranker (a cross-encoder
    scoring query-document pairs). ``activation`` is the score function the checkpoint
    defines (sentence-transformers' CrossEncoder: sigmoid for one label, else
    identity; transformers' pipelines: softmax over several labels). ``splade``: a
    masked-LM head giving a SPLADE vector over the vocabulary."""

    task: str
    graph: str
    graph_sha256: str
    labels: tuple[str, ...] = ()
    activation: str = "identity"

    def __post_init__(self) -> None:
        if self.task not in HEAD_TASKS:
            raise ManifestError(f"head.task must be one of {HEAD_TASKS}, got {self.task!r}")
        check_file_name(self.graph, "head.graph")
        if graph_io.HEAD_GRAPHS.get(self.graph) is None:
            raise ManifestError(f"head.graph must be one of {sorted(graph_io.HEAD_GRAPHS)}")
        want = graph_io.GRAPH_SCORES if self.task == "classify" else graph_io.GRAPH_SPLADE
        if self.graph != want:
            raise ManifestError(f"head.graph of a {self.task} head is {want}, got {self.graph}")
        if self.activation not in ACTIVATIONS:
            raise ManifestError(f"head.activation must be one of {ACTIVATIONS}")
        labels = self.labels
        if self.task == "classify" and not 0 < len(labels) <= MAX_LABELS:
            raise ManifestError(f"head.labels must list 1..{MAX_LABELS} labels")
        if self.task == "splade" and labels:
            raise ManifestError("head.labels: a splade head has no labels")
        for label in labels:
            if not (isinstance(label, str) and 0 < len(label) <= MAX_LABEL_CHARS):
                raise ManifestError(f"head.labels: each is text of 1..{MAX_LABEL_CHARS} chars")

    @property
    def reranks(self) -> bool:
        """One logit: a score per query-document pair."""
        return self.task == "classify" and len(self.labels) == 1

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Head:
        labels = data.get("labels") or []
        if not isinstance(data, dict) or not isinstance(labels, list):
            raise ManifestError("head must be an object, its labels a list")
        try:
            return cls(**{**data, "labels": tuple(labels)})
        except TypeError as exc:  # unknown or missing keys
            raise ManifestError(f"head: {exc}") from None
