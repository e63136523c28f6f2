"""The manifest's optional sections, each a typed, checked part of ``config.json``: the
text front end (token ids in), sentence-transformers' Dense layers (after pooling), a
head (classify or SPLADE) and late interaction (multi-vector outputs). Read through
:mod:`model_export.manifest`, which re-exports them."""

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
# What an LLM reranker's template leaves to fill, each at most once per template.
SLOTS: Final = ("instruction", "query", "document")
MAX_TEMPLATE_CHARS: Final = 1 << 16
MAX_ANSWERS: Final = 2


@dataclass(frozen=True)
class PromptTemplate:
    """A text template as fixed pieces around slots: ``pieces[0] slots[0] pieces[1] ...``
    (one more piece than slots), each slot one of SLOTS, query before document."""

    pieces: tuple[str, ...]
    slots: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.pieces) != len(self.slots) + 1:
            raise ManifestError("llm template: one more piece than slots")
        if not all(isinstance(p, str) for p in self.pieces):
            raise ManifestError("llm template: pieces are text")
        if sum(map(len, self.pieces)) > MAX_TEMPLATE_CHARS:
            raise ManifestError(f"llm template: over {MAX_TEMPLATE_CHARS} characters")
        if any(s not in SLOTS for s in self.slots) or len(set(self.slots)) != len(self.slots):
            raise ManifestError(f"llm template: slots are distinct, each one of {SLOTS}")
        if "query" not in self.slots or "document" not in self.slots:
            raise ManifestError("llm template: it must hold the query and the document")
        if self.slots.index("query") > self.slots.index("document"):
            raise ManifestError("llm template: the query comes before the document")

    def render(self, values: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
        """The text, and each slot's [start, end) characters in it."""
        out, spans, at = [self.pieces[0]], {}, len(self.pieces[0])
        for slot, piece in zip(self.slots, self.pieces[1:], strict=True):
            value = values[slot]
            spans[slot] = (at, at + len(value))
            out += [value, piece]
            at += len(value) + len(piece)
        return "".join(out), spans

    @classmethod
    def from_dict(cls, data: object) -> PromptTemplate:
        if not isinstance(data, dict):
            raise ManifestError("llm template must be an object")
        if not set(data) <= {"pieces", "slots"}:
            raise ManifestError("llm template: only pieces and slots")
        pieces, slots = data.get("pieces"), data.get("slots")
        if not isinstance(pieces, list) or not isinstance(slots, list):
            raise ManifestError("llm template: pieces and slots are lists")
        return cls(tuple(pieces), tuple(slots))


@dataclass(frozen=True)
class LlmReranker:
    """A causal LM read as a reranker (sentence-transformers' CrossEncoder over a
    ``*ForCausalLM`` with ``LogitScore``): the text is ``template`` filled with the
    instruction, query and document (``bare``, without an instruction: the template's
    own default); the scores graph gives logit(answers[0]) - logit(answers[1]) at the
    last token (logit(answers[0]) with one answer). ``default_instruction``: the
    folder's default prompt, used when a request names none."""

    template: PromptTemplate
    bare: PromptTemplate
    answers: tuple[str, ...]
    answer_ids: tuple[int, ...]
    default_instruction: str | None = None

    def __post_init__(self) -> None:
        if "instruction" not in self.template.slots:
            raise ManifestError("llm template: it must hold the instruction")
        if "instruction" in self.bare.slots:
            raise ManifestError("llm bare template: it holds no instruction")
        if not 0 < len(self.answers) == len(self.answer_ids) <= MAX_ANSWERS:
            raise ManifestError(f"llm answers: 1..{MAX_ANSWERS} tokens, each with its id")
        if not all(isinstance(i, int) and i >= 0 for i in self.answer_ids):
            raise ManifestError("llm answer_ids: token ids")
        if self.default_instruction is not None and not isinstance(self.default_instruction, str):
            raise ManifestError("llm default_instruction: text")

    def prompt(self, instruction: str | None) -> tuple[PromptTemplate, dict[str, str]]:
        """The template for ``instruction`` (None: the default one; empty: none, as
        sentence-transformers' empty prompt) and the slot values it fixes."""
        chosen = self.default_instruction if instruction is None else instruction
        if not chosen:
            return self.bare, {}
        return self.template, {"instruction": chosen}

    @classmethod
    def from_dict(cls, data: object) -> LlmReranker:
        if not isinstance(data, dict):
            raise ManifestError("head.llm must be an object")
        known = {"template", "bare", "answers", "answer_ids", "default_instruction"}
        if not set(data) <= known:
            raise ManifestError(f"head.llm: unknown keys {sorted(set(data) - known)}")
        try:
            return cls(
                PromptTemplate.from_dict(data.get("template")),
                PromptTemplate.from_dict(data.get("bare")),
                tuple(data.get("answers") or ()),
                tuple(data.get("answer_ids") or ()),
                data.get("default_instruction"),
            )
        except TypeError as exc:
            raise ManifestError(f"head.llm: {exc}") from None


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
    # A causal LM's yes/no head (a one-label classify head): how its text is built.
    llm: LlmReranker | None = None

    def __post_init__(self) -> None:
        if self.llm is not None and not (self.task == "classify" and len(self.labels) == 1):
            raise ManifestError("head.llm: an LLM reranker's head has one label")
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
        llm = LlmReranker.from_dict(data["llm"]) if data.get("llm") is not None else None
        try:
            return cls(**{**data, "labels": tuple(labels), "llm": llm})
        except TypeError as exc:  # unknown or missing keys
            raise ManifestError(f"head: {exc}") from None


SIMILARITIES: Final = ("maxsim", "meanmaxsim")
EXPANSION_STRATEGIES: Final = ("fixed", "min")
SIDES: Final = ("query", "document")
MAX_SKIPLIST: Final = 4096
MAX_MULTI_VECTOR_DIM: Final = 1 << 16


@dataclass(frozen=True)
class QueryExpansion:
    """ColBERT's query augmentation (sentence-transformers' ``query_expansion``): a query
    of fewer than ``length`` tokens is filled with ``token_id`` up to ``length`` (and,
    ``fixed``, a longer one cut to it); ``attend``: whether the encoder attends to the
    fill (else it is masked out of attention and only MaxSim scores it)."""

    strategy: str
    length: int
    token_id: int
    attend: bool

    def __post_init__(self) -> None:
        if self.strategy not in EXPANSION_STRATEGIES:
            raise ManifestError(f"query_expansion.strategy must be one of {EXPANSION_STRATEGIES}")
        check_size("query_expansion.length", self.length, 1 << 16, ManifestError)
        check_size("query_expansion.token_id", self.token_id + 1, 1 << 24, ManifestError)
        if not isinstance(self.attend, bool):
            raise ManifestError("query_expansion.attend must be a boolean")


@dataclass(frozen=True)
class LateInteraction:
    """Multi-vector (ColBERT) outputs: ``graph`` (graph_io.GRAPH_MULTI_VECTOR) gives
    ``outputs`` (graph_io.MULTI_VECTOR_OUTPUTS, in order) from token ids.

    Each token's vector is ``dim`` wide, normalised per token in the graph when
    ``normalize``. The query and document sides are the model's prompts named
    ``query`` and ``document`` (their marker tokens are special tokens of the
    tokenizer), cut to ``query_length``/``document_length`` tokens (None: the model's
    own), the query expanded by ``expansion``. ``skiplist_ids``: tokens whose vectors
    the sides in ``skiplist_sides`` leave out (ColBERT: punctuation of documents).
    ``skip_first``: the first token ([CLS]) has no vector (bge-m3). With
    ``graph_io.OUTPUT_TOKEN_WEIGHTS`` (bge-m3's sparse head), a sparse vector is each
    token id's largest weight, ``unused_ids`` (special tokens) left out. With
    ``graph_io.OUTPUT_ATTENTION_RECEIVED`` a document's vectors can be pruned to those of
    the tokens receiving the most attention. Scores are
    ``similarity``: MaxSim, or MaxSim over the query's vector count."""

    graph: str
    sha256: str
    outputs: tuple[str, ...]
    dim: int
    normalize: bool = True
    similarity: str = "maxsim"
    query_length: int | None = None
    document_length: int | None = None
    expansion: QueryExpansion | None = None
    skiplist_ids: tuple[int, ...] = ()
    skiplist_sides: tuple[str, ...] = ("document",)
    skip_first: bool = False
    unused_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_file_name(self.graph, "late_interaction.graph")
        if self.graph != graph_io.GRAPH_MULTI_VECTOR:
            raise ManifestError(f"late_interaction.graph must be {graph_io.GRAPH_MULTI_VECTOR}")
        known = graph_io.MULTI_VECTOR_OUTPUTS
        if self.outputs[:2] != known[:2] or list(self.outputs) != [
            o for o in known if o in self.outputs
        ]:
            raise ManifestError(
                f"late_interaction.outputs must begin {list(known[:2])}, then some of "
                f"{list(known[2:])} in that order"
            )
        check_size("late_interaction.dim", self.dim, MAX_MULTI_VECTOR_DIM, ManifestError)
        if self.similarity not in SIMILARITIES:
            raise ManifestError(f"late_interaction.similarity must be one of {SIMILARITIES}")
        for name in ("query_length", "document_length"):
            if getattr(self, name) is not None:
                check_size(f"late_interaction.{name}", getattr(self, name), 1 << 20, ManifestError)
        for name in ("skiplist_ids", "unused_ids"):
            ids = getattr(self, name)
            if len(ids) > MAX_SKIPLIST or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 24 for i in ids
            ):
                raise ManifestError(f"late_interaction.{name}: at most {MAX_SKIPLIST} token ids")
        if not set(self.skiplist_sides) <= set(SIDES):
            raise ManifestError(f"late_interaction.skiplist_sides: each one of {SIDES}")
        for name in ("normalize", "skip_first"):
            if not isinstance(getattr(self, name), bool):
                raise ManifestError(f"late_interaction.{name} must be a boolean")

    @property
    def sparse(self) -> bool:
        """bge-m3's lexical weights: a sparse vector from the same run."""
        return graph_io.OUTPUT_TOKEN_WEIGHTS in self.outputs

    @property
    def attention_received(self) -> bool:
        """Each token's attention received (graph_io.OUTPUT_ATTENTION_RECEIVED), what a
        document's vectors are pruned by; models exported before it lack it."""
        return graph_io.OUTPUT_ATTENTION_RECEIVED in self.outputs

    @classmethod
    def from_dict(cls, data: object) -> LateInteraction:
        if not isinstance(data, dict):
            raise ManifestError("late_interaction must be an object")
        lists = ("outputs", "skiplist_ids", "skiplist_sides", "unused_ids")
        if not all(isinstance(data.get(k, []), list | tuple) for k in lists):
            raise ManifestError(f"late_interaction: {', '.join(lists)} are lists")
        expansion = data.get("expansion")
        if expansion is not None and not isinstance(expansion, dict):
            raise ManifestError("late_interaction.expansion must be an object")
        try:
            return cls(
                **{
                    **data,
                    **{k: tuple(data[k]) for k in lists if k in data},
                    "expansion": QueryExpansion(**expansion) if expansion else None,
                }
            )
        except TypeError as exc:  # unknown or missing keys
            raise ManifestError(f"late_interaction: {exc}") from None
