"""A ``tokenizer.json`` for a checkpoint that has only a slow tokenizer's files.

Older BERT folders carry ``vocab.txt`` + ``tokenizer_config.json``, XLM-R and
CamemBERT a SentencePiece ``sentencepiece.bpe.model``: the server reads only a
``tokenizers`` file. The export converts them with transformers' fast conversion
(``AutoTokenizer.from_pretrained(folder, use_fast=True)``) and keeps the result only
if it tokenizes the probe texts (PROBE_TEXTS: sentences, accents, scripts, an emoji,
unknown words, alone and as pairs) into the same ids as the slow tokenizer: the
Python one of transformers (``use_fast=False`` before 5.x; ``BertTokenizerLegacy``
for WordPiece since), or SentencePiece itself (its pieces) for a ``.model`` file.

Where it cannot convert (transformers or sentencepiece missing, a tokenizer class
with no fast version, ids that differ) it says so in one warning line and the model
is exported without a tokenizer, as before: it then takes token ids only.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from tokenizers import Tokenizer

from model_export.graph_io import TOKENIZER_FILE
from model_export.hub import first_line
from model_export.quantize_sentences import sentences

log = logging.getLogger(__name__)

SENTENCEPIECE_FILES: Final = (
    "sentencepiece.bpe.model",
    "sentencepiece.model",
    "spiece.model",
    "spm.model",
    "tokenizer.model",
)
SLOW_FILES: Final = ("vocab.txt", "vocab.json", *SENTENCEPIECE_FILES)
# What the conversion is checked on: drawn sentences and text that tends to split
# tokenizers apart (case, accents, ligatures, scripts, an emoji, zero-width and control
# characters, digits, unknown words, runs of spaces); pairs as rerankers send them.
PROBE_SENTENCES, PROBE_SEED = 64, 11
PROBE_TEXTS: Final = (
    "A man is playing a guitar.",
    "Probe: qzxv-unknownword Xylophonist's naïve café, Größe, ﬁ, 東京 مرحبا 🙂\u200b end.",
    "HELLO World!! 3.14159 e-mail: someone@example.com; #hashtag (brackets) [ok]",
    "Ünïcödé  spaces\tand\nnewlines — dashes – and “quotes” ‘too’…",
    "Привет, мир. Γειά σου κόσμε. नमस्ते दुनिया. 안녕하세요 세계. こんにちは世界。",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "",
)
PROBE_PAIRS: Final = 16  # the first so many probe texts, each paired with the next


class Unconvertible(Exception):
    """Why a folder's slow tokenizer is not converted (said in one warning line)."""


def probe_texts() -> list[str]:
    return [*PROBE_TEXTS, *sentences(PROBE_SENTENCES, PROBE_SEED)]


def converted_tokenizer(root: Path, dest: Path) -> Path | None:
    """``dest/tokenizer.json`` converted from ``root``'s slow tokenizer files and checked
    on the probe texts; None (said in one warning line) when it cannot be, and None
    silently for a folder with no tokenizer files at all."""
    found = [name for name in SLOW_FILES if (root / name).is_file()]
    if not found:
        return None
    try:
        tokenizer = _convert(root, found)
    except Unconvertible as exc:
        log.warning(
            "%s has no tokenizer.json and its %s was not converted: %s; exported without a "
            "tokenizer (it takes token ids only)",
            root.name,
            found[0],
            exc,
        )
        return None
    path = dest / TOKENIZER_FILE
    tokenizer.save(str(path))
    log.info("converted %s's %s to %s", root.name, found[0], TOKENIZER_FILE)
    return path


Reference = Callable[[str, str | None], list[int] | list[str]]


def _convert(root: Path, found: Sequence[str]) -> Tokenizer:
    if importlib.util.find_spec("transformers") is None:
        raise Unconvertible("the conversion needs transformers (pip install transformers)")
    pieces = [name for name in found if name in SENTENCEPIECE_FILES]
    if pieces and importlib.util.find_spec("sentencepiece") is None:
        raise Unconvertible("the conversion needs sentencepiece (pip install sentencepiece)")
    from transformers import AutoTokenizer

    # transformers' own warnings about the conversion would be lines beside ours.
    transformers_log = logging.getLogger("transformers")
    quiet, transformers_log.disabled = transformers_log.disabled, True
    try:
        fast = AutoTokenizer.from_pretrained(str(root), use_fast=True)
    except Exception as exc:  # any failure of transformers' conversion is reported as such
        raise Unconvertible(f"transformers could not convert it: {first_line(exc)}") from None
    finally:
        transformers_log.disabled = quiet
    if not getattr(fast, "is_fast", False):
        raise Unconvertible(f"{type(fast).__name__} has no fast version")
    tokenizer = Tokenizer.from_str(fast.backend_tokenizer.to_str())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    reference, by_pieces = _reference(root, fast, pieces)
    texts = probe_texts()
    cases = [(t, None) for t in texts] + list(itertools.pairwise(texts[: PROBE_PAIRS + 1]))
    for text, pair in cases:
        if by_pieces:
            ours: list[int] | list[str] = tokenizer.encode(text, add_special_tokens=False).tokens
        else:
            ours = tokenizer.encode(text, pair).ids
        theirs = reference(text, pair)
        if ours != theirs:
            shown = text if pair is None else f"{text!r} + {pair!r}"
            raise Unconvertible(
                f"the converted tokenizer differs from the slow one on {shown!r}: "
                f"{ours[:12]} against {theirs[:12]}"
            )
    return tokenizer


def _reference(root: Path, fast: Any, pieces: Sequence[str]) -> tuple[Reference, bool]:
    """The slow tokenizer to check against, and whether it gives pieces (SentencePiece's
    own, compared without special tokens) rather than ids."""
    from transformers import AutoTokenizer

    try:
        slow = AutoTokenizer.from_pretrained(str(root), use_fast=False)
    except Exception:  # no slow class: the references below
        slow = None
    if slow is not None and not getattr(slow, "is_fast", True):  # transformers < 5
        return (lambda text, pair: list(slow(text, pair)["input_ids"])), False
    model = fast.backend_tokenizer.model.__class__.__name__
    if model == "WordPiece" and (root / "vocab.txt").is_file():
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

        legacy = BertTokenizerLegacy.from_pretrained(str(root))
        return (lambda text, pair: list(legacy(text, pair)["input_ids"])), False
    if pieces:
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=str(root / pieces[0]))
        return (lambda text, pair: list(processor.encode(text, out_type=str))), True
    raise Unconvertible(f"no slow tokenizer to check {type(fast).__name__}'s conversion against")
