"""Long runs cut out of a text before a BERT-style tokenizer sees it, tokens unchanged.

For a WordPiece tokenizer behind BERT's normalizer and pre-tokenizer, two kinds of run
never change the tokens however long they are: whitespace (word boundaries, dropped) and
letters and digits outside the CJK blocks (one pre-token; past the model's
``max_input_chars_per_word`` it is a single ``[UNK]``). Each run longer than ``keep``
characters (``max_input_chars_per_word`` + 1) keeps its first ``keep``: an unbroken
30,000,000-character "x" becomes 101 of them, tokenized in microseconds instead of 20 s
and a gigabyte of the tokenizer's offset tables. Only as much of the text is read as the
condensed text needs (``budget``), a run's end found by a plain character-class scan.

``BoundedText.origin`` maps an offset in the condensed text back to the original, so
offsets (late-chunking spans, /v1/tokenize spans) stay the caller's.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

# Letters and digits (Python's \w without "_", which BERT counts as punctuation) outside
# the blocks BERT's normalizer splits into one-character words (``is_chinese_char``).
_CJK = (
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\U00020000-\U0002a6df\U0002a700-\U0002ceaf\U0002f800-\U0002fa1f"
)
_WORD = rf"[^\W_{_CJK}]"
_NOT_WORD = re.compile(rf"[\W_{_CJK}]")
_SPACE = "[ \t\n\r]"
_NOT_SPACE = re.compile(r"[^ \t\n\r]")


# A run's end is looked for this many characters at a time.
_CHUNK = 1 << 16


def _run_end(text: str, pos: int, *, space: bool) -> int:
    """Where the run of whitespace (``space``) or word characters at ``pos`` ends: a
    chunk of only ASCII letters and digits, or only whitespace, is passed at C speed."""
    while pos < len(text):
        chunk = text[pos : pos + _CHUNK]
        whole = not chunk.strip(" \t\n\r") if space else chunk.isascii() and chunk.isalnum()
        if not whole:
            stop = (_NOT_SPACE if space else _NOT_WORD).search(chunk)
            if stop is not None:
                return pos + stop.start()
        pos += len(chunk)
    return len(text)


@dataclass(frozen=True)
class BoundedText:
    """The text a tokenizer is given, and where its pieces lie in the caller's text:
    piece k starts at ``starts[k]`` here and at ``origins[k]`` there."""

    text: str
    starts: tuple[int, ...] = (0,)
    origins: tuple[int, ...] = (0,)
    # Runs keep their first characters (False) or, condensed from the end, their last.
    from_end: bool = False

    def origin(self, offset: int) -> int:
        """The caller's offset of ``offset`` in ``text``. A boundary between pieces is a
        cut run's end (kept first characters) or its start (kept last): the edge of the
        [UNK] that spans the run, or of the word beside cut whitespace."""
        k = bisect_right(self.starts, offset) - 1
        if self.from_end and k > 0 and offset == self.starts[k]:
            k -= 1
        return self.origins[k] + offset - self.starts[k]

    def sliced(self, begin: int, end: int) -> BoundedText:
        """``text[begin:end]`` with its origins."""
        first = bisect_right(self.starts, begin) - 1
        last = bisect_right(self.starts, end - 1) if end > begin else first + 1
        starts = [0] + [s - begin for s in self.starts[first + 1 : last]]
        shifted = self.origins[first] + begin - self.starts[first]
        origins = [shifted, *self.origins[first + 1 : last]]
        return BoundedText(self.text[begin:end], tuple(starts), tuple(origins), self.from_end)


def condense(text: str, keep: int, budget: int, *, from_end: bool = False) -> BoundedText:
    """``text`` with every run of over ``keep`` letters-and-digits or whitespace cut to
    its first ``keep`` (with ``from_end``: its last), read from the start (the end) until
    the result holds ``budget`` characters or the whole text; shorter than ``budget``
    only when whole."""
    if from_end:
        reverse = condense(text[::-1], keep, budget)
        n, size = len(text), len(reverse.text)
        # A piece [s, e) of the reversed result is [size - e, size - s) here, from n - o - (e - s).
        ends = [*reverse.starts[1:], size]
        pieces = sorted(
            (size - e, n - o - (e - s))
            for s, e, o in zip(reverse.starts, ends, reverse.origins, strict=True)
        )
        return BoundedText(
            reverse.text[::-1], tuple(s for s, _ in pieces), tuple(o for _, o in pieces), True
        )
    run = re.compile(rf"{_WORD}{{{keep + 1},}}|{_SPACE}{{{keep + 1},}}")
    parts: list[str] = []
    starts, origins = [0], [0]
    pos = produced = 0
    while pos < len(text) and produced < budget:
        end = min(len(text), pos + budget - produced)
        found = run.search(text, pos, end)
        if found is None:
            parts.append(text[pos:end])
            produced += end - pos
            pos = end
            continue
        resume = _run_end(text, found.end(), space=found.group()[0].isspace())
        kept = found.start() + keep
        parts.append(text[pos:kept])
        produced += kept - pos
        pos = resume
        starts.append(produced)  # (a run cut at the text's end leaves an empty piece)
        origins.append(pos)
    return BoundedText("".join(parts), tuple(starts), tuple(origins))
