"""The native wire contract (``/v1/encode``, ``/v1/tokenize``, ``/v1/models``), as pydantic models.

Small fields are validated by these models. The arrays in ``inputs`` are not:
a pydantic ``list[list[float]]`` costs ~10x the inference itself, so the codecs
turn them straight into numpy. The request models still describe every field
for the OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.engine.types import Pooling, Reduce
from service.protocols.quantized import QuantizedOptions

EncodingFormat = Literal["float", "base64"]
MultiVectorOutput = Literal["multi_vector", "dense", "sparse"]


class Usage(BaseModel):
    sequences: int
    tokens: int


class Base64Array(BaseModel):
    """An array as base64 of its little-endian bytes, row-major: float32 (inputs and most
    answers); attention maps asked as float16, their key indices int32."""

    model_config = ConfigDict(extra="forbid")
    shape: list[int] = Field(description="Array shape, e.g. [seq_len, d_model].")
    data: str = Field(description="Standard base64 of the little-endian values, row-major.")
    dtype: Literal["float32", "float16", "int32"] = "float32"


SummaryName = Literal["entropy", "first", "self", "previous", "next", "distance"]


class AttentionOptions(BaseModel):
    """Which attention maps to return and how to reduce them."""

    model_config = ConfigDict(extra="forbid")
    layers: list[int] | None = Field(
        None, description="Layer indices (negative counts from the end); default all."
    )
    heads: list[int] | None = Field(
        None, description="Head indices (negative counts from the end); default all."
    )
    reduce: Reduce = Field(
        "none",
        description="none: [L', H', n, n]; mean/max over the selected heads: [L', 1, n, n]; "
        "rollout (Abnar & Zuidema 2020) of head-averaged, identity-mixed maps multiplied "
        "through the selected layers: [1, 1, n, n].",
    )
    measure: Literal["weights", "norms"] = Field(
        "weights",
        description="weights: α_ij; norms: α_ij · ‖f_h(x_j)‖ (Kobayashi et al. 2020), how "
        "much token j moves token i through head h, not only how much i attends to j "
        "(rollout normalises each averaged map's rows first). Same shapes either way.",
    )
    top_k: int | None = Field(
        None,
        ge=1,
        description="Keep each row's k largest values (k at most the sequence's tokens): "
        "attention is then [.., n, k] (largest first, ties to the lower key) and "
        "attention_indices their keys. With reduce none and measure weights it is computed "
        "inside the model's graph, so the full maps never leave onnxruntime.",
    )
    threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Keep each row's values above this (not with top_k): [.., n, k] with k "
        "the fullest row's count, other rows padded with index -1 and value 0.",
    )
    dtype: Literal["float32", "float16"] = Field(
        "float32", description="The maps' values: float16 halves the answer (≤ 1e-3 apart)."
    )
    maps: bool = Field(True, description="false: no maps, only the summaries asked for.")
    summaries: list[SummaryName] | None = Field(
        None,
        description="Per selected layer and head, statistics of its weights' rows, each the "
        "mean over the sequence's query rows [L', H']: entropy (nats), attention to the first "
        "token, to itself, to the previous and the next token, and the mean attended "
        "distance (tokens). See docs/api.md.",
    )
    summaries_per_token: bool = Field(
        False, description="Each summary per query token [L', H', n] instead of its mean."
    )


class HiddenStatesOptions(BaseModel):
    """Which of the L + 1 hidden states to return (transformers' output_hidden_states)."""

    model_config = ConfigDict(extra="forbid")
    layers: list[int] | None = Field(
        None,
        description="Indices into [input embeddings, layer 1 output, ..., layer L output] "
        "(negative counts from the end: -1 is the last layer); default all L + 1.",
    )


class EncodeOptions(QuantizedOptions):
    """Every field of an encode request except the arrays (embedding_type: of the pooled
    vectors)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    return_attention: bool = Field(False, description="Also return attention weights.")
    attention: AttentionOptions = Field(default_factory=AttentionOptions)
    return_hidden_states: bool = Field(
        False,
        description="Also return per-layer hidden states [L'', n_i, d] (models exported "
        "with them; others answer 422 unsupported_by_model).",
    )
    hidden_states: HiddenStatesOptions = Field(default_factory=HiddenStatesOptions)
    pooling: Pooling = Field(
        "none", description="Pool the real tokens of each sequence into one vector."
    )
    normalize: bool = Field(False, description="L2-normalise the pooled vector.")
    return_embeddings: bool | None = Field(
        None,
        description="Return per-token embeddings; default true without pooling, false with it.",
    )
    encoding_format: EncodingFormat = Field(
        "float", description="float: nested JSON arrays; base64: Base64Array objects."
    )
    truncate: bool = Field(
        False,
        description="Cut text items to the model's max_seq_len instead of refusing them (413).",
    )
    truncation_direction: Literal["right", "left"] = Field(
        "right",
        description="With truncate: keep the first tokens (right) or the last (left).",
    )
    prompt_name: str | None = Field(
        None,
        max_length=64,
        description="One of the model's prompts (sentence-transformers'; a wrong name's 422 "
        "lists them), prepended to each text input; default: the model's default prompt.",
    )
    prompt: str | None = Field(
        None,
        max_length=2048,
        description="Your own text to prepend to each text input (instead of prompt_name).",
    )
    task: str | None = Field(
        None,
        max_length=64,
        description="Models with task adapters (Jina v3's LoRA: retrieval.query, "
        "retrieval.passage, text-matching, classification, separation…): the task whose "
        "adapter runs (a wrong name's 422 lists them); default: the model's default task, "
        "else none (the base model).",
    )


class SpannedText(BaseModel):
    """A text whose chunks are pooled after it ran whole (late chunking)."""

    model_config = ConfigDict(extra="forbid")
    text: str
    spans: list[list[int]] = Field(
        description="Character spans [start, end) (end exclusive), non-empty, within the "
        "text, not overlapping; each gets one pooled vector in span_embeddings, from the "
        "tokens whose first character lies inside it (special tokens excluded). Needs "
        "pooling mean or max.",
        min_length=1,
    )


class EncodeOutputsOptions(BaseModel):
    """The fields of an encode request with ``output`` (a late-interaction model's
    outputs of one run, as ``/v1/multi-vector`` answers them), texts aside: any other
    encode field is refused (422 naming it)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    output: list[MultiVectorOutput] = Field(
        min_length=1,
        description="Texts only, on a late-interaction model: what each item holds, all "
        "from one run: its token vectors (multi_vector), its dense vector (dense), its "
        "sparse vector (sparse). Absent: the encode answer above.",
    )
    input_type: Literal["query", "document"] = Field(
        "document",
        description="With output: how each text is read (as /v1/multi-vector's input_type).",
    )
    encoding_format: EncodingFormat = Field(
        "float", description="float: nested JSON arrays; base64: Base64Array objects."
    )
    truncate: bool = Field(
        False,
        description="Cut each text to the model's length for its side instead of refusing "
        "it (413).",
    )
    return_text: bool = Field(False, description="With sparse: each nonzero's token.")


class EncodeRequest(EncodeOptions):
    """``POST /v1/encode``: sequences of token embeddings (or texts), ragged lengths allowed.
    With ``output``: texts' late-interaction outputs (``EncodeOutputsOptions``)."""

    output: list[MultiVectorOutput] | None = Field(
        None,
        description="Texts only, on a late-interaction model: answer each item's "
        "multi_vector, dense and/or sparse vectors of one run instead (see "
        "EncodeOutputsOptions for the fields it takes).",
    )
    input_type: Literal["query", "document"] | None = Field(
        None, description="With output: how each text is read (default document)."
    )

    inputs: list[list[list[float]] | Base64Array | str | SpannedText] = Field(
        description="Sequences, each [seq_len_i, d_model] as nested floats or a Base64Array; "
        "or a text, for models with a tokenizer (tokenized, then embedded by the model); or "
        "a text with spans (late chunking)."
    )


class EmbedSparseRequest(BaseModel):
    """``POST /v1/embed_sparse``: sparse vectors of texts: BM42 (models with a BM42 graph)
    or SPLADE (models with a SPLADE head)."""

    model_config = ConfigDict(extra="forbid")
    inputs: list[str] = Field(description="The texts, one vector each, in order.")
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    kind: Literal["document", "query", "splade"] | None = Field(
        None,
        description="BM42's document: weighted by the last layer's [CLS] attention (a model "
        "run); BM42's query: 1.0 per stem, no model run; splade: a SPLADE model's vector "
        "over its vocabulary. Default: splade for a SPLADE model, else document.",
    )
    top_k: int | None = Field(None, description="Keep each vector's k largest values.")
    threshold: float | None = Field(None, description="Drop values below this (>= 0).")
    alpha: float = Field(
        0.5, gt=0, le=10, description="Exponent of a document's values: log(1 + weight) ** alpha."
    )
    return_text: bool = Field(
        False, description="Also return what is behind each index: BM42's stem, SPLADE's token."
    )
    truncate: bool = Field(False, description="Cut texts to the model's max_seq_len (else 413).")
    truncation_direction: Literal["right", "left"] = Field(
        "right",
        description="With truncate: keep the first tokens (right) or the last (left).",
    )


class SparseItem(BaseModel):
    index: int = Field(description="Position of the text in the request.")
    indices: list[int] = Field(
        description="BM42: abs(MurmurHash3-32(stem)), as fastembed's; SPLADE: vocabulary ids, "
        "ascending."
    )
    values: list[float] = Field(description="One value per index.")
    text: list[str] | None = Field(
        None, description="The stem (BM42) or token (SPLADE) behind each index (return_text)."
    )


class EmbedSparseResponse(BaseModel):
    model: str
    data: list[SparseItem]
    usage: Usage


class Prune(BaseModel):
    """Keep fewer of a document's vectors: those of the tokens receiving the most
    attention in the run that encoded it."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["attention"] = Field(
        "attention",
        description="attention: the tokens receiving the most attention, averaged over "
        "layers and heads, summed over query rows; [CLS], [SEP] and other special tokens "
        "never kept.",
    )
    k: int | None = Field(None, description="Keep at most this many vectors per document.")
    fraction: float | None = Field(
        None,
        description="Keep this fraction (0, 1] of each document's candidate tokens, rounded "
        "up. Give k or fraction.",
    )


class MultiVectorRequest(BaseModel):
    """``POST /v1/multi-vector`` (Jina's shape): a vector per token of each text, read as
    a query or a document, for late interaction (MaxSim); with ``output``, the model's
    dense and sparse vectors from the same run (bge-m3)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    input: list[str] | str = Field(description="The texts, or one text.")
    input_type: Literal["query", "document"] = Field(
        "document",
        description="How each text is read: a query (its marker, expanded with [MASK] to the "
        "model's query length) or a document (its marker, its skiplist tokens left out).",
    )
    output: list[MultiVectorOutput] = Field(
        default_factory=lambda: list[MultiVectorOutput](["multi_vector"]),
        description="What each item holds, all from one run: its token vectors "
        "(embeddings), its dense vector (dense) and its sparse vector (sparse).",
    )
    embedding_type: Literal["float", "base64"] = Field(
        "float", description="Arrays as nested JSON floats, or {shape, dtype, data} base64."
    )
    dtype: Literal["float32", "float16"] = Field(
        "float32", description="The token vectors' type (float16 halves a base64 answer)."
    )
    truncate: bool = Field(
        True, description="Cut each text to the model's length for its side (else 413)."
    )
    return_text: bool = Field(False, description="Each sparse nonzero's token.")
    prune: Prune | None = Field(
        None,
        description="Documents only: keep the vectors of the k (or the fraction of) tokens "
        "receiving the most attention.",
    )


class MultiVectorSparse(BaseModel):
    indices: list[int] = Field(description="Token ids of the model's vocabulary.")
    values: list[float]
    text: list[str] | None = None


class MultiVectorItem(BaseModel):
    object: str = "embeddings"
    index: int
    embeddings: list[list[float]] | dict[str, Any] | None = Field(
        None, description="[tokens, dim]: one vector per kept token."
    )
    dense: list[float] | dict[str, Any] | None = None
    sparse: MultiVectorSparse | None = None


class MultiVectorResponse(BaseModel):
    model: str
    object: str = "list"
    data: list[MultiVectorItem]
    usage: dict[str, int]


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str


class RerankRequest(BaseModel):
    """``POST /v1/rerank`` (Cohere's and Jina's shape): documents scored against a query
    by a reranker (a cross-encoder), best first."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    query: str = Field(description="What the documents are ranked for.")
    documents: list[str | RerankDocument] = Field(
        description="Texts, or objects with a text (Cohere, Jina)."
    )
    top_n: int | None = Field(None, description="Answer only the best top_n; default all.")
    return_documents: bool = Field(False, description="Each result with its document.")
    raw_scores: bool = Field(
        False, description="relevance_score as the raw logit, not the model's score function."
    )
    truncate: bool = Field(
        True, description="Cut each document so its pair fits the model (else 413)."
    )
    truncation_direction: Literal["right", "left"] = "right"
    max_tokens_per_doc: int | None = Field(
        None, ge=1, description="Cohere's option: accepted, the model's own limit applies."
    )
    return_attention: bool = Field(
        False,
        description="Why each result ranked: the attention from the query's tokens to its "
        "document's tokens ([L', H', q, d]) and the document tokens the query attends to most.",
    )
    attention: AttentionOptions = Field(default_factory=AttentionOptions)
    top_tokens: int = Field(5, description="With return_attention: document tokens listed.")
    instruction: str | None = Field(
        None,
        description="LLM rerankers (Qwen3-Reranker): the task instruction filled into the "
        "model's prompt; default the model's own, \"\" none. Refused by cross-encoders.",
    )


class RankTokenWeight(BaseModel):
    index: int = Field(description="The token's position among the document's tokens.")
    token: str
    weight: float = Field(description="Attention it receives from the query's tokens.")


class RankExplanationItem(BaseModel):
    query_tokens: list[str]
    document_tokens: list[str]
    attention: list[list[list[list[float]]]] = Field(
        description="[L', H' or 1, q, d]: the selected maps' query rows × document columns."
    )
    top_tokens: list[RankTokenWeight]


class MaxSimMatch(BaseModel):
    query_index: int = Field(description="A query token with a vector (of query_tokens).")
    document_index: int = Field(description="The document token its vector matched best.")
    score: float = Field(description="That match's term: the terms sum to relevance_score.")


class MaxSimExplanationItem(BaseModel):
    query_tokens: list[str] = Field(description="The query's tokens that have a vector.")
    document_tokens: list[str] = Field(description="The document's tokens that have one.")
    matches: list[MaxSimMatch] = Field(description="Per query token, its best match.")


class RerankResultItem(BaseModel):
    index: int = Field(description="The document's position in the request.")
    relevance_score: float
    document: RerankDocument | None = None
    explanation: RankExplanationItem | MaxSimExplanationItem | None = Field(
        None,
        description="With return_attention: a cross-encoder's attention from the query to "
        "the document, or a multi-vector model's MaxSim split into its query tokens' matches.",
    )


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResultItem]
    meta: dict[str, Any]
    usage: dict[str, int]


# A pair read together as one sequence (a text and its hypothesis, a query and a document).
TextPair = Annotated[list[str], Field(min_length=2, max_length=2)]


class ClassifyRequest(BaseModel):
    """``POST /v1/classify``: a score per label of each text or pair, by a classifier
    (a model exported with its sequence-classification head)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    inputs: list[str | TextPair] = Field(
        description="Texts, or pairs [a, b] read together (a list of two texts is two inputs)."
    )
    raw_scores: bool = Field(
        False, description="Scores as the raw logits, not the model's score function."
    )
    top_k: int | None = Field(
        None, ge=1, description="List only the top_k best labels per input; default all."
    )
    truncate: bool = Field(
        False, description="Cut inputs to the model's max_seq_len instead of refusing them (413)."
    )
    truncation_direction: Literal["right", "left"] = "right"


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyItem(BaseModel):
    index: int = Field(description="The input's position in the request.")
    prediction: str = Field(description="The best label.")
    score: float = Field(description="The best label's score.")
    predictions: list[LabelScore] = Field(description="Labels best first (at most top_k).")


class ClassifyResponse(BaseModel):
    model: str
    data: list[ClassifyItem]
    usage: Usage


class SimilarityRequest(BaseModel):
    """``POST /v1/explain/similarity``: why a query and documents match, for mean-pooled
    models: each cosine split into token-pair terms."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(
        None, description="A mean-pooling model; the server's default if omitted."
    )
    query: str = Field(description="Non-empty.")
    documents: list[str] = Field(
        description="Non-empty texts, 1 to ATTNSERVE_MAX_SEQUENCES - 1 (the answer is per "
        "token; more is 413)."
    )
    top_pairs: int = Field(
        10, description="Token pairs listed per document, largest contribution first (0..100)."
    )
    encoding_format: EncodingFormat = Field(
        "float", description="contributions as nested JSON floats, or a Base64Array."
    )
    truncate: bool = Field(
        False, description="Cut texts to the model's max_seq_len instead of refusing them (413)."
    )


class TokenPairItem(BaseModel):
    query_index: int = Field(description="The pair's position among the query's tokens.")
    document_index: int = Field(description="Its position among the document's tokens.")
    query_token: str
    document_token: str
    contribution: float = Field(description="contributions[query_index][document_index].")


class SimilarityItem(BaseModel):
    index: int = Field(description="The document's position in the request.")
    score: float = Field(
        description="Cosine of the served (mean-pooled, normalised) query and document "
        "vectors, as /v1/encode and /v1/embeddings answer them."
    )
    query_tokens: list[str] = Field(description="The query's tokens, special tokens included.")
    document_tokens: list[str]
    contributions: list[list[float]] | Base64Array = Field(
        description="[n_q, n_d]: a_i·b_j / (n_q n_d ‖ā‖ ‖b̄‖) for token vectors a_i of the "
        "query and b_j of the document (ā, b̄ their means); sums to score."
    )
    top_pairs: list[TokenPairItem] = Field(description="The largest terms, largest first.")
    query_totals: list[float] = Field(description="Row sums [n_q]: each query token's share.")
    document_totals: list[float] = Field(
        description="Column sums [n_d]: each document token's share."
    )


class SimilarityResponse(BaseModel):
    model: str
    data: list[SimilarityItem]
    usage: Usage


class TokenizeRequest(BaseModel):
    """``POST /v1/tokenize``: texts -> tokens, ids and the encoder's input embeddings."""

    model_config = ConfigDict(extra="forbid")
    text: str | list[str] = Field(description="One text or a list of texts.")
    model: str | None = Field(None, description="Model name; the server's default if omitted.")
    return_embeddings: bool = Field(
        False, description="Also return the token embeddings [n, d_model] the encoder takes."
    )
    truncate: bool = Field(False, description="Cut texts to the model's max_seq_len.")
    truncation_direction: Literal["right", "left"] = Field(
        "right",
        description="With truncate: keep the first tokens (right) or the last (left).",
    )
    encoding_format: EncodingFormat = "float"


class TokenizedItem(BaseModel):
    index: int
    tokens: list[str]
    ids: list[int]
    embeddings: list[list[float]] | Base64Array | None


class TokenizeResponse(BaseModel):
    model: str
    data: list[TokenizedItem]
    usage: Usage


class EncodeItem(BaseModel):
    index: int = Field(description="Position of the sequence in the request.")
    tokens: list[str] | None = Field(None, description="Tokens of a text item, else null.")
    embeddings: list[list[float]] | Base64Array | None = Field(
        description="[seq_len_i, d_model] contextualized embeddings of the real tokens."
    )
    attention: list[list[list[list[float]]]] | Base64Array | None = Field(
        description="[L', H', seq_len_i, seq_len_i] attention weights ([.., k] with top_k or "
        "threshold), or null."
    )
    attention_indices: list[list[list[list[int]]]] | Base64Array | None = Field(
        None, description="With top_k or threshold: the key of each kept value, or null."
    )
    attention_summaries: dict[str, Any] | None = Field(
        None,
        description="Summary name -> [L', H'] (or [L', H', seq_len_i]) array, as asked, or null.",
    )
    hidden_states: list[list[list[float]]] | Base64Array | None = Field(
        None, description="[L'', seq_len_i, d_model] selected hidden states, or null."
    )
    pooled: list[float] | Base64Array | None = Field(
        description="[dimensions] (the model card's: d_model, or its Dense layers' width), or null."
    )
    span_embeddings: list[list[float]] | Base64Array | None = Field(
        None, description="[n_spans, d_model]: one pooled vector per span of the item, or null."
    )


class EncodeResponse(BaseModel):
    model: str
    data: list[EncodeItem]
    usage: Usage


class EncodeOutputsItem(BaseModel):
    """An item of an encode answer with ``output``: each output asked, under its name."""

    index: int = Field(description="Position of the text in the request.")
    multi_vector: list[list[float]] | Base64Array | None = Field(
        None, description="[tokens, dim]: one vector per kept token (multi_vector asked)."
    )
    dense: list[float] | Base64Array | None = Field(None, description="[d] (dense asked).")
    sparse: MultiVectorSparse | None = Field(None, description="(sparse asked).")


class EncodeOutputsResponse(BaseModel):
    model: str
    data: list[EncodeOutputsItem]
    usage: Usage


class ModelCard(BaseModel):
    """``GET /v1/models/{name}``: a superset of OpenAI's model object (id, object, created,
    owned_by), so ``openai``'s ``client.models.list()`` reads it too."""

    id: str = Field(description="The model's name (OpenAI's field).")
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time the model directory's manifest was written.")
    owned_by: str = "attnserve"
    name: str
    d_model: int
    dimensions: int = Field(
        description="The width of its pooled sentence vectors: d_model, or its last Dense "
        "layer's (sentence-transformers' Dense modules, e.g. LaBSE's)."
    )
    heads: int
    layers: int
    d_ff: int
    max_seq_len: int = Field(description="The longest sequence served, in tokens (413 beyond).")
    max_seq_len_by: str = Field(
        description="What set max_seq_len: 'the model' (its own length), "
        "'ATTNSERVE_MAX_SEQ_LEN', or 'ATTNSERVE_MAX_INFLIGHT_BYTES' (the longest sequence "
        "whose attention scratch fits the memory budget)."
    )
    causal: bool
    window: int | None
    scoring: str
    norm_placement: str
    activation: str
    opset: int
    sha256: dict[str, str]
    tokenizer: bool = Field(description="Accepts text (POST /v1/tokenize, text inputs).")
    pooling: str | None = Field(
        description="The model's own sentence-embedding pooling (mean, cls, max or last; "
        "used by /v1/embeddings, TEI's routes and pooling: model)."
    )
    normalize: bool = Field(
        description="Whether the model's sentence embeddings are L2-normalised."
    )
    hidden_states: bool = Field(
        description="Answers return_hidden_states (exported with per-layer hidden states)."
    )
    matryoshka_dimensions: list[int] = Field(
        description="Sizes the model's embeddings may be shortened to (OpenAI 'dimensions')."
    )
    prompts: dict[str, str] = Field(
        description="The model's prompts (sentence-transformers'): name -> the text "
        "prepended to each text input when a request names it with prompt_name (at most "
        "64, each at most 2,048 characters)."
    )
    default_prompt_name: str | None = Field(
        description='The prompt applied when a request names none (prompt "" turns it off).'
    )
    include_prompt: bool = Field(
        description="Whether the prompt's tokens are pooled into sentence vectors; false: "
        "they ([CLS] with them) are left out, as the model was trained."
    )
    task: Literal["embed", "rerank", "classify", "splade"] = Field(
        description="What its head answers besides token vectors: embed (no head), rerank "
        "(POST /v1/rerank, TEI's /rerank), classify (POST /v1/classify, TEI's /predict) or splade."
    )
    labels: list[str] = Field(description="A classifier's labels, in id order (id2label).")
    tasks: list[str] = Field(
        default_factory=list,
        description="Its task adapters (Jina v3's LoRA), the names a request's task takes; "
        "empty: none.",
    )
    default_task: str | None = Field(
        None, description="The task adapter a request without task gets; null: none."
    )
    late_interaction: bool = Field(
        False,
        description="A multi-vector (late-interaction) model: POST /v1/multi-vector, and "
        "/v1/rerank scores by MaxSim (its explanation is the score's split by query token).",
    )
    default: bool


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    error: str = Field(description="What went wrong, for a person.")
    error_type: str = Field(description="Machine-readable kind, e.g. invalid_input.")


class Health(BaseModel):
    status: str
