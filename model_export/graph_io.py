"""Names, dtypes and dynamic axes of the ONNX graphs, declared once.

Export, validation, the service runtime and the tests all import these, so a
rename cannot drift between writer and reader. This module must not import
torch: the service imports it at run time.
"""

from __future__ import annotations

from typing import Final

INPUT_EMBEDS: Final = "inputs_embeds"  # float32 [batch, seq, d_model]
INPUT_MASK: Final = "attention_mask"  # int64 [batch, seq], 1 = token, 0 = padding
OUTPUT_HIDDEN: Final = "last_hidden_state"  # float32 [batch, seq, d_model]
OUTPUT_ATTENTIONS: Final = "attentions"  # float32 [batch, layers, heads, seq, seq]
# transformers' output_hidden_states: the input embeddings, then each layer's output.
OUTPUT_HIDDEN_STATES: Final = "hidden_states"  # float32 [batch, layers + 1, seq, d_model]
# ‖f_h(x_j)‖ per layer, head and token (Kobayashi et al., 2020): weights times these are
# the attention norms. float32 [batch, layers, heads, seq], 0 at padding.
OUTPUT_VALUE_NORMS: Final = "value_norms"
# Compact attention (model_attn_compact.onnx): per query row the k largest weights and
# their keys, and per-head statistics, computed layer by layer inside the graph, so the
# [B, L, H, T, T] maps are never stacked nor copied out. k is the length of the
# ``attention_top_k`` input (its values are unused: a shape is what ONNX's TopK can take
# from a dynamic input without a data-dependent export).
INPUT_TOP_K: Final = "attention_top_k"  # int64 [k], 1 <= k <= seq
OUTPUT_TOP_WEIGHTS: Final = "attention_top_weights"  # float32 [batch, layers, heads, seq, k]
OUTPUT_TOP_INDICES: Final = "attention_top_indices"  # int32 [batch, layers, heads, seq, k]
# float32 [batch, layers, heads, seq, len(SUMMARIES)]: each query row's statistics.
OUTPUT_SUMMARIES: Final = "attention_summaries"
# Per query row i over keys j (weights a_ij of a sequence of n tokens), in this order:
# entropy -sum a_ij ln a_ij (nats, 0 ln 0 = 0); first a_i0; self a_ii; previous a_i,i-1
# (0 at i = 0); next a_i,i+1 (0 at the last token); distance sum a_ij |i - j| (tokens).
SUMMARIES: Final = ("entropy", "first", "self", "previous", "next", "distance")
# Selected full maps (model_attn_select.onnx): the maps of the marked layers and the
# listed heads only, float32 or float16, each layer cut and cast as soon as its weights
# exist. Each layer's mark says which output its maps go to.
LAYER_DROPPED: Final = 0  # neither
LAYER_FLOAT32: Final = 1  # selected_attentions
LAYER_FLOAT16: Final = 2  # selected_attentions_fp16
INPUT_LAYERS: Final = "attention_layers"  # int64 [layers], each a LAYER_* mark
INPUT_HEADS: Final = "attention_heads"  # int64 [heads'], each in [0, heads)
OUTPUT_SELECTED: Final = "selected_attentions"  # float32 [batch, layers', heads', seq, seq]
OUTPUT_SELECTED_HALF: Final = "selected_attentions_fp16"  # float16, the same shape

# The optional text front end (models imported from a checkpoint with a tokenizer).
INPUT_IDS: Final = "input_ids"  # int64 [batch, seq]
INPUT_TOKEN_TYPES: Final = "token_type_ids"  # int64 [batch, seq]
TEXT_INPUT_NAMES: Final = (INPUT_IDS, INPUT_TOKEN_TYPES)

# Models with task adapters (EncoderConfig.lora_tasks, Jina v3): every graph that runs
# the model takes, after its other inputs, each row's task, 0 = no adapter and t = the
# manifest's tasks[t - 1].
INPUT_TASK: Final = "task"  # int64 [batch]

BATCH_AXIS: Final = "batch"
SEQ_AXIS: Final = "seq"

INPUT_NAMES: Final = (INPUT_EMBEDS, INPUT_MASK)

# File names inside a model directory.
GRAPH_EMBEDDINGS: Final = "model.onnx"  # embeddings only: the fast path
GRAPH_ATTENTION: Final = "model_attn.onnx"  # embeddings, attention weights, hidden states
GRAPH_HIDDEN_STATES: Final = "model_hidden.onnx"  # embeddings and hidden states, no attention
GRAPH_COMPACT_ATTENTION: Final = "model_attn_compact.onnx"  # top-k attention and summaries
GRAPH_SELECTED_ATTENTION: Final = "model_attn_select.onnx"  # some layers' and heads' maps
CONFIG_FILE: Final = "config.json"
GRAPH_TOKEN_EMBEDDINGS: Final = "embeddings.onnx"  # token ids -> inputs_embeds
TOKENIZER_FILE: Final = "tokenizer.json"  # a `tokenizers` Tokenizer
# Token ids, token types and mask -> last_hidden_state in one run (format_version 3 and 4):
# text that asks only for embeddings. Written no more (see WEIGHTS_FILE), but its name
# stays the label of that run, which the service then makes of two graphs.
GRAPH_TEXT: Final = "text_model.onnx"
TEXT_GRAPH_INPUTS: Final = (INPUT_IDS, INPUT_TOKEN_TYPES, INPUT_MASK)
TEXT_GRAPH_OUTPUTS: Final = (OUTPUT_HIDDEN,)
# Token ids -> the last layer's [CLS] attention row, averaged over heads [batch, seq]
# (format_version 4): what BM42 sparse vectors weigh words by. Only that row is computed.
GRAPH_SPARSE: Final = "sparse_model.onnx"
OUTPUT_CLS_ATTENTION: Final = "cls_attention"  # float32 [batch, seq], 0 at padding
SPARSE_GRAPH_OUTPUTS: Final = (OUTPUT_CLS_ATTENTION,)
# Heads (models imported with one): token ids, types and mask -> the head's answer per
# sequence, the encoder's weights read from the same weights.bin as every graph.
# A sequence-classification head (cross-encoders, classifiers): one logit per label.
GRAPH_SCORES: Final = "scores_model.onnx"
OUTPUT_LOGITS: Final = "logits"  # float32 [batch, labels]
# A masked-LM head read as SPLADE: max over tokens of log(1 + relu(logits)), 0 at padding.
GRAPH_SPLADE: Final = "splade_model.onnx"
OUTPUT_SPLADE: Final = "splade"  # float32 [batch, vocab]
# Late interaction (manifest ``late_interaction``, format 9): token ids, types and mask ->
# the last hidden state (for a dense vector pooled from the same run), each token's
# projected vector (ColBERT's ``linear``, sentence-transformers' Dense; normalised per
# token where the model does) and, for bge-m3, each token's lexical weight
# relu(w·h + b): dense, sparse and multi-vector answers from one run. A token of type
# ``TYPE_SCORED_ONLY`` is masked out of attention (mask 0) and read as type 0: ColBERT's
# query expansion tokens, which MaxSim scores but the encoder does not attend to.
GRAPH_MULTI_VECTOR: Final = "multi_vector_model.onnx"
OUTPUT_MULTI_VECTORS: Final = "multi_vectors"  # float32 [batch, seq, dim]
OUTPUT_TOKEN_WEIGHTS: Final = "token_weights"  # float32 [batch, seq]
# The attention each token receives in the same run (what pruning a document's vectors
# keeps by, service.engine.pruning.received_attention with layers="mean", rows="all"):
# r_j = mean over layers and heads of sum_i a_ij over the attended query rows i (mask 1,
# [CLS] and [SEP] included; padding and scored-only rows not). float32 [batch, seq], 0 at
# padding and at scored-only tokens (masked keys). Computed layer by layer in the graph:
# no [B, L, H, T, T] stack leaves it. Since issue 48's pruning; older exports lack it.
OUTPUT_ATTENTION_RECEIVED: Final = "attention_received"
TYPE_SCORED_ONLY: Final = -1
MULTI_VECTOR_OUTPUTS: Final = (
    OUTPUT_HIDDEN,
    OUTPUT_MULTI_VECTORS,
    OUTPUT_TOKEN_WEIGHTS,
    OUTPUT_ATTENTION_RECEIVED,
)
HEAD_GRAPHS: Final[dict[str, tuple[str, ...]]] = {
    GRAPH_SCORES: (OUTPUT_LOGITS,),
    GRAPH_SPLADE: (OUTPUT_SPLADE,),
}
STOPWORDS_FILE: Final = "stopwords.txt"  # one word per line: left out of BM42 vectors
# format_version 5: the weights of every graph, each distinct tensor once, as ONNX
# external data (model_export.weights_file). Since then text asking only for embeddings
# runs embeddings.onnx then model.onnx in one step (no text_model.onnx: a third copy of
# the encoder's pre-packed weights for no measured gain).
WEIGHTS_FILE: Final = "weights.bin"
# format_version 8: sentence-transformers' Dense layers, applied after pooling: per layer
# its weight [out, in] (row-major), then its bias [out] if it has one, float32 little-endian.
DENSE_FILE: Final = "dense.bin"
# The graphs that take token ids (int64 [B, T, 2] id and type pairs at run time) -> outputs.
# The token-embedding graph runs in the service's batches too, as the first step of text
# asking for attention or hidden states (it takes no mask).
ID_GRAPHS: Final[dict[str, tuple[str, ...]]] = {
    GRAPH_TEXT: TEXT_GRAPH_OUTPUTS,
    GRAPH_SPARSE: SPARSE_GRAPH_OUTPUTS,
    GRAPH_TOKEN_EMBEDDINGS: (INPUT_EMBEDS,),
    GRAPH_MULTI_VECTOR: MULTI_VECTOR_OUTPUTS,
    **HEAD_GRAPHS,
}

# The graphs an export writes, and their outputs. A graph is chosen per run by what
# its requests ask for: the attention maps are the costly part (seq² memory), so a
# request without them never runs a graph that stacks them.
GRAPH_OUTPUTS: Final[dict[str, tuple[str, ...]]] = {
    GRAPH_EMBEDDINGS: (OUTPUT_HIDDEN,),
    GRAPH_HIDDEN_STATES: (OUTPUT_HIDDEN, OUTPUT_HIDDEN_STATES),
    GRAPH_ATTENTION: (OUTPUT_HIDDEN, OUTPUT_ATTENTIONS, OUTPUT_HIDDEN_STATES, OUTPUT_VALUE_NORMS),
    GRAPH_COMPACT_ATTENTION: (
        OUTPUT_HIDDEN,
        OUTPUT_TOP_WEIGHTS,
        OUTPUT_TOP_INDICES,
        OUTPUT_SUMMARIES,
    ),
    GRAPH_SELECTED_ATTENTION: (OUTPUT_HIDDEN, OUTPUT_SELECTED, OUTPUT_SELECTED_HALF),
}
# The graphs that compute attention weights to return (no fused attention kernel: it
# keeps its weights to itself).
MAP_GRAPHS: Final = (GRAPH_ATTENTION, GRAPH_COMPACT_ATTENTION, GRAPH_SELECTED_ATTENTION)
# The graphs an export may leave out (--no-compact-attention): the service answers
# their requests from the full maps instead.
COMPACT_GRAPHS: Final = (GRAPH_COMPACT_ATTENTION, GRAPH_SELECTED_ATTENTION)
# Each graph's inputs where they are not INPUT_NAMES.
GRAPH_INPUTS: Final[dict[str, tuple[str, ...]]] = {
    GRAPH_COMPACT_ATTENTION: (*INPUT_NAMES, INPUT_TOP_K),
    GRAPH_SELECTED_ATTENTION: (*INPUT_NAMES, INPUT_LAYERS, INPUT_HEADS),
}
# One short label per graph: the inference metric's ``graph`` label (the first release's
# values kept) and the names ATTNSERVE_PREPACKED_GRAPHS takes.
GRAPH_LABELS: Final[dict[str, str]] = {
    GRAPH_EMBEDDINGS: "embeddings",
    GRAPH_HIDDEN_STATES: "hidden_states",
    GRAPH_ATTENTION: "attention",
    GRAPH_COMPACT_ATTENTION: "compact_attention",
    GRAPH_SELECTED_ATTENTION: "selected_attention",
    GRAPH_TEXT: "text",
    GRAPH_SPARSE: "sparse",
    GRAPH_TOKEN_EMBEDDINGS: "token_embeddings",
    GRAPH_SCORES: "scores",
    GRAPH_SPLADE: "splade",
    GRAPH_MULTI_VECTOR: "multi_vector",
}
# Graphs every model directory has; the first release wrote only these, without
# hidden states (such models answer hidden-state requests with 422).
REQUIRED_GRAPHS: Final = (GRAPH_EMBEDDINGS, GRAPH_ATTENTION)

# Export defaults (torch-free, so the CLI answers --help without loading torch).
DEFAULT_OPSET: Final = 18
EXPORTERS: Final = ("dynamo", "torchscript")
DEFAULT_ATOL: Final = 1e-4  # fp32: observed parity ~1e-6; 1e-4 leaves headroom, catches bugs
# Plus a relative part, as numpy.allclose: |onnx - torch| <= atol + rtol * |torch|. The
# intermediate hidden states reach |10| on MiniLM, where fp32 kernels of another CPU
# (an AMD EPYC) differed by 1.004e-4 (2.6e-7 relative): atol alone refused a correct export.
DEFAULT_RTOL: Final = 1e-5

# Dynamic axes of every graph input and output: axis index -> symbolic name.
DYNAMIC_AXES: Final[dict[str, dict[int, str]]] = {
    INPUT_EMBEDS: {0: BATCH_AXIS, 1: SEQ_AXIS},
    INPUT_MASK: {0: BATCH_AXIS, 1: SEQ_AXIS},
    OUTPUT_HIDDEN: {0: BATCH_AXIS, 1: SEQ_AXIS},
    OUTPUT_ATTENTIONS: {0: BATCH_AXIS, 3: SEQ_AXIS, 4: SEQ_AXIS},
    OUTPUT_HIDDEN_STATES: {0: BATCH_AXIS, 2: SEQ_AXIS},
    INPUT_IDS: {0: BATCH_AXIS, 1: SEQ_AXIS},
    INPUT_TOKEN_TYPES: {0: BATCH_AXIS, 1: SEQ_AXIS},
    OUTPUT_CLS_ATTENTION: {0: BATCH_AXIS, 1: SEQ_AXIS},
    OUTPUT_VALUE_NORMS: {0: BATCH_AXIS, 3: SEQ_AXIS},
    INPUT_TOP_K: {0: "k"},
    OUTPUT_TOP_WEIGHTS: {0: BATCH_AXIS, 3: SEQ_AXIS, 4: "k"},
    OUTPUT_TOP_INDICES: {0: BATCH_AXIS, 3: SEQ_AXIS, 4: "k"},
    OUTPUT_SUMMARIES: {0: BATCH_AXIS, 3: SEQ_AXIS},
    INPUT_LAYERS: {},
    INPUT_HEADS: {0: "heads'"},
    INPUT_TASK: {0: BATCH_AXIS},
    OUTPUT_SELECTED: {0: BATCH_AXIS, 1: "layers'", 2: "heads'", 3: SEQ_AXIS, 4: SEQ_AXIS},
    OUTPUT_SELECTED_HALF: {0: BATCH_AXIS, 1: "layers'", 2: "heads'", 3: SEQ_AXIS, 4: SEQ_AXIS},
    OUTPUT_LOGITS: {0: BATCH_AXIS},
    OUTPUT_SPLADE: {0: BATCH_AXIS},
    OUTPUT_MULTI_VECTORS: {0: BATCH_AXIS, 1: SEQ_AXIS},
    OUTPUT_TOKEN_WEIGHTS: {0: BATCH_AXIS, 1: SEQ_AXIS},
    OUTPUT_ATTENTION_RECEIVED: {0: BATCH_AXIS, 1: SEQ_AXIS},
}

# The axes of each array that run over tokens within one sequence (its batch axis dropped):
# what padding adds to and trimming cuts back.
TOKEN_AXES: Final[dict[str, tuple[int, ...]]] = {
    name: tuple(axis - 1 for axis, symbol in axes.items() if symbol == SEQ_AXIS)
    for name, axes in DYNAMIC_AXES.items()
}

# Symbolic shapes, for config.json and documentation.
SHAPES: Final[dict[str, list[str]]] = {
    INPUT_EMBEDS: [BATCH_AXIS, SEQ_AXIS, "d_model"],
    INPUT_MASK: [BATCH_AXIS, SEQ_AXIS],
    OUTPUT_HIDDEN: [BATCH_AXIS, SEQ_AXIS, "d_model"],
    OUTPUT_ATTENTIONS: [BATCH_AXIS, "layers", "heads", SEQ_AXIS, SEQ_AXIS],
    OUTPUT_HIDDEN_STATES: [BATCH_AXIS, "layers + 1", SEQ_AXIS, "d_model"],
    OUTPUT_VALUE_NORMS: [BATCH_AXIS, "layers", "heads", SEQ_AXIS],
    INPUT_IDS: [BATCH_AXIS, SEQ_AXIS],
    INPUT_TOKEN_TYPES: [BATCH_AXIS, SEQ_AXIS],
    INPUT_TOP_K: ["k"],
    OUTPUT_TOP_WEIGHTS: [BATCH_AXIS, "layers", "heads", SEQ_AXIS, "k"],
    OUTPUT_TOP_INDICES: [BATCH_AXIS, "layers", "heads", SEQ_AXIS, "k"],
    OUTPUT_SUMMARIES: [BATCH_AXIS, "layers", "heads", SEQ_AXIS, "summaries"],
    INPUT_LAYERS: ["layers"],
    INPUT_HEADS: ["heads'"],
    INPUT_TASK: [BATCH_AXIS],
    OUTPUT_SELECTED: [BATCH_AXIS, "layers'", "heads'", SEQ_AXIS, SEQ_AXIS],
    OUTPUT_SELECTED_HALF: [BATCH_AXIS, "layers'", "heads'", SEQ_AXIS, SEQ_AXIS],
}
# Outputs that are not float32.
DTYPES: Final[dict[str, str]] = {OUTPUT_TOP_INDICES: "int32", OUTPUT_SELECTED_HALF: "float16"}


def with_task(inputs: tuple[str, ...], tasks: int) -> tuple[str, ...]:
    """A graph's inputs for a model of ``tasks`` task adapters: the task id last."""
    return (*inputs, INPUT_TASK) if tasks else inputs
