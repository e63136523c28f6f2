"""The engine's text front end: every rule of text and token ids, in one place.

Texts are bounded (by characters, then by the tokens of a prefix: see
``limits.bound_text``), tokenized by the model's own tokenizer and their lengths
checked; token ids must be the model's own; spans (late chunking) become token
indices; ids decode back to text. Nothing here runs a graph: a tokenized text
becomes (token id, token type) pairs, which the batcher embeds or runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from service.condense import BoundedText
from service.engine import codec_guard, limits
from service.engine.types import (
    DecodeRequest,
    DecodeResult,
    InputItem,
    Pooling,
    SpannedText,
    TokenizedText,
    TokenizeRequest,
    TokenizeResult,
)
from service.errors import InvalidInput, UnsupportedByModel
from service.model_info import ModelInfo
from service.runtime import ModelRuntime
from service.settings import Settings
from service.tokenizer import Between, TextFrontEnd

# Out-of-vocabulary token ids named in an error, at most.
SHOWN_IDS = 10

# A text's (tokens, ids, type ids), as the tokenizer gives them.
Tokenized = tuple[list[str], list[int], list[int]]


def text_of(item: str | SpannedText) -> str:
    return item.text if isinstance(item, SpannedText) else item


def prompt_of(info: ModelInfo, prompt_name: str | None, prompt: str | None) -> str:
    """The text prepended to each text input, as sentence-transformers' ``encode`` does:
    the caller's ``prompt``, else the model's prompt named ``prompt_name``, else the
    model's default prompt, else none. 422 for both, or a name the model lacks."""
    manifest = info.manifest
    if prompt is not None:
        if prompt_name is not None:
            raise InvalidInput("give prompt or prompt_name, not both", field=("prompt",))
        return prompt
    if prompt_name is None:
        default = manifest.default_prompt_name
        return "" if default is None else manifest.prompts[default]
    if prompt_name not in manifest.prompts:
        known = ", ".join(map(repr, manifest.prompts)) or "none"
        raise InvalidInput(
            f"model {info.name!r} has no prompt named {prompt_name!r} (its prompts: {known})",
            field=("prompt_name",),
        )
    return manifest.prompts[prompt_name]


def prompt_length(runtime: ModelRuntime, prompt: str) -> int:
    """The tokens a prompt takes at the start of a prompted text, counted as
    sentence-transformers counts them for ``include_prompt: false``: the prompt
    tokenized alone (special tokens included, cut to the model's length), less a
    trailing special token ([SEP]). So [CLS] counts as the prompt's."""
    tokenizer = front_end(runtime)
    ((tokens, _, _),) = tokenizer.tokenize([prompt], truncate=True)
    return len(tokens) - (1 if tokens and tokens[-1] in tokenizer.special_tokens else 0)


def bound(
    runtime: ModelRuntime, texts: dict[int, str], truncate: bool, field: str, *, left: bool = False
) -> dict[int, BoundedText]:
    """Texts by their index in the request's ``field``, bounded before tokenizing (422
    for a model without a tokenizer), their tokenizing priced first (``priced``) and
    the request's stop check run before each."""
    if not texts:
        return {}
    tokenizer = front_end(runtime)
    between = priced(runtime.info, [len(text) for text in texts.values()])
    found = {}
    for i, text in texts.items():
        if between is not None:
            between()
        found[i] = limits.bound_text(text, runtime.info, truncate, (field, i), tokenizer, left=left)
    return found


def priced(info: ModelInfo, chars: list[int]) -> Between:
    """For a request's work on a codec thread (``codec_guard``): its ticket holds what
    tokenizing texts of ``chars`` characters costs (``limits.tokenizing_bytes``: 429
    when the memory budget lacks it now, 413 beyond all of it) before any is tokenized,
    and the request's stop check comes back, to run between parts. None with no
    request behind the work."""
    guard = codec_guard.current.get()
    if guard is None:
        return None
    guard.hold(limits.tokenizing_bytes(chars, info), "tokenizing this request's texts")
    return guard.check


def stop_check() -> Between:
    """The request's stop check for tokenizing already priced (``priced``), if any."""
    guard = codec_guard.current.get()
    return None if guard is None else guard.check


def front_end(runtime: ModelRuntime) -> TextFrontEnd:
    """The model's tokenizer (422 for a model without one)."""
    if runtime.text is None:
        raise UnsupportedByModel(
            f"model {runtime.info.name!r} has no tokenizer: send token embeddings as arrays, "
            "or use a model exported from a checkpoint with a tokenizer (e.g. minilm-l6)"
        )
    return runtime.text


def tokenize(
    runtime: ModelRuntime,
    bounded: dict[int, BoundedText],
    truncate: bool,
    *,
    special_tokens: bool = True,
    left: bool = False,
) -> dict[int, Tokenized]:
    """Bounded texts (``bound``) tokenized, by the same index. Their lengths are the
    caller's to check, beside any other inputs of the request."""
    if not bounded:
        return {}
    found = front_end(runtime).tokenize(
        [b.text for b in bounded.values()],
        truncate=truncate,
        special_tokens=special_tokens,
        left=left,
        between=stop_check(),
    )
    return dict(zip(bounded, found, strict=True))


def tokenize_all(
    runtime: ModelRuntime,
    texts: list[str],
    truncate: bool,
    field: str,
    settings: Settings,
    *,
    pooled_only: bool,
    special_tokens: bool = True,
    left: bool = False,
) -> tuple[list[BoundedText], list[Tokenized]]:
    """A request made only of texts: counted, bounded, tokenized, every length checked.
    The bounded texts are handed back beside their tokens."""
    limits.check_sequence_count(len(texts), settings, pooled_only=pooled_only)
    bounded = bound(runtime, dict(enumerate(texts)), truncate, field, left=left)
    found = tokenize(runtime, bounded, truncate, special_tokens=special_tokens, left=left)
    encoded = [found[i] for i in range(len(texts))]
    lengths: list[int | None] = [len(tokens) for tokens, _, _ in encoded]
    limits.check_lengths(lengths, runtime.info, settings, field, pooled_only=pooled_only)
    return [bounded[i] for i in range(len(texts))], encoded


def id_pairs(token_ids: list[int], type_ids: list[int] | None = None) -> np.ndarray:
    """An id-taking graph's input for one sequence: int64 [n, 2] of (token id, type);
    type 0 throughout when not given (bare token ids)."""
    pair = np.zeros((len(token_ids), 2), dtype=np.int64)
    pair[:, 0] = token_ids
    if type_ids is not None:
        pair[:, 1] = type_ids
    return pair


def check_type_ids(
    info: ModelInfo, ids: dict[int, list[int]], types: dict[int, list[int] | None]
) -> None:
    """Token types, where given, one per token and in the model's type vocabulary."""
    front_end = info.manifest.text
    assert front_end is not None  # check_token_ids came first
    for i, given in types.items():
        if given is None:
            continue
        if len(given) != len(ids[i]) or not all(0 <= t < front_end.type_vocab_size for t in given):
            raise InvalidInput(
                f"needs one token type per token, each in 0..{front_end.type_vocab_size - 1}",
                field=("inputs", i),
            )


def check_token_ids(info: ModelInfo, ids: dict[int, list[int]], field: str = "inputs") -> None:
    """Token ids must be the model's own: it has a tokenizer and each id is in range."""
    text = info.manifest.text
    if text is None or not info.has_tokenizer:
        raise UnsupportedByModel(
            f"model {info.name!r} has no tokenizer, so it has no token ids: send token "
            "embeddings as arrays"
        )
    for i, seq in ids.items():
        if not seq:
            raise InvalidInput("holds no token ids", field=(field, i))
        bad = sorted({t for t in seq if not 0 <= t < text.vocab_size})
        if bad:
            shown = ", ".join(map(str, bad[:SHOWN_IDS])) + (", ..." if len(bad) > SHOWN_IDS else "")
            raise InvalidInput(
                f"token ids {shown} are outside the vocabulary of model {info.name!r} "
                f"(0..{text.vocab_size - 1}): send ids of this model's own tokenizer "
                "(e.g. from /v1/tokenize), or send text",
                field=(field, i),
            )


def span_tokens(
    runtime: ModelRuntime,
    inputs: list[InputItem],
    truncate: bool,
    pooling: Pooling,
    prompt: str = "",
    *,
    left: bool = False,
) -> list[list[list[int]] | None]:
    """Late chunking: per input, the tokens of each span (those whose first character
    lies inside it, special tokens excluded; spans count characters of the text, after
    any ``prompt``); None for inputs without spans."""
    spanned = {i: item for i, item in enumerate(inputs) if isinstance(item, SpannedText)}
    found: list[list[list[int]] | None] = [None] * len(inputs)
    if not spanned:
        return found
    if pooling not in ("mean", "max"):
        raise InvalidInput(
            "spans are pooled per chunk: set pooling to mean or max",
            field=("inputs", next(iter(spanned)), "spans"),
        )
    tokenizer = front_end(runtime)
    between = priced(runtime.info, [len(prompt) + len(item.text) for item in spanned.values()])
    texts = []
    for item in spanned.values():
        if between is not None:
            between()
        texts.append(
            limits.bound_text(prompt + item.text, runtime.info, truncate, (), tokenizer, left=left)
        )
    token_spans = tokenizer.token_spans(
        [b.text for b in texts], truncate=truncate, left=left, between=between
    )
    for (i, item), spans, bounded in zip(spanned.items(), token_spans, texts, strict=True):
        starts = [None if span is None else bounded.origin(span[0]) - len(prompt) for span in spans]
        per_span = []
        for k, (begin, end) in enumerate(item.spans):
            held = [t for t, c in enumerate(starts) if c is not None and begin <= c < end]
            if not held:
                raise InvalidInput(
                    f"span [{begin}, {end}) holds no token (only whitespace, or beyond "
                    "the truncated text)",
                    field=("inputs", i, "spans", k),
                )
            per_span.append(held)
        found[i] = per_span
    return found


def tokenize_texts(
    runtime: ModelRuntime, request: TokenizeRequest, settings: Settings
) -> tuple[TokenizeResult, list[np.ndarray]]:
    """``/v1/tokenize`` without embeddings, and the id pairs to embed if it asks for them
    (its answer's size checked first: 413 before any graph runs)."""
    info = runtime.info
    if not request.texts:
        raise InvalidInput("is empty: send at least one string", field=("texts",))
    # Tokens alone are a small answer (like pooled vectors): the larger limits apply.
    small = not request.return_embeddings
    left = request.truncation_direction == "left"
    bounded, encoded = tokenize_all(
        runtime,
        request.texts,
        request.truncate,
        "texts",
        settings,
        pooled_only=small,
        special_tokens=request.special_tokens,
        left=left,
    )
    to_embed: list[np.ndarray] = []
    if request.return_embeddings:
        shape = limits.answer_shape(
            [len(tokens) for tokens, _, _ in encoded],
            info.config.d_model,
            attention=None,
            embeddings=True,
            pooled_width=None,
            tokens=[tokens for tokens, _, _ in encoded],
        )
        limits.check_response_size(shape, request.wire_cost, info.name, settings)
        to_embed = [id_pairs(ids, types) for _, ids, types in encoded]
    spans: list[list[tuple[int, int] | None] | None] = [None] * len(encoded)
    if request.spans:
        found = front_end(runtime).token_spans(
            [b.text for b in bounded],
            truncate=request.truncate,
            special_tokens=request.special_tokens,
            left=left,
            between=stop_check(),
        )
        spans = [
            [None if s is None else (b.origin(s[0]), b.origin(s[1])) for s in each]
            for b, each in zip(bounded, found, strict=True)
        ]
    texts = [
        TokenizedText(tokens, ids, None, span)
        for (tokens, ids, _), span in zip(encoded, spans, strict=True)
    ]
    return TokenizeResult(info.name, texts), to_embed


def with_embeddings(result: TokenizeResult, embedded: list[np.ndarray]) -> TokenizeResult:
    """``result`` with each text's input embeddings [n, d]."""
    texts = [
        dataclasses.replace(item, embeddings=emb)
        for item, emb in zip(result.items, embedded, strict=True)
    ]
    return dataclasses.replace(result, items=texts)


def decode(runtime: ModelRuntime, request: DecodeRequest, settings: Settings) -> DecodeResult:
    """Token ids back to text, each list checked as the model's own ids."""
    info = runtime.info
    if not request.ids:
        raise InvalidInput("is empty: send at least one list of ids", field=("ids",))
    limits.check_sequence_count(len(request.ids), settings, pooled_only=True)
    limits.check_lengths([len(ids) for ids in request.ids], info, settings, "ids", pooled_only=True)
    check_token_ids(info, dict(enumerate(request.ids)), field="ids")
    return DecodeResult(
        info.name, front_end(runtime).decode(request.ids, skip_special_tokens=request.skip)
    )


# -- the requests ---------------------------------------------------------------------------
