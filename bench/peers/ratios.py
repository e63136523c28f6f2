"""Ratios: each contender's throughput ÷ the in-process limit of the same round, paired by
round id, and which columns the summary shows."""

from __future__ import annotations

import statistics

from bench.lib.report import median_range
from bench.peers.common import (
    INFINITY_OFF,
    ORDER,
    PYTRITON,
    PYTRITON_BEST,
    PYTRITON_DEFAULT,
    PYTRITON_GRPC,
    PYTRITON_GRPC_BEST,
    Results,
    Row,
)
from bench.peers.contenders.pytriton import TritonSetting
from bench.peers.limit import OUR_GRAPHS, limit_of
from bench.peers.workloads import Workload


def ratios(results: Results, w: Workload, row: Row) -> list[float]:
    """The row's items/s ÷ the limit of the same round, paired by round id: a round
    that either side lacks (failed, wrong answers) is dropped, never shifted."""
    best, _ = limit_of(results, w)
    by_round = row.by_round()
    return [by_round[i]["items_per_s"] / best[i] for i in sorted(by_round) if best.get(i)]


def unpaired(results: Results, w: Workload, row: Row) -> list[int]:
    """Round ids the row has but the limit lacks (its in-process run failed)."""
    best, _ = limit_of(results, w)
    return [i for i in sorted(row.by_round()) if not best.get(i)]


def best_triton(results: Results, w: Workload, prefix: str = PYTRITON) -> tuple[str, Row] | None:
    """PyTriton's setting that served workload ``w`` best over ``prefix``'s transport
    (/v2 binary, or gRPC): the highest median ratio."""
    rows = [
        (c, r)
        for (k, c), r in results.rows.items()
        if k == w.key and c.startswith(f"{prefix}, ") and ratios(results, w, r)
    ]
    if not rows:
        return None
    return max(rows, key=lambda cr: statistics.median(ratios(results, w, cr[1])))


def ordered(contenders: set[str]) -> list[str]:
    """Contenders in ORDER (an entry also orders the names it begins, e.g. PyTriton's
    settings), then by name."""

    def key(c: str) -> tuple[int, str]:
        for i, name in enumerate(ORDER):
            if c == name or c.startswith(f"{name}, "):
                return i, c
        return len(ORDER), c

    return sorted(contenders, key=key)


def summary_contenders(results: Results) -> list[str]:
    """The ratio table's columns: PyTriton as two (its default, its best setting), the
    unoptimised infinity-emb and T1's in-process settings (the limit's column names the
    best) only in the detail table."""
    names = {
        c
        for (k, c) in results.rows
        if " limit" not in k and k != "graph" and not c.startswith(OUR_GRAPHS)
    }
    settings = (f"{PYTRITON}, ", f"{PYTRITON_GRPC}, ")
    shown = {c for c in names if not c.startswith(settings) and c != INFINITY_OFF}
    if any(c.startswith(f"{PYTRITON}, ") for c in names):
        shown |= {PYTRITON_DEFAULT, PYTRITON_BEST}
    if any(c.startswith(f"{PYTRITON_GRPC}, ") for c in names):
        shown.add(PYTRITON_GRPC_BEST)
    return ordered(shown)


def column(results: Results, w: Workload, contender: str) -> tuple[list[float], str]:
    """A summary column's ratios on ``w``, and the setting it stands for (PyTriton's best)."""
    if contender == PYTRITON_DEFAULT:
        contender = TritonSetting(0).contender
    elif contender in (PYTRITON_BEST, PYTRITON_GRPC_BEST):
        prefix = PYTRITON if contender == PYTRITON_BEST else PYTRITON_GRPC
        best = best_triton(results, w, prefix)
        if best is None:
            return [], ""
        name, best_row = best
        return ratios(results, w, best_row), name.removeprefix(f"{prefix}, ")
    row = results.rows.get((w.key, contender))
    return (ratios(results, w, row) if row else []), ""


def cell(values: list[float], rounds: int, setting: str = "") -> str:
    """A ratio cell: median (min–max), the setting it was measured at, the rounds it holds
    when fewer than the run's."""
    if not values:
        return ""
    text = median_range(values) + (f" at {setting}" if setting else "")
    return text + (f" [{len(values)}/{rounds} rounds]" if len(values) < rounds else "")


def workload_title(w: Workload, max_seq: int) -> str:
    return f"{w.key} {w.title.format(max=max_seq)}"
