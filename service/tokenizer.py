"""A model's text front end: its tokenizer (the ``tokenizers`` package) and BM42's
stopwords, apart from the onnxruntime sessions (``runtime.py``).

Two instances of the tokenizer, so no request ever flips shared truncation
state; a probe at load proves it can encode and decode (else the model never
becomes ready). Its errors are the model's: a text it cannot take is a 422
naming the model, never a 500.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tokenizers import Encoding, Tokenizer

from service.condense import BoundedText, condense
from service.errors import InvalidInput, ModelLoadError
from service.model_info import ModelInfo, cannot_load

# Tokenized at load (both ways) before a model with a tokenizer may serve: words no
# vocabulary holds, accents, scripts, an emoji, control and zero-width characters.
PROBE_TEXT = (
    "Probe: qzxv-unknownword Xylophonist's naïve café, Größe, ﬁ, 東京 مرحبا 🙂\u200b\t\x00 end."
)

# The most characters one ``encode_batch`` call takes (a text longer takes a call of its
# own; ``limits.bound_text`` bounds each): a request's texts are tokenized in parts of
# this size, its ``between`` check run before each, so a request already answered (504,
# caller gone) stops within a part (~0.1-0.3 s on one core) and frees its codec slot.
# The memory priced for a request's tokenizing in flight is this many characters'
# (``limits.tokenizing_bytes``).
PART_CHARS = 1_000_000

# Run before each part of a tokenizing: raises to stop it (the request is gone).
Between = Callable[[], None] | None
Item = TypeVar("Item", str, tuple[str, str])  # a text, or a query-document pair


def in_parts(items: Sequence[Item], between: Between) -> Iterator[list[Item]]:
    """Consecutive parts of ``items`` (texts or pairs of them) of at most ``PART_CHARS``
    characters (or one item), ``between()`` run before each is handed out."""
    part: list[Item] = []
    chars = 0
    for item in items:
        size = len(item) if isinstance(item, str) else sum(map(len, item))
        if part and chars + size > PART_CHARS:
            if between is not None:
                between()
            yield part
            part, chars = [], 0
        part.append(item)
        chars += size
    if part:
        if between is not None:
            between()
        yield part


# The largest tokenizer and stopword files read (XLM-R's tokenizer.json is 17 MB).
MAX_TOKENIZER_BYTES = 64 << 20
MAX_STOPWORDS_BYTES = 1 << 20


@dataclass(frozen=True)
class PairEncoding:
    """A query-document pair as one sequence, and where each text's tokens lie."""

    tokens: list[str]
    ids: list[int]
    type_ids: list[int]
    query: tuple[int, int]  # [start, end) of the query's tokens
    document: tuple[int, int]  # of the document's (empty if truncation left none)


def _span(sequence_ids: list[int | None], which: int) -> tuple[int, int]:
    """[start, end) of the tokens of sequence ``which`` (they are contiguous)."""
    at = [i for i, s in enumerate(sequence_ids) if s == which]
    return (at[0], at[-1] + 1) if at else (0, 0)


def _char_span(offsets: list[tuple[int, int]], chars: tuple[int, int]) -> tuple[int, int]:
    """[start, end) of the tokens overlapping the characters ``chars`` (contiguous): a
    byte-level token's offsets take in the space before its word, which the template
    may hold ("<Document>: " + "the" is "Ġthe")."""
    at = [i for i, (begin, end) in enumerate(offsets) if begin < chars[1] and end > chars[0]]
    return (at[0], at[-1] + 1) if at else (0, 0)


def _run_length_kept(tokenizer: Tokenizer) -> int | None:
    """How many characters of a long run of letters or whitespace keep a text's tokens
    (``service.condense``): WordPiece's ``max_input_chars_per_word`` + 1, for a
    WordPiece model behind BERT's pre-tokenizer (and normalizer, if any) whose added
    tokens cannot sit inside such a run; None for any other tokenizer."""
    config = json.loads(tokenizer.to_str())
    model, normalizer = config.get("model") or {}, config.get("normalizer")
    pre_tokenizer = config.get("pre_tokenizer") or {}
    longest = model.get("max_input_chars_per_word")
    if (
        model.get("type") != "WordPiece"
        or not isinstance(longest, int)
        or pre_tokenizer.get("type") != "BertPreTokenizer"
        or (normalizer is not None and normalizer.get("type") != "BertNormalizer")
    ):
        return None
    edge = re.compile(r"[^\w\s]")
    for token in config.get("added_tokens") or []:
        content = str(token.get("content", ""))
        if len(content) > longest or not (edge.match(content) and edge.match(content[-1])):
            return None
    return longest + 1


class TextFrontEnd:
    """Tokenize, bound by prefix, map tokens to characters, decode."""

    def __init__(self, info: ModelInfo, source: str, stopwords: frozenset[str]) -> None:
        """``source``: the tokenizer's JSON, as verified (``ModelInfo.read``)."""
        self.info = info
        self.stopwords = stopwords  # words left out of BM42 vectors
        self._tokenizer = self._load_tokenizer(info, source, None)
        self.special_tokens = frozenset(  # [CLS], [SEP], [PAD], ...
            token.content
            for token in self._tokenizer.get_added_tokens_decoder().values()
            if token.special
        )
        self._keep_runs = _run_length_kept(self._tokenizer)
        self._truncating = self._load_tokenizer(info, source, info.max_seq_len)
        self._truncating_left = self._load_tokenizer(info, source, info.max_seq_len, left=True)
        # Query-document pairs (rerankers): the document is cut first, never the query.
        self._pairs = {
            left: self._load_tokenizer(info, source, info.max_seq_len, left=left, pairs=True)
            for left in (False, True)
        }

    @classmethod
    def load(cls, info: ModelInfo) -> TextFrontEnd | None:
        """The front end of a model whose manifest names a tokenizer (None otherwise),
        probed before it may serve."""
        text = info.manifest.text
        if text is None or text.tokenizer is None:
            return None
        stopwords: frozenset[str] = frozenset()
        if text.stopwords is not None:
            words = info.read(text.stopwords, MAX_STOPWORDS_BYTES).decode("utf-8", "replace")
            stopwords = frozenset(words.split())
        source = info.read(text.tokenizer, MAX_TOKENIZER_BYTES).decode("utf-8", "replace")
        front_end = cls(info, source, stopwords)
        front_end._probe(text.vocab_size)
        return front_end

    @staticmethod
    def _load_tokenizer(
        info: ModelInfo,
        source: str,
        truncate_at: int | None,
        *,
        left: bool = False,
        pairs: bool = False,
    ) -> Tokenizer:
        try:
            tokenizer = Tokenizer.from_str(source)
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            assert info.manifest.text is not None and info.manifest.text.tokenizer is not None
            raise cannot_load(info, info.path, info.manifest.text.tokenizer, exc) from exc
        tokenizer.no_padding()
        if truncate_at is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(
                max_length=truncate_at,
                direction="left" if left else "right",
                strategy="only_second" if pairs else "longest_first",
            )
        return tokenizer

    def _probe(self, vocab_size: int) -> None:
        """Encode PROBE_TEXT both ways at load: a tokenizer that loads but cannot encode
        (its unknown-word token missing from its vocabulary) or gives ids beyond the
        embedding table would fail every request; such a model never becomes ready.
        Every id its vocabulary holds (added tokens too) must be within ``vocab_size``:
        a token the probe never meets would fail each request that holds it."""
        vocabulary = self._tokenizer.get_vocab(with_added_tokens=True)
        token, top = max(vocabulary.items(), key=lambda entry: entry[1], default=("", 0))
        if top >= vocab_size:
            raise ModelLoadError(
                f"model {self.info.name!r}: its tokenizer holds token {token[:40]!r} with id "
                f"{top}, beyond the vocabulary of {vocab_size} (config.json text.vocab_size)"
            )
        try:
            for truncate, left in ((False, False), (True, False), (True, True)):
                for _, ids, _ in self.tokenize([PROBE_TEXT, ""], truncate=truncate, left=left):
                    beyond = [i for i in ids if not 0 <= i < vocab_size]
                    if beyond:
                        raise ModelLoadError(
                            f"model {self.info.name!r}: its tokenizer gives token id "
                            f"{beyond[0]}, beyond the vocabulary of {vocab_size}"
                        )
                self.token_spans([PROBE_TEXT], truncate=truncate, left=left)
            self.decode([[0]], skip_special_tokens=True)
        except InvalidInput as exc:
            raise ModelLoadError(f"model {self.info.name!r}: {exc.message}") from exc

    def _tokenizer_for(self, truncate: bool, left: bool = False) -> Tokenizer:
        if not truncate:
            return self._tokenizer
        return self._truncating_left if left else self._truncating

    def tokenize(
        self,
        texts: list[str],
        *,
        truncate: bool,
        special_tokens: bool = True,
        left: bool = False,
        between: Between = None,
    ) -> list[tuple[list[str], list[int], list[int]]]:
        """Texts -> (tokens, ids, type ids) each, special tokens included unless
        ``special_tokens`` is false; ``truncate`` keeps the first tokens, or with ``left``
        the last. Tokenized in parts (``in_parts``), ``between()`` before each."""
        encoded = self._encoded(texts, truncate, left, special_tokens, between)
        return [(e.tokens, e.ids, e.type_ids) for e in encoded]

    def _encoded(
        self, texts: list[str], truncate: bool, left: bool, special_tokens: bool, between: Between
    ) -> Iterator[Encoding]:
        """Each text's Encoding, tokenized a part at a time (a part's dropped once read)."""
        tokenizer = self._tokenizer_for(truncate, left)
        for part in in_parts(texts, between):
            with self._tokenizer_errors():
                encoded = tokenizer.encode_batch(part, add_special_tokens=special_tokens)
            yield from encoded

    def tokenize_pairs(
        self,
        pairs: list[tuple[str, str]],
        *,
        truncate: bool,
        left: bool = False,
        between: Between = None,
    ) -> list[PairEncoding]:
        """(query, document) pairs as the model's tokenizer pairs them (its post-processor's
        pair template: [CLS] q [SEP] d [SEP], token types 0 then 1 where the model has
        them); ``truncate`` cuts each document (from its end, or with ``left`` its start)
        so the pair fits max_seq_len, never the query. Callers check that the query
        alone fits (``pair_overhead``). In parts, ``between()`` before each."""
        tokenizer = self._pairs[left] if truncate else self._tokenizer
        found: list[PairEncoding] = []
        for part in in_parts(pairs, between):
            with self._tokenizer_errors():
                encoded = tokenizer.encode_batch(part)
            found.extend(
                PairEncoding(
                    e.tokens, e.ids, e.type_ids, _span(e.sequence_ids, 0), _span(e.sequence_ids, 1)
                )
                for e in encoded
            )
        return found

    def tokenize_templated(
        self,
        texts: list[tuple[str, tuple[int, int], tuple[int, int]]],
        *,
        between: Between = None,
    ) -> list[PairEncoding]:
        """Prompts filled in from a template (an LLM reranker's), each with its query's
        and document's characters: each whole text tokenized as transformers tokenizes a
        rendered chat template (no special tokens added: the template holds them), not
        truncated, the query's and document's tokens found by their characters.
        In parts, ``between()`` before each."""
        found: list[PairEncoding] = []
        for part in in_parts([text for text, _, _ in texts], between):
            with self._tokenizer_errors():
                encoded = self._tokenizer.encode_batch(part, add_special_tokens=False)
            spans = texts[len(found) : len(found) + len(part)]
            found.extend(
                PairEncoding(
                    e.tokens,
                    e.ids,
                    [0] * len(e.ids),
                    _char_span(e.offsets, query),
                    _char_span(e.offsets, document),
                )
                for e, (_, query, document) in zip(encoded, spans, strict=True)
            )
        return found

    def condense(self, text: str, budget: int, *, from_end: bool = False) -> BoundedText:
        """At least ``budget`` characters of ``text`` from its start (``from_end``: its
        end) with the same tokens, or the whole text if shorter: long runs of letters or
        whitespace cut short where this tokenizer is BERT's (``condense``), else a slice."""
        if self._keep_runs is not None:
            return condense(text, self._keep_runs, budget, from_end=from_end)
        if not from_end:
            return BoundedText(text[:budget])
        piece = text[-budget:]
        return BoundedText(piece, (0,), (len(text) - len(piece),), True)

    def tokens_of_ids(self, ids: list[int]) -> list[str]:
        """The vocabulary's token for each id (SPLADE's dimensions)."""
        return [self._tokenizer.id_to_token(i) or f"[{i}]" for i in ids]

    @functools.cached_property
    def longest_tokens_chars(self) -> list[int]:
        """At k: the characters of the vocabulary's k longest tokens, as ``tokens_of_ids``
        names them (what k of them can cost written out), computed once."""
        text = self.info.manifest.text
        vocab = 0 if text is None else text.vocab_size
        lengths = sorted(map(len, self.tokens_of_ids(list(range(vocab)))), reverse=True)
        return [0, *itertools.accumulate(lengths)]

    def pair_overhead(self) -> int:
        """The special tokens a pair adds ([CLS] and two [SEP]; XLM-R's four)."""
        return self._tokenizer.num_special_tokens_to_add(is_pair=True)

    def final_tokens(self, piece: str, *, from_end: bool = False) -> int:
        """Tokens of a prefix ``piece`` (specials excluded) that no continuation of it can
        change: those of its words before the last, which may be cut; ``from_end``: of a
        suffix, those of its words after the first. Words are the pre-tokenizer's; a
        tokenizer without one has a single word, so none are final."""
        with self._tokenizer_errors():
            words = self._tokenizer_for(False).encode(piece, add_special_tokens=False).word_ids
        known = [w for w in words if w is not None]
        if not known:
            return 0
        if from_end:
            first = min(known)
            return sum(1 for w in known if w > first)
        last = max(known)
        return sum(1 for w in known if w < last)

    def token_spans(
        self,
        texts: list[str],
        *,
        truncate: bool,
        special_tokens: bool = True,
        left: bool = False,
        between: Between = None,
    ) -> list[list[tuple[int, int] | None]]:
        """Each token's [start, stop) characters in its text; None for special tokens.
        The same tokenization as ``tokenize`` (late chunking: which tokens a span
        holds; TEI's /tokenize: where each token came from), in parts likewise."""
        return [
            [
                None if special else offsets
                for offsets, special in zip(e.offsets, e.special_tokens_mask, strict=True)
            ]
            for e in self._encoded(texts, truncate, left, special_tokens, between)
        ]

    def decode(self, ids: list[list[int]], *, skip_special_tokens: bool) -> list[str]:
        """Token ids -> text, one string per sequence."""
        tokenizer = self._tokenizer_for(False)
        with self._tokenizer_errors():
            return list(tokenizer.decode_batch(ids, skip_special_tokens=skip_special_tokens))

    @contextlib.contextmanager
    def _tokenizer_errors(self) -> Iterator[None]:
        """The tokenizers package raises bare Exceptions (e.g. "Missing [UNK] token from
        the vocabulary"): the model cannot take this text, a 422 naming it, never a 500."""
        try:
            yield
        except Exception as exc:
            raise InvalidInput(
                f"the tokenizer of model {self.info.name!r} cannot encode or decode this input: "
                f"{str(exc)[:200]}"
            ) from exc
