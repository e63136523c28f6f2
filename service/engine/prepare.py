"""Every limit before any work: an encode request checked, resolved and costed.

Cheap checks first: the count, then lengths (declared, tokenized or counted ids),
then the options against the model; only then are arrays decoded. The answer's
size (413) and the working memory the request will hold are decided from token
lengths here, before any graph runs: text and token ids stay (id, type) pairs,
which the batcher embeds (``execute``) once the request holds its memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from model_export.manifest import graph_io
from service.attention_scratch import attention_scratch_bytes
from service.engine import attention_answer, limits, postprocess, quantize, text
from service.engine.types import (
    ArrayInput,
    EncodeRequest,
    InputItem,
    Pooling,
    SpannedText,
    TokenIds,
)
from service.errors import InvalidInput, SequenceTooLong, UnsupportedByModel
from service.model_info import ModelInfo
from service.runtime import PLAIN_RUN, ModelRuntime, RunOptions
from service.settings import Settings

# A request of more than ATTNSERVE_MAX_SEQUENCES (pooled vectors only) runs in parts of
# that many sequences, this many queued at once: the batcher always has the next part
# while one runs, and only their outputs are in memory, never the whole request's.
PARTS_IN_FLIGHT = 2
FLOAT_BYTES = 4


@dataclass(frozen=True)
class PreparedEncode:
    """A checked encode request: its sequences in the form its graph takes, and every
    resolved option."""

    request: EncodeRequest
    model: ModelInfo
    # float32 [n, d] input embeddings, or int64 [n, 2] (token id, type): the text graph
    # takes these; for another graph the batcher embeds them first (``needs_embedding``).
    sequences: list[np.ndarray]
    tokens: list[list[str] | None]  # the tokens of text items, None for the others
    layers: list[int]
    heads: list[int]
    hidden_layers: list[int]
    pooling: Pooling
    response_bytes: float
    work_bytes: int  # memory it holds from here to its answer (limits.work_bytes)
    by_token_ids: bool = False  # every sequence is token ids, for the text graph
    first_index: int = 0  # of its first sequence in the request (a part of a large one)
    # Late chunking: per sequence, the token indices of each of its spans (None: no spans)
    span_tokens: list[list[list[int]] | None] = dataclasses.field(default_factory=list)
    # Per sequence, its first tokens that pooling leaves out (a prompt's, for a model whose
    # include_prompt is false); empty: none anywhere.
    pool_skip: list[int] = dataclasses.field(default_factory=list)
    # The version it was prepared on: it runs there even if another is swapped in meanwhile.
    runtime: ModelRuntime | None = None
    # int8/uint8 answers: the [2, width] ranges their pooled vectors are quantized with.
    quantization_ranges: np.ndarray | None = None
    # Attention answered by the compact graph (attention_answer.in_graph), and per
    # sequence the keys each of its rows keeps at most (attention_answer.kept_keys).
    compact: bool = False
    kept_keys: list[int] = dataclasses.field(default_factory=list)
    # Full maps answered by the selected-maps graph (attention_answer.selected_in_graph).
    selected: bool = False
    # The graphs' task input (models with task adapters): 0 no adapter, t tasks[t - 1].
    task: int = 0

    @property
    def graph(self) -> str:
        """The lightest graph that has every output asked for."""
        if self.request.return_attention:
            if self.compact:
                return graph_io.GRAPH_COMPACT_ATTENTION
            return graph_io.GRAPH_SELECTED_ATTENTION if self.selected else graph_io.GRAPH_ATTENTION
        if self.request.return_hidden_states:
            return graph_io.GRAPH_HIDDEN_STATES
        return graph_io.GRAPH_TEXT if self.by_token_ids else graph_io.GRAPH_EMBEDDINGS

    @property
    def run_options(self) -> RunOptions:
        """What this request's runs feed their graph: the compact graph's k (its
        sequences' largest); the selected-maps graph's layers, heads and dtype; the task."""
        if self.compact:
            return RunOptions(top_k=max(self.kept_keys, default=1), task=self.task)
        if self.selected:
            half = attention_answer.half_in_graph(self.request.attention)
            layers, heads = tuple(sorted(self.layers)), tuple(self.heads)
            return RunOptions(layers=layers, heads=heads, half=half, task=self.task)
        return RunOptions(task=self.task) if self.task else PLAIN_RUN

    def needs_embedding(self, sequence: np.ndarray) -> bool:
        """Is ``sequence`` token ids that the graph cannot take as they are?"""
        return sequence.dtype == np.int64 and self.graph not in graph_io.ID_GRAPHS


@dataclass(frozen=True)
class Options:
    """Attention layers and heads, hidden-state layers and the pooling, resolved."""

    layers: list[int]
    heads: list[int]
    hidden_layers: list[int]
    pooling: Pooling


def check_count(request: EncodeRequest, settings: Settings) -> None:
    """413 for too many inputs, before any of them is read."""
    limits.check_sequence_count(len(request.inputs), settings, pooled_only=request.pooled_only)


def prepare(request: EncodeRequest, runtime: ModelRuntime, settings: Settings) -> PreparedEncode:
    """Check everything and bring the inputs to their graph's form; raise a
    ServiceError on mistakes. No graph runs here."""
    info = runtime.info
    if not request.inputs:
        raise InvalidInput("is empty: send at least one sequence", field=("inputs",))
    pooled_only = request.pooled_only
    check_count(request, settings)  # before reading them
    inputs = list(request.inputs)
    task = task_id(info, request.task)
    prompt = _prompt(info, request, inputs)
    left = request.truncation_direction == "left"
    if prompt and not request.truncate:
        _check_prompt_fits(runtime, request, prompt)
    tokenized, ids = _front_end(
        runtime, inputs, request.truncate, settings, pooled_only, prompt, left
    )
    options = resolve_options(info, request)
    quantization = _quantization(info, request, options.pooling)
    # Text and ids asking only for embeddings run as ids in one step (when the model
    # has a text front end): the batcher sees them at once.
    by_token_ids = (
        graph_io.GRAPH_TEXT in runtime.graphs
        and not (request.return_attention or request.return_hidden_states)
        and not any(isinstance(item, ArrayInput) for item in inputs)
    )
    span_tokens = text.span_tokens(
        runtime, inputs, request.truncate, options.pooling, prompt, left=left
    )
    sequences = _sequences(info, inputs, tokenized, ids, settings, pooled_only)
    tokens = [tokenized[i][0] if i in tokenized else None for i in range(len(inputs))]
    pool_skip = _prompt_skip(runtime, tokens, prompt, options.pooling, request.prompt is not None)
    spec = request.attention
    attention_answer.check_spec(spec, [len(s) for s in sequences], request.return_attention)
    kept = [attention_answer.kept_keys(spec, len(s)) for s in sequences]
    compact = request.return_attention and attention_answer.in_graph(
        spec,
        request.return_hidden_states,
        graph_io.GRAPH_COMPACT_ATTENTION in runtime.graphs,
    )
    cfg = info.config
    selected = (
        request.return_attention
        and not compact
        and attention_answer.selected_in_graph(
            spec,
            request.return_hidden_states,
            (len(options.layers), len(options.heads)),
            (cfg.n_layers, cfg.n_heads),
            graph_io.GRAPH_SELECTED_ATTENTION in runtime.graphs,
        )
    )
    size, work = _answer_cost(
        request,
        info,
        sequences,
        tokens,
        options,
        span_tokens,
        settings,
        by_token_ids,
        compact,
        selected,
    )
    return PreparedEncode(
        request,
        info,
        sequences,
        tokens,
        options.layers,
        options.heads,
        options.hidden_layers,
        options.pooling,
        size,
        work,
        by_token_ids,
        span_tokens=span_tokens,
        pool_skip=pool_skip,
        runtime=runtime,
        quantization_ranges=quantization,
        compact=compact,
        kept_keys=kept,
        selected=selected,
        task=task,
    )


def task_id(info: ModelInfo, task: str | None) -> int:
    """The graphs' task input for ``task`` (None: the model's default, else no adapter);
    a 422 naming the model's tasks for one it does not have."""
    manifest = info.manifest
    if task is not None and not manifest.tasks:
        raise InvalidInput(f"model {info.name!r} has no task adapters", field=("task",))
    try:
        return manifest.task_id(task)
    except KeyError:
        raise InvalidInput(
            f"model {info.name!r} has no task {task!r} (its tasks: {', '.join(manifest.tasks)})",
            field=("task",),
        ) from None


def _quantization(info: ModelInfo, request: EncodeRequest, pooling: str) -> np.ndarray | None:
    """The ranges a quantized answer uses (quantize.py); quantizing needs pooled vectors."""
    if request.embedding_type != "float" and pooling == "none":
        raise InvalidInput(
            "quantizes pooled vectors: ask for a pooling too", field=("embedding_type",)
        )
    width = request.dimensions or info.pooled_width
    # The model's ranges are of its own sentence vectors: its pooling, normalised, whole.
    own = (
        pooling == (info.manifest.pooling or "mean")
        and request.normalize
        and width == info.pooled_width
    )
    return quantize.ranges_for(
        info, request.embedding_type, request.quantization_ranges, width, own
    )


def _front_end(
    runtime: ModelRuntime,
    inputs: list[InputItem],
    truncate: bool,
    settings: Settings,
    pooled_only: bool,
    prompt: str,
    left: bool,
) -> tuple[dict[int, text.Tokenized], dict[int, list[int]]]:
    """Texts tokenized and token ids checked, by input index; every length known
    before decoding (declared rows for arrays) checked against the limits."""
    info = runtime.info
    texts = {
        i: prompt + text.text_of(item)
        for i, item in enumerate(inputs)
        if isinstance(item, str | SpannedText)
    }
    bounded = text.bound(runtime, texts, truncate, "inputs", left=left)
    tokenized = text.tokenize(runtime, bounded, truncate, left=left)
    ids = {i: item.ids for i, item in enumerate(inputs) if isinstance(item, TokenIds)}
    if ids:
        text.check_token_ids(info, ids)
        types = {i: item.type_ids for i, item in enumerate(inputs) if isinstance(item, TokenIds)}
        text.check_type_ids(info, ids, types)
    lengths = [
        len(tokenized[i][0])
        if i in tokenized
        else len(ids[i])
        if i in ids
        else item.rows
        if isinstance(item, ArrayInput)
        else None
        for i, item in enumerate(inputs)
    ]
    limits.check_lengths(lengths, info, settings, "inputs", pooled_only=pooled_only)
    return tokenized, ids


def _prompt(info: ModelInfo, request: EncodeRequest, inputs: list[InputItem]) -> str:
    """The prompt for the request's text inputs; a prompt asked for without any is a 422."""
    if not any(isinstance(item, str | SpannedText) for item in inputs):
        if request.prompt is not None or request.prompt_name is not None:
            raise InvalidInput(
                "a prompt is prepended to text inputs: this request has none",
                field=("prompt" if request.prompt is not None else "prompt_name",),
            )
        return ""
    return text.prompt_of(info, request.prompt_name, request.prompt)


def _check_prompt_fits(runtime: ModelRuntime, request: EncodeRequest, prompt: str) -> None:
    """Without truncation, a prompt that alone fills the model's window makes every text
    too long: one 413 naming the prompt, before any text is tokenized."""
    info = runtime.info
    field = ("prompt",) if request.prompt is not None else ("prompt_name",)
    bounded = limits.bound_text(prompt, info, False, field, text.front_end(runtime))
    ((tokens, _, _),) = text.front_end(runtime).tokenize([bounded.text], truncate=False)
    if len(tokens) > info.max_seq_len:
        raise SequenceTooLong(
            f"the prompt is {len(tokens)} tokens with the special tokens: no text fits with "
            f"it within model {info.name!r}'s {info.max_seq_len}; shorten the prompt or ask "
            "for truncation",
            field=field,
        )


def _prompt_skip(
    runtime: ModelRuntime,
    tokens: list[list[str] | None],
    prompt: str,
    pooling: Pooling,
    request_prompt: bool = False,
) -> list[int]:
    """Per sequence, the tokens pooling leaves out: for a model whose ``include_prompt``
    is false (sentence-transformers' Pooling), the prompt's, [CLS] with them, at the
    start of each text item (the first ones whatever truncation kept, as there); none
    for other items, other models, no prompt or no pooling. A text left with no token
    to pool is a 422 (sentence-transformers would answer zeros, or -inf for max)."""
    if runtime.info.manifest.include_prompt or not prompt or pooling == "none":
        return []
    skip = text.prompt_length(runtime, prompt)
    specials = text.front_end(runtime).special_tokens
    for i, seq in enumerate(tokens):
        # The text's own tokens: those after the prompt's, before a closing [SEP] (a
        # prompt that fills the window left only that [SEP] to pool, for every text).
        if seq is not None and len(seq) - (1 if seq and seq[-1] in specials else 0) <= skip:
            raise InvalidInput(
                f"the prompt's {skip} tokens leave none of this text's to pool (model "
                f"{runtime.info.name!r} pools a text without its prompt): shorten the prompt",
                field=("prompt",) if request_prompt else ("inputs", i),
            )
    return [0 if seq is None else skip for seq in tokens]


def resolve_options(info: ModelInfo, request: EncodeRequest) -> Options:
    """Attention layers and heads, hidden-state layers and pooling, checked against the
    model (even when not asked for: a wrong index is wrong either way)."""
    cfg = info.config
    spec = request.attention
    layers = postprocess.resolve_indices(
        spec.layers, cfg.n_layers, "layers", ("attention", "layers")
    )
    heads = postprocess.resolve_indices(spec.heads, cfg.n_heads, "heads", ("attention", "heads"))
    hidden_layers = postprocess.resolve_indices(
        request.hidden_layers, cfg.n_layers + 1, "hidden states", ("hidden_states", "layers")
    )
    if request.return_hidden_states and not info.manifest.has_hidden_states:
        raise UnsupportedByModel(
            f"model {info.name!r} was exported without per-layer hidden states: "
            "re-export it with this version of model_export",
            field=("return_hidden_states",),
        )
    if spec.measure == "norms" and request.return_attention and not info.manifest.has_value_norms:
        raise UnsupportedByModel(
            f"model {info.name!r} was exported without value norms: re-export it with "
            "this version of model_export",
            field=("attention", "measure"),
        )
    if spec.reduce == "rollout":
        layers = sorted(set(layers))  # rollout multiplies layers bottom-up, each once
    return Options(layers, heads, hidden_layers, _pooling(info, request))


def _pooling(info: ModelInfo, request: EncodeRequest) -> Pooling:
    """The pooling to apply; checks normalize and dimensions against it and the model."""
    pooling: Pooling = info.default_pooling if request.pooling == "model" else request.pooling
    if request.normalize and pooling == "none":
        raise InvalidInput(
            "applies to pooled vectors: set pooling (mean, cls, max, last)", field=("normalize",)
        )
    if request.dimensions is not None:
        allowed = info.manifest.matryoshka_dimensions
        if not allowed:
            raise InvalidInput(
                f"model {info.name!r} was not trained for shortened embeddings (its "
                "manifest declares no Matryoshka dimensions): omit dimensions",
                field=("dimensions",),
            )
        if request.dimensions not in allowed:
            raise InvalidInput(
                f"{request.dimensions} is not one of model {info.name!r}'s Matryoshka "
                f"dimensions {list(allowed)}",
                field=("dimensions",),
            )
        if pooling == "none":
            raise InvalidInput("applies to pooled vectors", field=("dimensions",))
    return pooling


def _sequences(
    info: ModelInfo,
    inputs: list[InputItem],
    tokenized: dict[int, text.Tokenized],
    ids: dict[int, list[int]],
    settings: Settings,
    pooled_only: bool,
) -> list[np.ndarray]:
    """Per input: arrays decoded and checked, text and token ids as (id, type) pairs."""
    sequences = []
    for i, item in enumerate(inputs):
        if isinstance(item, ArrayInput):
            sequences.append(limits.check_array(item.decode(), ("inputs", i), info.config.d_model))
        elif i in tokenized:
            _, token_ids, type_ids = tokenized[i]
            sequences.append(text.id_pairs(token_ids, type_ids))
        else:  # token ids: type 0 unless given
            types = item.type_ids if isinstance(item, TokenIds) else None
            sequences.append(text.id_pairs(ids[i], types))
    # Again on what was decoded: a protocol may not know a length before decoding.
    limits.check_lengths(
        [len(s) for s in sequences], info, settings, "inputs", pooled_only=pooled_only
    )
    return sequences


def _answer_cost(
    request: EncodeRequest,
    info: ModelInfo,
    sequences: list[np.ndarray],
    tokens: list[list[str] | None],
    options: Options,
    span_tokens: list[list[list[int]] | None],
    settings: Settings,
    by_token_ids: bool,
    compact: bool = False,
    selected: bool = False,
) -> tuple[float, int]:
    """The answer's size (413 beyond ATTNSERVE_MAX_RESPONSE_BYTES) and the working
    memory the request holds until it is sent, from token lengths alone."""
    cfg = info.config
    lengths = [len(s) for s in sequences]
    answer_lengths = lengths
    if request.pad_to is not None:
        answer_lengths = [max(request.pad_to, *lengths)] * len(lengths)
    spec = request.attention
    asks = request.return_attention
    shape = limits.answer_shape(
        answer_lengths,
        cfg.d_model,
        attention=limits.attention_maps(spec, len(options.layers), len(options.heads))
        if asks and spec.maps
        else None,
        attention_keys=[attention_answer.kept_keys(spec, n) for n in answer_lengths]
        if asks and spec.sparse
        else None,
        summaries=(len(spec.summaries), len(options.layers), len(options.heads))
        if asks and spec.summaries
        else None,
        summaries_per_token=spec.summaries_per_token,
        half_maps=spec.dtype == "float16",
        embeddings=request.return_embeddings,
        pooled_width=None
        if options.pooling == "none"
        else (request.dimensions or info.pooled_width),
        hidden_states=len(options.hidden_layers) if request.return_hidden_states else 0,
        tokens=tokens,
        spans=[0 if spans is None else len(spans) for spans in span_tokens],
    )
    size = limits.check_response_size(shape, request.wire_cost, info.name, settings)
    # Token ids another graph cannot take are embedded before their run: as many floats
    # per token as an array input holds.
    held = [
        len(s) * cfg.d_model * FLOAT_BYTES if s.dtype == np.int64 and not by_token_ids else s.nbytes
        for s in sequences
    ]
    running, inputs_held = lengths, 0
    part = settings.max_sequences
    if len(lengths) > part:  # it runs in parts, PARTS_IN_FLIGHT at a time
        parts = [lengths[i : i + part] for i in range(0, len(lengths), part)]
        in_flight = sorted(parts, key=sum, reverse=True)[:PARTS_IN_FLIGHT]
        running = [n for p in in_flight for n in p]
        inputs_held = sum(held)  # each input waits for its part
    work = limits.work_bytes(
        running,
        cfg,
        request.return_attention,
        request.return_hidden_states,
        shape,
        size,
        request.wire_cost.copies,
        compact_keys=max(attention_answer.kept_keys(spec, n) for n in running) if compact else None,
        sorts_maps=asks and spec.sparse and not compact,
        selected_maps=attention_answer.selected_maps(spec, len(options.layers), len(options.heads))
        if selected
        else None,
    )
    scratch = attention_scratch_bytes(running, cfg, settings.max_batch_tokens, compact=compact)
    return size, work + inputs_held + scratch
