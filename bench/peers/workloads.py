"""The peers' workloads and their inputs: the same for every contender, seeded."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_WORDS = (  # T1's sentences are drawn from these, seeded: the same texts every run
    "the a model server request token attention layer query key value batch queue "
    "thread socket answer sentence vector embedding fast slow small large network memory "
    "cache round latency throughput machine core graph export weight tensor shape text "
    "river mountain city music garden window morning evening coffee train book paper "
    "quietly quickly carefully often never always under over between within across"
)
WORDS = tuple(_WORDS.split())


@dataclass(frozen=True)
class Workload:
    """One request shape at one concurrency; ``seq`` 0 with ``ragged``: 8..max tokens;
    ``text``: ``batch`` sentences per request (T1), or one query text (T2, T2L)."""

    key: str
    title: str
    batch: int
    seq: int
    concurrency: int
    attention: bool = False
    ragged: bool = False
    text: bool = False


WORKLOADS = (
    Workload("W1", "[1,16] c=1", 1, 16, 1),
    Workload("W2", "[1,16] c=32", 1, 16, 32),
    Workload("W3", "[8,128] c=16", 8, 128, 16),
    Workload("W4", "[1,128] + attention (reduce none) c=8", 1, 128, 8, attention=True),
    Workload("R", "[8, ragged 8–{max}] c=4", 8, 0, 4, ragged=True),
    Workload("T1", "text, 32 sentences c=4", 32, 0, 4, text=True),
    Workload("T2", "query: one text per request c=32", 1, 0, 32, text=True),
    Workload("T2L", "query: one text per request c=1 (latency)", 1, 0, 1, text=True),
)
QUERIES = 3000  # T2's held set: this many different texts, each sent as one request
QUERY_WORDS = (6, 30)  # words per query text, both ends included


def query_texts(n: int = QUERIES, seed: int = 46) -> list[str]:
    """T2's held set: ``n`` different texts of 6–30 words drawn from ``WORDS`` by a seeded
    generator (the same texts every run, nothing downloaded), in a fixed order."""
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    seen: set[str] = set()
    while len(texts) < n:  # bounded: a repeat among 75^6+ word strings is all but impossible
        size = int(rng.integers(QUERY_WORDS[0], QUERY_WORDS[1] + 1))
        text = " ".join(rng.choice(WORDS, size=size)).capitalize() + "?"
        if text not in seen:
            seen.add(text)
            texts.append(text)
    return texts


@dataclass
class Inputs:
    """The same inputs for every contender: token-embedding sequences or text batches."""

    seqs: dict[str, list[np.ndarray]]  # workload key -> sequences [n_i, d_model]
    texts: list[list[str]]  # T1: a few batches, sent in turn (no peer can cache one answer)
    ids: dict[str, np.ndarray]  # in-process graph comparison: token ids [B, T]
    queries: list[str] = field(default_factory=list)  # T2: one text per request, all different


def make_inputs(d_model: int, max_seq: int, vocab: int) -> Inputs:
    rng = np.random.default_rng(0)
    seqs: dict[str, list[np.ndarray]] = {}
    for w in WORKLOADS:
        if w.text:
            continue
        lengths = (
            sorted(rng.integers(8, max_seq + 1, size=w.batch).tolist(), reverse=True)
            if w.ragged
            else [w.seq] * w.batch
        )
        seqs[w.key] = [rng.standard_normal((n, d_model), dtype=np.float32) for n in lengths]
    texts = [
        [
            " ".join(rng.choice(WORDS, size=int(rng.integers(6, 30)))).capitalize() + "."
            for _ in range(32)
        ]
        for _ in range(4)
    ]
    ids = {
        f"[{b},{t}]": rng.integers(1000, vocab, size=(b, t)).astype(np.int64)
        for b, t in ((1, 16), (16, 16), (8, 128))
        if t <= max_seq and vocab > 1000
    }
    return Inputs(seqs, texts, ids, query_texts())


def padded(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[B, T, d] zero-padded and its int64 mask."""
    longest = max(len(s) for s in seqs)
    embeds = np.zeros((len(seqs), longest, seqs[0].shape[1]), dtype=np.float32)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)
    for i, s in enumerate(seqs):
        embeds[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return embeds, mask


def text_batches(inputs: Inputs, w: Workload) -> list[list[str]]:
    """A text workload's requests, each a list of texts: T1's batches, or T2's one query
    text per request."""
    return inputs.texts if w.key == "T1" else [[t] for t in inputs.queries]
