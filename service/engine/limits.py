"""Every limit of a request, checked before any inference is queued.

A bad or oversized request then costs a parse and a few comparisons, never a
run: sequence counts and lengths are checked before arrays are decoded or
texts embedded, and the answer's size before anything is computed.
"""

from __future__ import annotations

import math

import numpy as np

from model_export.manifest import EncoderConfig
from service.condense import BoundedText
from service.engine.types import AnswerShape, AttentionSpec, ServingLimits, WireCost
from service.errors import FieldPath, InvalidInput, PayloadTooLarge, SequenceTooLong
from service.model_info import ModelInfo
from service.settings import Settings
from service.tokenizer import PART_CHARS, TextFrontEnd

MB = 1e6
FLOAT32 = 4
# The first prefix of a long text tokenized, in characters per token of the model's length:
# English averages ~4.5 per WordPiece token, so this prefix almost always settles it.
# Only a cost knob: the answer never depends on it (``bound_text``).
FIRST_PREFIX_CHARS_PER_TOKEN = 64
# How much longer each next prefix is, when the previous one held too few tokens.
PREFIX_GROWTH = 4
# The most characters of one text the tokenizer ever sees, per token of the model's
# length (the search's third prefix): 262,144 for a 256-token model.
MAX_CHARS_PER_TOKEN = FIRST_PREFIX_CHARS_PER_TOKEN * PREFIX_GROWTH**2
# Tokenizing's memory, measured with the tokenizers package (MiniLM's BERT WordPiece) as
# the peak RSS around encode_batch of 20-200 texts of 1k-100k characters: in flight,
# ~30 bytes per character of English words (5.7 characters a token), ~100 of "a a a",
# ~220 of CJK or punctuation (a token per character: normalized strings, their per-byte
# alignments, pre-token splits and each token's Encoding entries); kept, ~190 bytes per
# token of Encoding (dropped after each part) and ~110 of the Python tokens, ids and
# type ids made of it. Priced at the worst: the characters of one part in flight
# (``tokenizer.PART_CHARS``) and every text's kept tokens.
TOKENIZING_BYTES_PER_CHAR = 256
KEPT_BYTES_PER_TOKEN = 128
# Special tokens a text gains ([CLS] [SEP]; a pair's up to four).
SPECIAL_TOKENS = 4


def serving_limits(settings: Settings) -> ServingLimits:
    """What a protocol may tell its clients about the limits that apply."""
    return ServingLimits(
        max_queued_requests=settings.max_queued_requests,
        max_batch_tokens=settings.max_batch_tokens,
        max_pooled_sequences=settings.max_pooled_sequences,
        max_concurrent_codecs=settings.max_concurrent_codecs,
    )


def max_json_items(settings: Settings) -> int:
    """Arrays, objects and strings a valid JSON request can need: a row per token (arrays
    input), a few per sequence (its list, a base64 object, a text), some for options.
    A text's own brackets and quotes are tokens of their own, so they fit too."""
    most_tokens = max(settings.max_tokens, settings.max_pooled_tokens)
    return most_tokens + 4 * max(settings.max_sequences, settings.max_pooled_sequences) + 1024


def check_json_items(items: int, settings: Settings) -> None:
    """413 for a body holding more arrays, objects and strings than any valid request."""
    most = max_json_items(settings)
    if items > most:
        raise PayloadTooLarge(
            f"the body holds over {most:,} JSON arrays, objects and strings (brackets and "
            "quotes inside texts count too), more than any valid request needs: send fewer "
            "sequences or tokens per request"
        )


def check_sequence_count(n_sequences: int, settings: Settings, *, pooled_only: bool) -> None:
    """413 beyond ``max_sequences``, or ``max_pooled_sequences`` for a request whose answer
    is only pooled vectors (small, whatever its count: it runs in parts)."""
    most = settings.max_pooled_sequences if pooled_only else settings.max_sequences
    if n_sequences > most:
        hint = (
            ""
            if pooled_only
            else f" ({settings.max_pooled_sequences} when only pooled vectors are asked for)"
        )
        raise PayloadTooLarge(f"{n_sequences} sequences in one request; the limit is {most}{hint}")


def check_lengths(
    lengths: list[int | None],
    model: ModelInfo,
    settings: Settings,
    field: str,
    *,
    pooled_only: bool = False,
) -> None:
    """Each known length within the model's, and their sum within ``max_tokens`` (or
    ``max_pooled_tokens``)."""
    for i, n in enumerate(lengths):
        if n is not None and n > model.max_seq_len:
            raise SequenceTooLong(
                f"{n} tokens; model {model.name!r} accepts at most {model.max_seq_len} "
                f"(set by {model.max_seq_len_by}): shorten it",
                field=(field, i),
            )
    total = sum(n for n in lengths if n is not None)
    most = settings.max_pooled_tokens if pooled_only else settings.max_tokens
    if total > most:
        raise PayloadTooLarge(f"{total} tokens in one request; the limit is {most}")


def bound_text(
    text: str,
    model: ModelInfo,
    truncate: bool,
    field: FieldPath,
    front_end: TextFrontEnd,
    *,
    left: bool = False,
) -> BoundedText:
    """The part of ``text`` its tokenizing needs: a prefix with the same truncated tokens
    (``truncate``), a 413 once a prefix alone is too long, else the whole text; in every
    case at most ``max_seq_len * MAX_CHARS_PER_TOKEN`` characters reach the tokenizer.

    A long text is first condensed (``TextFrontEnd.condense``: runs of letters or
    whitespace that cannot change its tokens cut short, read only as far as the bound).
    Then prefixes of ``max_seq_len * FIRST_PREFIX_CHARS_PER_TOKEN`` characters, and
    ``PREFIX_GROWTH`` times longer up to the bound, are tried until one holds more than
    ``max_seq_len`` tokens that the rest of the text cannot change
    (``TextFrontEnd.final_tokens``: those before its last, possibly cut, word). The
    tokenizer's own truncation of the returned prefix is then exactly its truncation
    of the whole text, whatever the text's characters per token (a prefix cut blindly
    by characters kept 83 tokens of whitespace-heavy text instead of 256). A text whose
    condensed form is longer than the bound and holds fewer settled tokens within it
    is refused (413) rather than tokenized whole: more than ``MAX_CHARS_PER_TOKEN``
    characters a token is no text a model reads (an unbroken 30 MB word took 25 s and
    1 GB to tokenize). With ``left`` (truncation keeps the last tokens) the same holds
    of suffixes, ``final_tokens`` then counting a suffix's tokens after its first word.
    The answer's offsets map back to ``text`` through ``BoundedText.origin``."""
    size = model.max_seq_len * FIRST_PREFIX_CHARS_PER_TOKEN
    if len(text) <= size:
        return BoundedText(text)
    most = model.max_seq_len * MAX_CHARS_PER_TOKEN
    condensed = front_end.condense(text, most + 1, from_end=left)
    held = condensed.text
    while size < len(held) and size <= most:
        begin, end = (len(held) - size, len(held)) if left else (0, size)
        if front_end.final_tokens(held[begin:end], from_end=left) > model.max_seq_len:
            if truncate:
                return condensed.sliced(begin, end)
            raise SequenceTooLong(
                f"{len(text):,} characters whose {'last' if left else 'first'} {size:,} "
                "already hold over "
                f"{model.max_seq_len} tokens: more than model {model.name!r} accepts; "
                "shorten it or ask for truncation",
                field=field,
            )
        size *= PREFIX_GROWTH
    if len(held) <= most:
        return condensed
    raise SequenceTooLong(
        f"{len(text):,} characters whose {'last' if left else 'first'} {most:,} hold "
        f"fewer than {model.max_seq_len} tokens the rest cannot change: over "
        f"{MAX_CHARS_PER_TOKEN} characters a token of model {model.name!r}'s length, more "
        "than any text is tokenized for; shorten it",
        field=field,
    )


def check_array(array: np.ndarray, field: FieldPath, d_model: int) -> np.ndarray:
    """A decoded sequence must be float32 [n >= 1, d_model], all finite."""
    if array.ndim != 2:
        raise InvalidInput(
            f"expected rank 2 [seq_len, {d_model}], got shape {list(array.shape)}", field=field
        )
    if array.shape[0] == 0:
        raise InvalidInput("sequence is empty", field=field)
    if array.shape[1] != d_model:
        raise InvalidInput(f"width {array.shape[1]} does not match d_model {d_model}", field=field)
    if not np.isfinite(array).all():
        raise InvalidInput("contains NaN or Inf (or a value beyond float32 range)", field=field)
    return array


def attention_maps(spec: AttentionSpec, n_layers: int, n_heads: int) -> tuple[int, int]:
    """(layers, heads) of the maps one sequence's answer holds after selection and reduction."""
    if spec.reduce == "rollout":
        return 1, 1
    return n_layers, (1 if spec.reduce in ("mean", "max") else n_heads)


def answer_shape(
    lengths: list[int],
    d_model: int,
    *,
    attention: tuple[int, int] | None,
    embeddings: bool,
    pooled_width: int | None,
    hidden_states: int = 0,
    tokens: list[list[str] | None] | None = None,
    spans: list[int] | None = None,
    attention_keys: list[int] | None = None,
    summaries: tuple[int, int, int] | None = None,
    summaries_per_token: bool = False,
    half_maps: bool = False,
) -> AnswerShape:
    """Every array (and token list) the answer to sequences of ``lengths`` holds;
    ``spans``: each sequence's late-chunking span vectors. ``attention`` is the maps'
    (layers, heads); with ``attention_keys`` each sequence's rows keep that many keys,
    as values and indices; ``summaries`` is (count, layers, heads) of [L', H'] arrays,
    or [L', H', n] ``summaries_per_token``; ``half_maps``: the maps' values are float16."""
    arrays: list[tuple[int, ...]] = []
    attention_floats = hidden_state_floats = half_floats = 0
    for count in spans or []:
        if count and pooled_width is not None:
            arrays.append((count, pooled_width))
    for index, n in enumerate(lengths):
        if embeddings:
            arrays.append((n, d_model))
        if attention is not None:
            keys = n if attention_keys is None else attention_keys[index]
            maps = [(*attention, n, keys)] * (1 if attention_keys is None else 2)
            arrays += maps
            attention_floats += sum(math.prod(m) for m in maps)
            half_floats += math.prod(maps[0]) if half_maps else 0
        if summaries is not None:
            count, layers, heads = summaries
            one = (layers, heads, n) if summaries_per_token else (layers, heads)
            arrays += [one] * count
            attention_floats += count * math.prod(one)
        if pooled_width is not None:
            arrays.append((pooled_width,))
        if hidden_states:
            arrays.append((hidden_states, n, d_model))
            hidden_state_floats += hidden_states * n * d_model
    listed = [t for t in tokens or [] if t is not None]
    return AnswerShape(
        arrays=arrays,
        sequences=len(lengths),
        token_strings=sum(len(t) for t in listed),
        token_chars=sum(len(tok) for t in listed for tok in t),
        attention_floats=attention_floats,
        hidden_state_floats=hidden_state_floats,
        half_floats=half_floats,
    )


def check_response_size(
    shape: AnswerShape,
    cost: WireCost,
    model_name: str,
    settings: Settings,
    *,
    hint: str | None = None,
) -> float:
    """The answer's bytes (an upper bound); PayloadTooLarge (413) beyond ``max_response_bytes``,
    saying what to ask instead (``hint``, else what shrinks an encode answer)."""
    size = cost.bytes(shape, model_name)
    if size > settings.max_response_bytes:
        hint = hint or (
            (
                "select fewer attention layers or heads, reduce the attention (mean, max "
                "or rollout), "
                if shape.attention_floats
                else ""
            )
            + ("select fewer hidden-state layers, " if shape.hidden_state_floats else "")
            + "send fewer or shorter sequences, or ask for a more compact encoding (base64 "
            "or binary)"
        )
        raise PayloadTooLarge(
            f"the response would be up to {size:,.0f} bytes ({size / MB:.2f} MB: "
            f"{shape.floats:,} floats, {shape.attention_floats:,} of them attention); the "
            f"limit is {settings.max_response_bytes:,} bytes: {hint}"
        )
    return size


def work_bytes(
    lengths: list[int],
    cfg: EncoderConfig,
    attention: bool,
    hidden_states: bool,
    shape: AnswerShape,
    response_bytes: float,
    copies: float = 1.0,
    compact_keys: int | None = None,
    sorts_maps: bool = False,
    selected_maps: float | None = None,
) -> int:
    """The memory an admitted request holds at its peak, beyond its body.

    Its decoded inputs [n, d]; the model's outputs kept per sequence until the
    answer is built: the last hidden state, with attention every map [L, H, n, n]
    (that graph returns the hidden states too), or the selected-maps graph's
    ``selected_maps`` per sequence (a float16 map counts half), or from the compact
    graph each row's ``compact_keys`` values and indices and its summaries, with hidden
    states all L + 1 [n, d]; the answer's arrays; and its encoded bytes, times the copies its
    protocol makes while framing them (``WireCost.copies``). Selection and reduction
    work layer by layer (``postprocess``), so their scratch space is one layer's
    maps, within the outputs' count. Repeated indices are refused, so nothing a
    request names can multiply any of this.
    """
    tokens = sum(lengths)
    floats = 2 * tokens * cfg.d_model  # inputs and last_hidden_state
    if compact_keys is not None:  # the compact graph's outputs: k values, k indices, 6 stats
        floats += cfg.n_layers * cfg.n_heads * tokens * (2 * compact_keys + 6)
    elif attention:
        # Every map; cutting rows to their top keys in numpy sorts them (int64 order).
        per_sequence = cfg.n_layers * cfg.n_heads if selected_maps is None else selected_maps
        maps = int(per_sequence * sum(n * n for n in lengths))
        floats += 3 * maps if sorts_maps else maps
    full_graph = attention and compact_keys is None and selected_maps is None
    if full_graph or hidden_states:
        floats += (cfg.n_layers + 1) * tokens * cfg.d_model
    floats += shape.floats
    half_bytes = 2 * shape.half_floats  # float16 answer arrays hold 2 bytes, not 4
    return FLOAT32 * floats - half_bytes + int(response_bytes * copies)


def tokenizing_bytes(chars: list[int], model: ModelInfo) -> int:
    """The memory tokenizing texts of ``chars`` characters holds at most: one part's
    characters in flight and each text's tokens kept (at most a token per character,
    and ``max_seq_len`` of them: a longer text is cut, or refused once tokenized).
    Each text counts at most the characters ``bound_text`` lets the tokenizer see.
    Measured and explained at ``TOKENIZING_BYTES_PER_CHAR``."""
    seen = min(sum(min(n, model.max_seq_len * MAX_CHARS_PER_TOKEN) for n in chars), PART_CHARS)
    in_flight = seen * TOKENIZING_BYTES_PER_CHAR
    kept = sum(min(n, model.max_seq_len) + SPECIAL_TOKENS for n in chars)
    return in_flight + kept * KEPT_BYTES_PER_TOKEN
