"""Issue 44's items 1-3, before and after: ``python -m bench.hardening --before CHECKOUT``.

Each side is a checkout whose exporter and server are measured (``checkout.py``):
``--before`` an older one (``git worktree add /tmp/before <commit>``), and this one.
Per side, MiniLM is exported once (for items 2 and 3) and a random-head SPLADE model
(item 1); then:

1. ``sparse``: ``/v1/embed_sparse`` with 2,048, 256 and 56 one-word texts and
   ``return_text``: status, answer bytes, seconds, the server's peak RSS;
2. ``load``: a one-text request's p50/p99 with no load, during a load of a second model
   and during a load/unload storm;
3. ``tokenize``: three concurrent 30-million-character texts with ``truncate``, a
   2,048-text request behind them, a 10 MB text on ``/v1/explain/similarity``.

Writes ``bench/out/hardening.json`` and prints a table with a column per side. The
machine is shared: statuses, bytes and RSS are the figures to compare; seconds and
latencies only within one run.

    .venv/bin/python -m bench.hardening --before /tmp/before [--items sparse,load,tokenize]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench.hardening import checkout, load, sparse, tokenize
from bench.lib.models import OUT, ROOT
from bench.lib.report import table
from bench.lib.results import write_json

ITEMS = ("sparse", "load", "tokenize")


def measure(service_root: Path, items: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The figures of ``items`` with ``service_root``'s exporter and server."""
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "sparse" in items:
            found["sparse"] = sparse.run(service_root, sparse.TEXTS)
        if "load" in items or "tokenize" in items:
            minilm = checkout.minilm(service_root, Path(tmp))
            if "load" in items:
                found["load"] = load.run(service_root, minilm, args)
            if "tokenize" in items:
                found["tokenize"] = tokenize.run(service_root, minilm)
    return found


def _answer(found: dict[str, Any]) -> str:
    return f"{found['status']} in {found['seconds']:.1f} s"


def rows(side: dict[str, Any]) -> dict[str, str]:
    """One side's figures, a cell each, keyed by what they are."""
    cells: dict[str, str] = {}
    for asked in side.get("sparse", {}).get("requests", []):
        key = f"1. sparse, {asked['texts']:,} texts"
        cells[f"{key}: answer"] = _answer(asked)
        cells[f"{key}: bytes"] = f"{asked['answer_bytes'] / 1e6:,.1f} MB"
        cells[f"{key}: peak RSS"] = f"{asked['peak_rss_mb']:,.0f} MB"
    if "load" in side:
        phases = side["load"]["phases"]
        for name in ("baseline", "load", "storm"):
            phase = phases[name]
            ms = f"{phase['p50_ms']:.0f} / {phase['p99_ms']:.0f} ms" if phase["requests"] else "-"
            cells[f"2. one text, {name}: p50 / p99"] = ms
            cells[f"2. one text, {name}: answered"] = str(phase["requests"])
    if "tokenize" in side:
        found = side["tokenize"]
        slowest = max(found["huge_truncated"], key=lambda a: a["seconds"])
        cells["3. 3 x 30M chars, truncate: slowest"] = _answer(slowest)
        cells["3. 3 x 30M chars: peak RSS"] = f"{found['peak_rss_mb']:,} MB"
        cells["3. 2,048 texts behind them"] = _answer(found["behind"])
        cells["3. 10 MB on explain/similarity"] = _answer(found["explain_10mb"])
    return cells


def render(results: dict[str, dict[str, Any]]) -> str:
    sides = list(results)
    cells = {side: rows(found) for side, found in results.items()}
    keys = list(dict.fromkeys(k for side in sides for k in cells[side]))
    return table(["figure", *sides], [[k, *(cells[s].get(k, "-") for s in sides)] for k in keys])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of the version before")
    parser.add_argument("--items", default=",".join(ITEMS), help="comma-separated")
    parser.add_argument("--seconds", type=float, default=12.0, help="load: baseline and storm")
    parser.add_argument("--loads", type=int, default=2, help="load: single loads measured")
    parser.add_argument("--storm", type=int, default=3, help="load: concurrent loaders")
    parser.add_argument("--out", type=Path, default=OUT / "hardening.json")
    args = parser.parse_args()
    items = [item for item in args.items.split(",") if item]
    if unknown := set(items) - set(ITEMS):
        parser.error(f"unknown items {sorted(unknown)}: choose from {', '.join(ITEMS)}")
    sides = {"after": ROOT} if args.before is None else {"before": args.before, "after": ROOT}
    results = {side: measure(root, items, args) for side, root in sides.items()}
    write_json(args.out, results)
    print(render(results))


if __name__ == "__main__":
    main()
