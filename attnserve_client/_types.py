"""Typed results of the SDK: numpy arrays, never nested float lists."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

import numpy as np

ArrayField = Literal["embeddings", "attention", "hidden_states", "pooled"]
Item = TypeVar("Item")


class Listing(Generic[Item]):
    """A result read as the list of its items (``_items`` names the field): iterate it,
    take its ``len``, index or slice it."""

    _items: str

    def _listed(self) -> list[Item]:
        items: list[Item] = getattr(self, self._items)
        return items

    def __iter__(self) -> Iterator[Item]:
        return iter(self._listed())

    def __len__(self) -> int:
        return len(self._listed())

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> list[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | list[Item]:
        return self._listed()[index]


def decode_array(value: Any) -> np.ndarray:
    """A response array (base64 object or nested floats) -> float32 numpy (int8/uint8
    for quantized vectors, int32 for attention's keys, float16 maps as asked)."""
    if value is None:
        raise ValueError("an array is missing (null) where its siblings have one")
    if isinstance(value, dict):
        raw = base64.b64decode(value["data"])
        kept = {"int8": "i1", "uint8": "u1", "int32": "<i4", "float16": "<f2"}
        if value.get("dtype") in kept:  # quantized vectors, attention's keys and float16
            dtype = kept[value["dtype"]]
            return np.frombuffer(raw, dtype=dtype).reshape(value["shape"]).copy()
        return np.frombuffer(raw, dtype="<f4").reshape(value["shape"]).astype(np.float32)
    return np.asarray(value, dtype=np.float32)


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """float32 numpy -> the server's base64 array object."""
    array = np.ascontiguousarray(array, dtype="<f4")
    return {
        "shape": list(array.shape),
        "dtype": "float32",
        "data": base64.b64encode(array.tobytes()).decode("ascii"),
    }


@dataclass(frozen=True)
class Usage:
    sequences: int
    tokens: int

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Usage:
        # Named fields only: a server that adds one must not break older clients.
        return cls(sequences=int(body["sequences"]), tokens=int(body["tokens"]))


@dataclass(frozen=True)
class EncodeResult:
    """The answer to ``encode``: per-sequence arrays, trimmed to each sequence's length.

    ``embeddings[i]`` is [seq_len_i, d_model]; ``attention[i]`` is
    [layers, heads, seq_len_i, seq_len_i] (heads 1 after mean/max, both 1 after
    rollout); ``hidden_states[i]`` is [selected layers, seq_len_i, d_model] (index 0
    the input embeddings, then each layer's output); ``pooled[i]`` is [d_model].
    Fields not asked for are ``None``.
    ``tokens[i]`` holds the tokens of text inputs. Use :meth:`stack` for one
    [batch, ...] array when all sequences have the same length.
    """

    model: str
    embeddings: list[np.ndarray] | None
    attention: list[np.ndarray] | None
    pooled: list[np.ndarray] | None
    tokens: list[list[str] | None]
    usage: Usage
    hidden_states: list[np.ndarray] | None = None
    # Late chunking: per input, [n_spans, d_model] for a text sent with spans, else None.
    span_embeddings: list[np.ndarray | None] | None = None
    # With attention top_k/threshold: each kept value's key, int32 [L', H', n, k].
    attention_indices: list[np.ndarray] | None = None
    # With attention summaries: per sequence, name -> [L', H'] (or [L', H', n]).
    attention_summaries: list[dict[str, np.ndarray]] | None = None

    def __len__(self) -> int:
        return self.usage.sequences

    def stack(self, what: ArrayField = "embeddings") -> np.ndarray:
        """[batch, ...] array of one field; ValueError if absent or lengths differ."""
        arrays = getattr(self, what)
        if arrays is None:
            raise ValueError(f"the result holds no {what}: ask for them in encode()")
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            raise ValueError(f"cannot stack {what}: sequences differ in length ({sorted(shapes)})")
        return np.stack(arrays)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> EncodeResult:
        items = sorted(body["data"], key=lambda item: item["index"])

        def column(name: str) -> list[np.ndarray] | None:
            values = [item.get(name) for item in items]
            if all(v is None for v in values):
                return None
            return [decode_array(v) for v in values]

        return cls(
            model=body["model"],
            embeddings=column("embeddings"),
            attention=column("attention"),
            hidden_states=column("hidden_states"),
            pooled=column("pooled"),
            tokens=[item.get("tokens") for item in items],
            usage=Usage.from_json(body["usage"]),
            span_embeddings=spans_column(items),
            attention_indices=indices_column(items),
            attention_summaries=summaries_column(items),
        )

    @classmethod
    def concat(cls, parts: list[EncodeResult]) -> EncodeResult:
        """Join results of consecutive chunks, in order (for ``encode_many``)."""
        if not parts:
            raise ValueError("nothing to concatenate")

        def join(name: str) -> list[np.ndarray] | None:
            columns = [getattr(p, name) for p in parts]
            return None if columns[0] is None else [a for col in columns for a in col]

        return cls(
            model=parts[0].model,
            embeddings=join("embeddings"),
            attention=join("attention"),
            hidden_states=join("hidden_states"),
            pooled=join("pooled"),
            span_embeddings=None
            if all(p.span_embeddings is None for p in parts)
            else [s for p in parts for s in (p.span_embeddings or [None] * len(p.tokens))],
            tokens=[t for p in parts for t in p.tokens],
            usage=Usage(sum(p.usage.sequences for p in parts), sum(p.usage.tokens for p in parts)),
            attention_indices=join("attention_indices"),
            attention_summaries=None
            if parts[0].attention_summaries is None
            else [s for p in parts for s in p.attention_summaries or []],
        )


def indices_column(items: list[dict[str, Any]]) -> list[np.ndarray] | None:
    values = [item.get("attention_indices") for item in items]
    if all(v is None for v in values):
        return None
    return [np.asarray(decode_array(v), dtype=np.int32) for v in values]


def summaries_column(items: list[dict[str, Any]]) -> list[dict[str, np.ndarray]] | None:
    values = [item.get("attention_summaries") for item in items]
    if all(v is None for v in values):
        return None
    return [{name: decode_array(a) for name, a in (v or {}).items()} for v in values]


def spans_column(items: list[dict[str, Any]]) -> list[np.ndarray | None] | None:
    """Each item's span vectors (None where it had no spans); None when no item had any."""
    values = [item.get("span_embeddings") for item in items]
    if all(v is None for v in values):
        return None
    return [None if v is None else decode_array(v) for v in values]


@dataclass(frozen=True)
class TokenizeResult:
    model: str
    tokens: list[list[str]]
    ids: list[list[int]]
    embeddings: list[np.ndarray] | None
    usage: Usage

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TokenizeResult:
        items = sorted(body["data"], key=lambda item: item["index"])
        embeddings = [item.get("embeddings") for item in items]
        return cls(
            model=body["model"],
            tokens=[item["tokens"] for item in items],
            ids=[item["ids"] for item in items],
            embeddings=None
            if all(e is None for e in embeddings)
            else [decode_array(e) for e in embeddings],
            usage=Usage.from_json(body["usage"]),
        )


@dataclass(frozen=True)
class ModelCard:
    """A served model, as ``GET /v1/models/{name}`` describes it."""

    name: str
    d_model: int
    heads: int
    layers: int
    max_seq_len: int
    tokenizer: bool
    default: bool
    raw: dict[str, Any] = field(repr=False, compare=False)
    task: str = "embed"  # embed, rerank, classify or splade: what its head answers
    # The width of its pooled vectors: d_model, or a sentence-transformers Dense layer's
    # (None from a server older than the field).
    dimensions: int | None = None
    # What set max_seq_len: "the model", or the server setting that capped it (None from
    # a server older than the field).
    max_seq_len_by: str | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ModelCard:
        return cls(
            name=body["name"],
            d_model=body["d_model"],
            heads=body["heads"],
            layers=body["layers"],
            max_seq_len=body["max_seq_len"],
            tokenizer=body.get("tokenizer", False),
            default=body.get("default", False),
            raw=body,
            task=body.get("task", "embed"),
            dimensions=body.get("dimensions"),
            max_seq_len_by=body.get("max_seq_len_by"),
        )

    @classmethod
    def list_from_json(cls, body: dict[str, Any]) -> list[ModelCard]:
        """``GET /v1/models``."""
        return [cls.from_json(m) for m in body["data"]]


@dataclass(frozen=True)
class SparseVector:
    """One text's sparse vector: ``values[k]`` at ``indices[k]``; ``text[k]`` is what is
    behind it when asked for (``return_text``): BM42's stem, SPLADE's token."""

    indices: list[int]
    values: list[float]
    text: list[str] | None = None


@dataclass(frozen=True)
class SparseResult(Listing[SparseVector]):
    """The answer to ``embed_sparse``: one vector per text, in order (iterating the
    result iterates ``vectors``)."""

    _items = "vectors"

    model: str
    vectors: list[SparseVector]
    usage: Usage

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SparseResult:
        items = sorted(body["data"], key=lambda item: item["index"])
        return cls(
            model=body["model"],
            vectors=[
                SparseVector(
                    [int(i) for i in item["indices"]],
                    [float(v) for v in item["values"]],
                    item.get("text"),
                )
                for item in items
            ],
            usage=Usage.from_json(body["usage"]),
        )


@dataclass(frozen=True)
class RankExplanation:
    """Why a document ranked: ``attention`` [L', H' or 1, q, d] from the query's tokens
    to the document's; ``top_tokens`` (index, token, weight) of the document tokens the
    query attends to most."""

    query_tokens: list[str]
    document_tokens: list[str]
    attention: np.ndarray
    top_tokens: list[tuple[int, str, float]]


@dataclass(frozen=True)
class MaxSimExplanation:
    """Why a document scored so on a multi-vector model: per query token with a vector,
    the document token it matched best (``best``: an index into ``document_tokens``)
    and that match's term of the score (``terms``: they sum to the score)."""

    query_tokens: list[str]
    document_tokens: list[str]
    best: list[int]
    terms: list[float]


@dataclass(frozen=True)
class Ranked:
    """One document: its position in the request, its score, and what was asked with it."""

    index: int
    relevance_score: float
    document: str | None = None
    explanation: RankExplanation | MaxSimExplanation | None = None


@dataclass(frozen=True)
class MultiVectorItem:
    """One text's answer: ``vectors`` [tokens, dim] (one per kept token), and its
    ``dense`` vector and ``sparse`` vector (token id -> weight) where asked."""

    vectors: np.ndarray | None
    dense: np.ndarray | None = None
    sparse: SparseVector | None = None


@dataclass(frozen=True)
class MultiVectorResult(Listing[MultiVectorItem]):
    """The answer to ``multi_vector``: one item per text, in order."""

    _items = "items"

    model: str
    items: list[MultiVectorItem]
    total_tokens: int

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> MultiVectorResult:
        def item(x: dict[str, Any]) -> MultiVectorItem:
            vectors = x.get("embeddings")
            dense = x.get("dense")
            sparse = x.get("sparse")
            return MultiVectorItem(
                None if vectors is None else decode_array(vectors),
                None if dense is None else decode_array(dense),
                None
                if sparse is None
                else SparseVector(sparse["indices"], sparse["values"], sparse.get("text")),
            )

        items = sorted(body["data"], key=lambda x: x["index"])
        return cls(body["model"], [item(x) for x in items], int(body["usage"]["total_tokens"]))


@dataclass(frozen=True)
class RerankResult(Listing[Ranked]):
    """The answer to ``rerank``: documents best first (at most ``top_n``; iterating the
    result iterates ``results``)."""

    _items = "results"

    model: str
    results: list[Ranked]
    total_tokens: int

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> RerankResult:
        def explained(x: dict[str, Any] | None) -> RankExplanation | MaxSimExplanation | None:
            if x is None:
                return None
            if "matches" in x:  # a multi-vector model's MaxSim, split
                matches = x["matches"]
                best = [int(m["document_index"]) for m in matches]
                terms = [float(m["score"]) for m in matches]
                return MaxSimExplanation(x["query_tokens"], x["document_tokens"], best, terms)
            top = [(int(t["index"]), str(t["token"]), float(t["weight"])) for t in x["top_tokens"]]
            attention = np.asarray(x["attention"], dtype=np.float32)
            return RankExplanation(x["query_tokens"], x["document_tokens"], attention, top)

        return cls(
            model=body["model"],
            results=[
                Ranked(
                    int(r["index"]),
                    float(r["relevance_score"]),
                    (r.get("document") or {}).get("text"),
                    explained(r.get("explanation")),
                )
                for r in body["results"]
            ],
            total_tokens=int(body["usage"]["total_tokens"]),
        )


@dataclass(frozen=True)
class Classified:
    """One input's scores per label, best first (at most ``top_k``)."""

    labels: list[str]
    scores: list[float]

    @property
    def prediction(self) -> str:
        """The best label."""
        return self.labels[0]

    @property
    def score(self) -> float:
        """The best label's score."""
        return self.scores[0]


@dataclass(frozen=True)
class ClassifyResult(Listing[Classified]):
    """The answer to ``classify``: one :class:`Classified` per input, in order
    (iterating the result iterates ``data``)."""

    _items = "data"
    model: str
    data: list[Classified]
    usage: Usage

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ClassifyResult:
        items = sorted(body["data"], key=lambda item: item["index"])
        data = [
            Classified(
                [str(p["label"]) for p in x["predictions"]],
                [float(p["score"]) for p in x["predictions"]],
            )
            for x in items
        ]
        return cls(body["model"], data, Usage.from_json(body["usage"]))


@dataclass(frozen=True)
class TokenPair:
    """One term of a similarity: a query token, a document token and what they add."""

    query_index: int
    document_index: int
    query_token: str
    document_token: str
    contribution: float


@dataclass(frozen=True)
class SimilarityExplanation:
    """Why one document matches the query (``explain_similarity``).

    ``contributions`` [n_q, n_d] float32: ``a_i·b_j / (n_q n_d ‖ā‖ ‖b̄‖)``, summing to
    ``score`` (the served cosine); ``query_totals`` [n_q] and ``document_totals`` [n_d]
    its row and column sums (float64); ``top_pairs`` its largest terms, largest first."""

    index: int
    score: float
    query_tokens: list[str]
    document_tokens: list[str]
    contributions: np.ndarray
    top_pairs: list[TokenPair]
    query_totals: np.ndarray
    document_totals: np.ndarray


@dataclass(frozen=True)
class SimilarityResult(Listing[SimilarityExplanation]):
    """The answer to ``explain_similarity``: one explanation per document, in order
    (iterating the result iterates ``data``)."""

    _items = "data"

    model: str
    data: list[SimilarityExplanation]
    usage: Usage

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SimilarityResult:
        def explained(x: dict[str, Any]) -> SimilarityExplanation:
            pairs = [
                TokenPair(
                    int(p["query_index"]),
                    int(p["document_index"]),
                    str(p["query_token"]),
                    str(p["document_token"]),
                    float(p["contribution"]),
                )
                for p in x["top_pairs"]
            ]
            return SimilarityExplanation(
                index=int(x["index"]),
                score=float(x["score"]),
                query_tokens=list(x["query_tokens"]),
                document_tokens=list(x["document_tokens"]),
                contributions=decode_array(x["contributions"]),
                top_pairs=pairs,
                query_totals=np.asarray(x["query_totals"], dtype=np.float64),
                document_totals=np.asarray(x["document_totals"], dtype=np.float64),
            )

        items = sorted(body["data"], key=lambda item: item["index"])
        return cls(body["model"], [explained(x) for x in items], Usage.from_json(body["usage"]))
