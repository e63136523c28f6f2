"""The engine's request and result types: numpy and plain values, no JSON, no HTTP.

A protocol's codec turns its wire format into an :class:`EncodeRequest` (or
:class:`TokenizeRequest`) and the engine's results back into bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from service.model_info import ModelInfo

Pooling = Literal["none", "mean", "cls", "max", "last"]
Reduce = Literal["none", "mean", "max", "rollout"]
# "model": the model's own sentence-embedding pooling (its manifest), else mean.
PoolingChoice = Literal["none", "mean", "cls", "max", "last", "model"]


@dataclass(frozen=True)
class ArrayInput:
    """Token embeddings whose decoding waits until the request's limits have passed.

    ``rows`` is the sequence length the wire format declares (None if it cannot
    tell without decoding); ``decode`` yields a float32 array of any shape, which
    the engine checks against the model.
    """

    rows: int | None
    decode: Callable[[], np.ndarray]


@dataclass(frozen=True)
class TokenIds:
    """Token ids in the model's own vocabulary, used as given (special tokens included);
    their token types too where a pair was tokenized (a query-document pair's attention),
    else type 0 throughout as the tokenizer gives a single text."""

    ids: list[int]
    type_ids: list[int] | None = None


@dataclass(frozen=True)
class SpannedText:
    """A text with character spans [start, end) whose chunk vectors the answer carries
    (late chunking: the text runs once, its token embeddings are pooled per span).
    The protocol checks each span's bounds against the text; the engine finds its tokens."""

    text: str
    spans: tuple[tuple[int, int], ...]


InputItem = ArrayInput | str | TokenIds | SpannedText


@dataclass(frozen=True)
class AnswerShape:
    """What an answer will hold, counted before anything runs."""

    arrays: list[tuple[int, ...]]  # the shape of every array in it
    sequences: int
    token_strings: int = 0  # tokens listed by name (text items)
    token_chars: int = 0  # their characters
    attention_floats: int = 0
    hidden_state_floats: int = 0
    half_floats: int = 0  # of ``floats``, those answered as float16 (attention maps asked so)

    @property
    def floats(self) -> int:
        return sum(math.prod(shape) for shape in self.arrays)

    @property
    def rows(self) -> int:
        """Innermost rows of the arrays (what nested JSON brackets)."""
        return sum(math.prod(shape[:-1]) for shape in self.arrays)


@dataclass(frozen=True)
class WireCost:
    """An upper bound of the bytes an answer costs on one protocol's wire.

    Each protocol declares its own, so the engine can refuse an answer beyond
    ``max_response_bytes`` before computing it without knowing any wire format.
    """

    per_float: float
    per_half: float | None = None  # a float16's, where the wire writes 2 bytes (else per_float)
    per_row: float = 0.0  # nested JSON: brackets and separators (at most 3 per nesting level)
    per_array: float = 0.0  # an array's wrapper: outer brackets, a base64 object, padding
    per_sequence: float = 0.0  # one item's envelope: keys, index, nulls
    per_token: float = 0.0  # a listed token's quotes and separator
    per_char: float = 6.0  # a character of a token or model name (JSON escapes: \uXXXX)
    fixed: float = 0.0  # the answer's envelope, once
    # Copies of the encoded answer alive at once while the protocol frames it (e.g.
    # /v2 binary: the re-padded arrays, their bytes, and the joined body).
    copies: float = 1.0

    def bytes(self, shape: AnswerShape, model_name: str) -> float:
        return (
            self.per_float * (shape.floats - shape.half_floats)
            + (self.per_float if self.per_half is None else self.per_half) * shape.half_floats
            + self.per_row * shape.rows
            + self.per_array * len(shape.arrays)
            + self.per_sequence * shape.sequences
            + self.per_token * shape.token_strings
            + self.per_char * (shape.token_chars + len(model_name))
            + self.fixed
        )


@dataclass(frozen=True)
class AttentionSpec:
    """Which attention maps to return and how to reduce them (None: all layers/heads)."""

    layers: list[int] | None = None
    heads: list[int] | None = None
    reduce: Reduce = "none"
    measure: str = "weights"  # "weights" (α_ij) or "norms" (α_ij · ‖f_h(x_j)‖)
    # Compact answers (attention_answer.py): per query row the k largest values, or those
    # above a threshold, with their key indices; the maps' dtype; no maps at all.
    top_k: int | None = None
    threshold: float | None = None
    dtype: str = "float32"  # or "float16"
    maps: bool = True
    # Row statistics (graph_io.SUMMARIES names) of the selected heads' weights, per
    # sequence [L', H'] (their mean over query rows) or per token [L', H', n].
    summaries: tuple[str, ...] = ()
    summaries_per_token: bool = False

    @property
    def sparse(self) -> bool:
        """Are rows answered as (indices, values) of their kept keys?"""
        return self.top_k is not None or self.threshold is not None


@dataclass(frozen=True)
class EncodeRequest:
    """One encode request in domain terms.

    ``wire_cost`` is what the protocol's answer costs, so the engine can refuse
    an answer too large before computing it.
    """

    inputs: Sequence[InputItem]  # read once its length has passed the limits
    wire_cost: WireCost
    model: str | None = None
    model_version: str | None = None  # a version the caller named: must be the serving one
    # The version a protocol resolved before parsing (its URL named the model): the request
    # runs there, never resolved a second time (a swap in between changes nothing).
    resolved: ModelInfo | None = field(default=None, repr=False, compare=False)
    return_attention: bool = False
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    return_hidden_states: bool = False
    hidden_layers: list[int] | None = None  # of the L + 1 hidden states; None: all
    pooling: PoolingChoice = "none"
    normalize: bool = False
    dimensions: int | None = None  # Matryoshka truncation of the pooled vector
    return_embeddings: bool = True
    truncate: bool = False
    truncation_direction: str = "right"  # "left": truncation keeps the last tokens
    # Text prepended to every text input: one of the model's named prompts, or the caller's
    # own (sentence-transformers' prompt_name and prompt); neither: the model's default.
    prompt_name: str | None = None
    prompt: str | None = None
    # Pooled vectors as float, or quantized (int8, uint8, binary, ubinary: quantize.py)
    # with the caller's (mins, maxes) per dimension, else the model's recorded ones.
    embedding_type: str = "float"
    quantization_ranges: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    # The answer is re-padded to max(pad_to, longest sequence) tokens (rectangular
    # protocols); None: one array per sequence at its own length. Counted in its size.
    pad_to: int | None = None
    # A model with task adapters (Jina v3): the task whose adapter runs; None: the
    # model's default task (manifest.default_task), else none (the base model).
    task: str | None = None

    @property
    def pooled_only(self) -> bool:
        """Only a pooled vector per sequence is answered: a small answer at any count."""
        return self.pooling != "none" and not (
            self.return_embeddings or self.return_attention or self.return_hidden_states
        )


@dataclass(frozen=True)
class SequenceOutput:
    """One sequence's answer; fields not asked for are None."""

    tokens: list[str] | None  # tokens of a text item
    length: int
    embeddings: np.ndarray | None  # [n, d_model]
    attention: np.ndarray | None  # [L', H' or 1, n, n] or [1, 1, n, n]; [.., n, k] kept
    hidden_states: np.ndarray | None  # [selected of the L + 1, n, d_model]
    pooled: np.ndarray | None  # [d_model] or [dimensions]
    span_embeddings: np.ndarray | None = None  # [n_spans, d_model or dimensions]
    attention_indices: np.ndarray | None = None  # int32 [.., n, k]: keys of the kept values
    # Summary name -> [L', H'] or [L', H', n] (AttentionSpec.summaries, in that order).
    attention_summaries: dict[str, np.ndarray] | None = None


@dataclass(frozen=True)
class EncodeResult:
    model: str
    outputs: list[SequenceOutput]
    response_bytes: float  # the engine's estimate of the answer's size
    version: str = "1"  # of the model that produced it

    @property
    def tokens(self) -> int:
        return sum(o.length for o in self.outputs)


@dataclass(frozen=True)
class TokenizeRequest:
    texts: list[str]
    wire_cost: WireCost
    model: str | None = None
    return_embeddings: bool = False
    truncate: bool = False
    truncation_direction: str = "right"  # "left": truncation keeps the last tokens
    special_tokens: bool = True  # the model's [CLS], [SEP]... around each text
    spans: bool = False  # each token's [start, stop) characters in its text


@dataclass(frozen=True)
class TokenizedText:
    tokens: list[str]
    ids: list[int]
    embeddings: np.ndarray | None  # [n, d_model], the encoder's input
    spans: list[tuple[int, int] | None] | None = None  # None per special token


@dataclass(frozen=True)
class TokenizeResult:
    model: str
    items: list[TokenizedText]

    @property
    def tokens(self) -> int:
        return sum(len(t.tokens) for t in self.items)


@dataclass(frozen=True)
class DecodeRequest:
    """Token ids back to text."""

    ids: list[list[int]]
    model: str | None = None
    skip: bool = True  # leave the model's special tokens out of the text


@dataclass(frozen=True)
class DecodeResult:
    model: str
    texts: list[str]


@dataclass(frozen=True)
class SparseRequest:
    """Sparse vectors of texts: BM42's ``document`` runs the model, ``query`` does not;
    ``splade`` runs a SPLADE model's head. None: splade for a SPLADE model, else document.
    ``top_k`` keeps each vector's largest values, ``threshold`` drops those below it;
    ``return_text`` answers what is behind each index too. ``wire_cost`` prices one
    nonzero as a float (its index and value), what is behind it as a token."""

    texts: list[str]
    wire_cost: WireCost
    model: str | None = None
    kind: str | None = None  # "document" | "query" | "splade"
    top_k: int | None = None
    threshold: float | None = None
    alpha: float = 0.5  # the exponent of log(1 + weight), as fastembed's default
    truncate: bool = False
    truncation_direction: str = "right"  # "left": truncation keeps the last tokens
    return_text: bool = False


@dataclass(frozen=True)
class SparseVector:
    """One text's sparse vector: ``indices[k]`` holds ``values[k]``; ``stems[k]`` is what
    is behind it (kept for ``return_text``): BM42's stem, SPLADE's vocabulary token."""

    indices: list[int]
    values: list[float]
    stems: list[str]


@dataclass(frozen=True)
class SparseResult:
    model: str
    vectors: list[SparseVector]
    tokens: int  # over every text, special tokens included
    response_bytes: float = 0.0  # the answer's size, at most (priced before the run)


@dataclass(frozen=True)
class ServingLimits:
    """The limits a client may be told about (TEI's ``GET /info``), as numbers."""

    max_queued_requests: int  # requests in progress at once (429 beyond)
    max_batch_tokens: int  # padded tokens per onnxruntime run
    max_pooled_sequences: int  # inputs per request of pooled vectors (413 beyond)
    max_concurrent_codecs: int  # requests decoded or tokenized at once
