"""Pruning multi-vectors: how far a document's MaxSim ranking holds with fewer vectors.

Late interaction stores one L2-normalised vector per document token and ranks by
MaxSim (``service.engine.pruning``). This measures, against that full MaxSim ranking,
per query: the top-10 overlap (|top10 ∩ top10'| / 10) and Kendall's τ-b over the
full ranking's top 100, averaged over queries,
when each document keeps only k vectors chosen by attention received, by the vectors'
norms before normalisation or at random, or is replaced by a MUVERA fixed-dimensional
encoding of about as many floats. The pruning is ``service.engine.pruning``'s: the
code measured is the code shipped.

No ColBERT weights exist offline, so the multi-vectors are a proxy: all-MiniLM-L6-v2's
last hidden states (the exported model, run through embeddings.onnx then
model_attn.onnx as the service feeds them), L2-normalised per token, every real token
kept ([CLS] and [SEP] included) for queries and unpruned documents.

The corpus is the Python standard library's docstrings (``corpus``): a query is a
function's or class's first docstring sentence, its document the rest of that
docstring. Two disjoint splits from one seeded shuffle: ``dev`` (where the
recommendation is chosen) and ``held_out`` (the reported table).

    .venv/bin/python -m bench.pruning --model-dir models/minilm-l6 --write-doc

Writes ``bench/out/pruning.json``, prints the report rendered from it and, with
``--write-doc``, puts it in docs/benchmarks.md between its markers; ``--from-json``
renders an earlier run's again. About three minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from bench.lib.models import DEFAULT_MODEL_DIR, OUT, ROOT, model_config
from bench.lib.report import table
from bench.lib.results import read_json, write_json
from model_export import graph_io
from service.engine import pruning
from service.engine.pruning import BoolArray, FdeConfig, FloatArray, IndexArray

K_VALUES = (8, 16, 32)
FRACTIONS = (0.25, 0.5)
TOP = 10  # the overlap's cut
TAU_TOP = 100  # τ over the full ranking's top TAU_TOP documents
RANDOM_SEEDS = 5
MIN_TOKENS, MAX_TOKENS = 20, 200  # a document's tokens, [CLS] and [SEP] included
MIN_QUERY_WORDS = 4
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages"})
DOCUMENTS, QUERIES, SEED = 400, 150, 0  # per split; the shuffle's seed
BATCH = 16
QUERY_CHUNK = 32
# MUVERA: per family, the repetitions that give k × d floats for k in K_VALUES (d = 384).
FDE_FAMILIES = (
    ("MUVERA, 8 partitions, no projection", 3, 0, (1, 2, 4)),
    ("MUVERA, 32 partitions, projected to 16", 5, 16, (6, 12, 24)),
)
BEGIN, END = "<!-- pruning:begin -->", "<!-- pruning:end -->"
HEADING = "## Pruning multi-vectors: `bench/pruning.py`"


# --- the corpus -------------------------------------------------------------------


def docstrings(root: Path) -> Iterator[str]:
    """Every class's and function's docstring (cleaned) in the .py files under
    ``root``, files in sorted path order, nodes in ``ast.walk`` order; test suites,
    idlelib, lib2to3, turtledemo and site-packages skipped."""
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_DIRS & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node, clean=True)
                if doc:
                    yield doc


def split_docstring(doc: str) -> tuple[str, str] | None:
    """(first sentence, the rest) of a docstring, whitespace collapsed; None when
    either is empty. The first sentence ends at the first '.', '!' or '?' followed by
    whitespace, or at the first paragraph's end."""
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    head = re.split(r"(?<=[.!?])\s+", paragraphs[0], maxsplit=1)
    query = head[0]
    rest = " ".join([*head[1:], *paragraphs[1:]]).strip()
    return (query, rest) if query and rest else None


@dataclass(frozen=True)
class Split:
    queries: list[str]
    documents: list[str]  # documents[i] is queries[i]'s own, for i < len(queries)


def corpus(
    count: Callable[[str], int], *, seed: int, documents: int, queries: int
) -> tuple[dict[str, Split], dict[str, Any]]:
    """Two disjoint splits (dev, held_out) of ``documents`` documents each, the first
    ``queries`` of which give their query. Pairs of the standard library's docstrings
    (``split_docstring``), kept where the query has at least MIN_QUERY_WORDS words and
    the document MIN_TOKENS to MAX_TOKENS tokens (``count``), the first of each
    repeated query or document kept, shuffled by ``seed``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for doc in docstrings(root):
        pair = split_docstring(doc)
        if pair is None or pair[0] in seen or pair[1] in seen:
            continue
        if len(pair[0].split()) < MIN_QUERY_WORDS:
            continue
        if not MIN_TOKENS <= count(pair[1]) <= MAX_TOKENS:
            continue
        seen.update(pair)
        pairs.append(pair)
    if len(pairs) < 2 * documents:
        raise SystemExit(f"{len(pairs)} pairs, {2 * documents} needed")
    order = np.random.default_rng(seed).permutation(len(pairs))
    splits = {}
    for s, name in enumerate(("dev", "held_out")):
        chosen = [pairs[i] for i in order[s * documents : (s + 1) * documents]]
        splits[name] = Split([q for q, _ in chosen[:queries]], [d for _, d in chosen])
    recipe = {
        "source": f"Python {sys.version.split()[0]} standard library ({root})",
        "pairs_kept": len(pairs),
        "seed": seed,
        "documents_per_split": documents,
        "queries_per_split": queries,
        "document_tokens": [MIN_TOKENS, MAX_TOKENS],
        "min_query_words": MIN_QUERY_WORDS,
        "skipped_dirs": sorted(SKIPPED_DIRS),
    }
    return splits, recipe


# --- the runs ---------------------------------------------------------------------


@dataclass
class Encoded:
    """One text's run: its last hidden states [T, d] (before normalisation), which
    tokens are special, and its attention received per aggregation (documents)."""

    hidden: FloatArray
    special: BoolArray
    received: dict[str, FloatArray]


# name -> (layers, query rows, scaled by value norms)
ATTENTION: dict[str, tuple[Literal["last", "mean"], Literal["all", "first"], bool]] = {
    "last": ("last", "all", False),
    "mean": ("mean", "all", False),
    "last_norms": ("last", "all", True),
    "last_cls": ("last", "first", False),
}


class Model:
    """The exported model's token-embedding and attention graphs, fed as the service
    feeds them (``service.runtime.ModelRuntime.run``: ids and types, then embeddings
    and mask)."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        from tokenizers import Tokenizer

        config = model_config(model_dir)
        self.tokenizer = Tokenizer.from_file(str(model_dir / config["text"]["tokenizer"]))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(config["architecture"]["max_seq_len"])
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        cpu = ["CPUExecutionProvider"]
        self.ids = ort.InferenceSession(
            str(model_dir / graph_io.GRAPH_TOKEN_EMBEDDINGS), options, providers=cpu
        )
        self.attn = ort.InferenceSession(
            str(model_dir / graph_io.GRAPH_ATTENTION), options, providers=cpu
        )
        self.names = [o.name for o in self.attn.get_outputs()]

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)

    def encode(self, texts: list[str], *, attention: bool) -> list[Encoded]:
        encodings = [self.tokenizer.encode(t) for t in texts]
        out: list[Encoded | None] = [None] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), BATCH):
            rows = order[start : start + BATCH]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for b, i in enumerate(rows):
                ids[b, : len(encodings[i].ids)] = encodings[i].ids
                mask[b, : len(encodings[i].ids)] = 1
            feeds = {graph_io.INPUT_IDS: ids, graph_io.INPUT_TOKEN_TYPES: np.zeros_like(ids)}
            embeds = self.ids.run(None, feeds)[0]
            got = dict(zip(self.names, self.attn.run(None, {
                graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask
            }), strict=True))  # fmt: skip
            for b, i in enumerate(rows):
                n = len(encodings[i].ids)
                received = {}
                if attention:
                    maps = got[graph_io.OUTPUT_ATTENTIONS][b, :, :, :n, :n]
                    norms = got[graph_io.OUTPUT_VALUE_NORMS][b, :, :, :n]
                    for name, (layers, query_rows, scaled) in ATTENTION.items():
                        received[name] = pruning.received_attention(
                            maps,
                            layers=layers,
                            rows=query_rows,
                            value_norms=norms if scaled else None,
                        )
                out[i] = Encoded(
                    hidden=got[graph_io.OUTPUT_HIDDEN][b, :n].astype(np.float32),
                    special=np.array(encodings[i].special_tokens_mask, dtype=bool),
                    received=received,
                )
        return [e for e in out if e is not None]


# --- the methods ------------------------------------------------------------------

Keep = Callable[[Encoded, int, np.random.Generator], IndexArray]
Scores = npt.NDArray[np.floating[Any]]  # score vectors of any precision


def _attention(name: str, specials: bool) -> Keep:
    def keep(doc: Encoded, k: int, rng: np.random.Generator) -> IndexArray:
        return pruning.keep_by_attention(doc.received[name], k, None if specials else ~doc.special)

    return keep


def _norm(specials: bool) -> Keep:
    def keep(doc: Encoded, k: int, rng: np.random.Generator) -> IndexArray:
        norms = np.linalg.norm(doc.hidden, axis=1)
        return pruning.keep_by_norm(norms, k, None if specials else ~doc.special)

    return keep


def _random(doc: Encoded, k: int, rng: np.random.Generator) -> IndexArray:
    return pruning.keep_at_random(len(doc.hidden), k, rng)


NO_SPECIALS = ", no [CLS]/[SEP]"
METHODS: dict[str, Keep] = {
    f"random (mean of {RANDOM_SEEDS} seeds)": _random,
    "norm": _norm(True),
    f"norm{NO_SPECIALS}": _norm(False),
    "attention, last layer": _attention("last", True),
    f"attention, last layer{NO_SPECIALS}": _attention("last", False),
    "attention, mean of layers": _attention("mean", True),
    f"attention, mean of layers{NO_SPECIALS}": _attention("mean", False),
    f"attention × value norm, last layer{NO_SPECIALS}": _attention("last_norms", False),
    f"[CLS] row's attention, last layer{NO_SPECIALS}": _attention("last_cls", False),
}
RANDOM = next(iter(METHODS))


def columns() -> list[tuple[str, Callable[[int], int]]]:
    """(label, tokens kept of a document of n tokens) per column of the table."""
    cols: list[tuple[str, Callable[[int], int]]]
    cols = [(f"k={k}", partial(_first_k, k)) for k in K_VALUES]
    return cols + [(f"{f:.0%}", partial(_fraction, f)) for f in FRACTIONS]


def _first_k(k: int, n: int) -> int:
    return min(k, n)


def _fraction(f: float, n: int) -> int:
    return max(1, round(f * n))


# --- the metrics ------------------------------------------------------------------


def top_overlap(reference: FloatArray, other: FloatArray, top: int = TOP) -> float:
    """|top ∩ top'| / top of two score vectors over the same documents (ties broken
    by document order)."""
    a = np.argsort(-reference, kind="stable")[:top]
    b = np.argsort(-other, kind="stable")[:top]
    return len(set(a.tolist()) & set(b.tolist())) / top


def kendall_tau(x: Scores, y: Scores) -> float:
    """Kendall's τ-b of two score vectors (ties in either counted as neither
    concordant nor discordant, and taken out of the denominator)."""
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    upper = np.triu_indices(len(x), k=1)
    sx, sy = dx[upper], dy[upper]
    denominator = np.sqrt(float(np.count_nonzero(sx)) * float(np.count_nonzero(sy)))
    return float((sx * sy).sum() / denominator) if denominator else 0.0


def agreement(reference: FloatArray, scores: FloatArray) -> dict[str, float]:
    """Per query row of [Q, D] scores: the top-10 overlap and τ over the reference's
    top TAU_TOP, averaged over queries."""
    overlaps, taus = [], []
    for ref, got in zip(reference, scores, strict=True):
        top = np.argsort(-ref, kind="stable")[:TAU_TOP]
        overlaps.append(top_overlap(ref, got))
        taus.append(kendall_tau(ref[top], got[top]))
    return {"overlap": float(np.mean(overlaps)), "tau": float(np.mean(taus))}


def own_in_top(scores: FloatArray, top: int = TOP) -> float:
    """The share of queries whose own document (query i's is document i) is in the
    top ``top`` of its scores."""
    ranks = np.argsort(-scores, axis=1, kind="stable")[:, :top]
    return float(np.mean([i in row for i, row in enumerate(ranks.tolist())]))


def maxsim_scores(queries: list[FloatArray], documents: list[FloatArray]) -> FloatArray:
    """[Q, D] MaxSim of normalised query and document vectors (QUERY_CHUNK queries
    at a time: their products with every document vector are held at once)."""
    stacked, offsets = pruning.stack(documents)
    parts = []
    for start in range(0, len(queries), QUERY_CHUNK):
        q, q_offsets = pruning.stack(queries[start : start + QUERY_CHUNK])
        parts.append(pruning.maxsim_matrix(q, q_offsets, stacked, offsets))
    return np.concatenate(parts)


# --- the measurement --------------------------------------------------------------


def evaluate(queries: list[Encoded], documents: list[Encoded]) -> dict[str, Any]:
    """Every method at every column, and MUVERA, against the full MaxSim of one split."""
    qs = [pruning.normalize(q.hidden) for q in queries]
    ds = [pruning.normalize(d.hidden) for d in documents]
    reference = maxsim_scores(qs, ds)
    lengths = np.array([len(d) for d in ds])
    d_model = ds[0].shape[1]
    rows: list[dict[str, Any]] = []
    for method, keep in METHODS.items():
        seeds = range(RANDOM_SEEDS) if method == RANDOM else range(1)
        for label, kept in columns():
            runs, floats = [], []
            for seed in seeds:
                rng = np.random.default_rng(seed)
                chosen = [keep(doc, kept(len(doc.hidden)), rng) for doc in documents]
                pruned = [d[c] for d, c in zip(ds, chosen, strict=True)]
                scores = maxsim_scores(qs, pruned)
                runs.append(agreement(reference, scores) | {"own_in_top10": own_in_top(scores)})
                floats.append(float(np.mean([len(c) for c in chosen])) * d_model)
            mean = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}
            spread = {f"{key}_range": [min(r[key] for r in runs), max(r[key] for r in runs)]
                      for key in ("overlap", "tau")}  # fmt: skip
            rows.append(
                {"method": method, "column": label, "floats": float(np.mean(floats))} | mean
            )
            if len(runs) > 1:
                rows[-1] |= spread
    for family, k_sim, d_proj, repetitions in FDE_FAMILIES:
        for k, reps in zip(K_VALUES, repetitions, strict=True):
            config = FdeConfig(k_sim=k_sim, d_proj=d_proj or d_model, repetitions=reps, seed=0)
            draws = config.draws(d_model)
            q_fde = np.stack([pruning.muvera_fde(q, config, query=True, draws=draws) for q in qs])
            d_fde = np.stack([pruning.muvera_fde(d, config, query=False, draws=draws) for d in ds])
            scores = (q_fde @ d_fde.T).astype(np.float32)
            rows.append(
                {"method": family, "column": f"k={k}", "floats": float(config.dim())}
                | agreement(reference, scores)
                | {"own_in_top10": own_in_top(scores), "config": vars(config)}
            )
    return {
        "queries": len(queries),
        "documents": len(documents),
        "document_tokens": {
            "mean": float(lengths.mean()),
            "min": int(lengths.min()),
            "max": int(lengths.max()),
        },
        "unpruned_floats": float(lengths.mean()) * d_model,
        "unpruned_own_in_top10": own_in_top(reference),
        "rows": rows,
    }


def run(
    model_dir: Path, *, seed: int, documents: int, queries: int, threads: int
) -> dict[str, Any]:
    began = time.perf_counter()
    model = Model(model_dir, threads)
    splits, recipe = corpus(model.count, seed=seed, documents=documents, queries=queries)
    result: dict[str, Any] = {"model": model_config(model_dir)["name"], "corpus": recipe}
    for name, split in splits.items():
        q = model.encode(split.queries, attention=False)
        d = model.encode(split.documents, attention=True)
        result[name] = evaluate(q, d)
        print(f"{name}: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    result["recommended"] = recommend(result)
    result["seconds"] = time.perf_counter() - began
    return result


def score(split: dict[str, Any], method: str) -> float:
    """A method's mean of top-10 overlap and τ over the table's columns."""
    rows = [r for r in split["rows"] if r["method"] == method]
    return float(statistics.mean((r["overlap"] + r["tau"]) / 2 for r in rows))


def recommend(result: dict[str, Any]) -> dict[str, str]:
    """The pruning rule (not MUVERA, not random) with the best ``score`` on dev, and the
    attention aggregation with the best ``score`` on dev."""
    methods = [m for m in METHODS if m != RANDOM]
    attention = [m for m in methods if "attention" in m]
    dev = result["dev"]
    return {
        "rule": max(methods, key=lambda m: score(dev, m)),
        "attention": max(attention, key=lambda m: score(dev, m)),
    }


# --- the report -------------------------------------------------------------------


def beats_random(split: dict[str, Any], method: str) -> list[str]:
    """The columns where ``method``'s overlap and τ both lie above every random seed's."""
    by = {(r["method"], r["column"]): r for r in split["rows"]}
    won = []
    for label, _ in columns():
        r, chance = by.get((method, label)), by[(RANDOM, label)]
        if r is None:
            continue
        if r["overlap"] > chance["overlap_range"][1] and r["tau"] > chance["tau_range"][1]:
            won.append(label)
    return won


def cells(split: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    labels = [label for label, _ in columns()]
    methods = list(dict.fromkeys(r["method"] for r in split["rows"]))
    by = {(r["method"], r["column"]): r for r in split["rows"]}
    header = ["method", *labels, "above random at"]
    floats = ["stored floats per document"]
    floats += [f"{by[(RANDOM, label)]['floats']:,.0f}" for label in labels] + [""]
    body = [floats]
    for method in methods:
        row = [method]
        for label in labels:
            r = by.get((method, label))
            row.append("—" if r is None else f"{r['overlap']:.2f} · {r['tau']:.2f}")
        won = beats_random(split, method) if method != RANDOM else []
        row.append(", ".join(won) if method != RANDOM else "")
        row[-1] = row[-1] or ("" if method == RANDOM else "none")
        body.append(row)
    return header, body


def own_cells(split: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Per method and column: the share of queries whose own document is in the top 10."""
    labels = [label for label, _ in columns()]
    by = {(r["method"], r["column"]): r for r in split["rows"]}
    body = [["unpruned", *[f"{split['unpruned_own_in_top10']:.2f}"] * len(labels)]]
    for method in dict.fromkeys(r["method"] for r in split["rows"]):
        cells = [by.get((method, label)) for label in labels]
        body.append([method, *("—" if r is None else f"{r['own_in_top10']:.2f}" for r in cells)])
    return ["method", *labels], body


def render(result: dict[str, Any]) -> str:
    """The generated block of docs/benchmarks.md, from the results JSON."""
    held, dev, recipe = result["held_out"], result["dev"], result["corpus"]
    header, body = cells(held)
    rule, attention = result["recommended"]["rule"], result["recommended"]["attention"]
    by = {(r["method"], r["column"]): r for r in held["rows"]}
    labels = [label for label, _ in columns()]

    def line(method: str) -> str:
        return ", ".join(
            f"{label}: {by[(method, label)]['overlap']:.2f} · {by[(method, label)]['tau']:.2f}"
            for label in labels
        )

    chance = [by[(RANDOM, label)] for label in labels]
    spread = max(
        max(r["overlap_range"][1] - r["overlap_range"][0], r["tau_range"][1] - r["tau_range"][0])
        for r in chance
    )
    above = {m: beats_random(held, m) for m in dict.fromkeys(r["method"] for r in held["rows"])}
    nowhere = [c for c in labels if not any(c in won for m, won in above.items() if m != RANDOM)]
    verdict = (
        f"Above random at {', '.join(nowhere)}: no rule and no encoding."
        if nowhere
        else "Some rule or encoding is above random at every column."
    )
    chosen = f"**{rule}**; held out, {line(rule)}."
    if attention != rule:
        chosen += f" The best attention aggregation on dev: **{attention}**; held out, "
        chosen += f"{line(attention)}."
    else:
        chosen += " It is also the best attention aggregation on dev."
    tokens = held["document_tokens"]
    lines = [
        BEGIN,
        "",
        f"Held-out split: {held['queries']} queries against {held['documents']} documents "
        f"of {tokens['min']}–{tokens['max']} tokens (mean {tokens['mean']:.0f}; "
        f"{held['unpruned_floats']:,.0f} floats per document unpruned). Each cell: "
        f"top-{TOP} overlap · Kendall τ-b over the unpruned top {TAU_TOP}, "
        "averaged over queries (1.00 · 1.00 = the unpruned ranking). MUVERA's "
        "encodings take the floats of the column's k vectors (k × 384); they have no "
        'percentage columns. "above random at": the columns where both numbers lie '
        f"above the best of random pruning's {RANDOM_SEEDS} seeds (whose cells are their "
        f"mean; the seeds spread by at most {spread:.2f}).",
        "",
        table(header, body, "l" + "r" * (len(header) - 2) + "l"),
        "",
        f"Unpruned MaxSim puts a query's own document in its top {TOP} for "
        f"{held['unpruned_own_in_top10']:.0%} of the held-out queries ({dev['queries']} "
        f"dev queries: {dev['unpruned_own_in_top10']:.0%}). How often each method still "
        f"does (retrieval, not agreement: a ranking can change below the query's own "
        "document and leave this as it was):",
        "",
        table(*own_cells(held), "l" + "r" * len(labels)),
        "",
        verdict,
        "",
        f"Chosen on the dev split (best mean of overlap and τ over the columns): {chosen}",
        "",
        f"Corpus: {recipe['source']}, {recipe['pairs_kept']} query–document pairs kept, "
        f"shuffled with seed {recipe['seed']}; run in {result['seconds']:.0f} s.",
        "",
        END,
    ]
    return "\n".join(lines)


def write_doc(doc: Path, block: str) -> None:
    """Replace the generated block (or append it under its heading); nothing else changes."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + f"\n\n{HEADING}\n\n{block}\n"
    doc.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--documents", type=int, default=DOCUMENTS, help="per split")
    parser.add_argument("--queries", type=int, default=QUERIES, help="per split")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=OUT / "pruning.json")
    parser.add_argument("--from-json", action="store_true", help="render --json again")
    parser.add_argument("--write-doc", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    if args.from_json:
        result = read_json(args.json)
    else:
        result = run(
            args.model_dir,
            seed=args.seed,
            documents=args.documents,
            queries=args.queries,
            threads=args.threads,
        )
        write_json(args.json, result)
    block = render(result)
    if args.write_doc:
        write_doc(args.doc, block)
    print(block)


if __name__ == "__main__":
    main()
