"""The in-process limit: onnxruntime in-process on our graph, at its best setting per round.

Every ratio divides by it, so it must not be weak: in each round it is the best
in-process throughput over batch sizes (as a server could merge the ``c`` requests in
flight) and over thread and concurrency settings (one run at a time, or two at once
on one session or on two), each measured in that round. The report names the setting
that gave it. One request's latency reference is the lowest p50 of batch ×1 run one
at a time (over the thread settings).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from bench.peers.common import Results, Row
from bench.peers.workloads import Workload

RoundsById = dict[int, dict[str, float]]  # Row.by_round()
OUR_GRAPHS = "onnxruntime, our graphs"  # T1's in-process contender, the text limit


@dataclass(frozen=True)
class Setting:
    """How onnxruntime runs in-process: ``runs`` at once (Python threads calling
    ``session.run``) spread over ``sessions`` sessions of ``threads`` intra-op threads."""

    runs: int
    threads: int
    sessions: int = 1

    @property
    def label(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        if self.sessions > 1:
            return f"{self.sessions} sessions × {threads}"
        return f"{self.runs} run{'s' if self.runs > 1 else ''} × {threads}"

    @property
    def task(self) -> dict[str, int]:
        """What the worker takes (inproc_worker.run_task)."""
        return {"threads": self.threads, "concurrent": self.runs, "sessions": self.sessions}


BASELINE = Setting(1, 2)  # the server's own: one run at a time, 2 intra-op threads
SEQUENTIAL = (BASELINE, Setting(1, 1))  # one run at a time
CONCURRENT = (Setting(2, 1), Setting(2, 2), Setting(2, 1, sessions=2))  # two runs at once
# Text: our two graphs behind the tokenizer; two runs on one 1-thread session or on two.
TEXT = (BASELINE, Setting(2, 1), Setting(2, 1, sessions=2))
TEXT_BATCHES = {"T1": (16, 32, 64), "T2": (4, 8, 16, 32)}  # texts per run of the graphs


def settings(w: Workload) -> tuple[Setting, ...]:
    """The settings swept on ``w``: two runs at once only where two requests can be in
    flight (c ≥ 2); at c=1 one run at a time, with 2 threads or 1."""
    if w.concurrency < 2:
        return SEQUENTIAL
    return TEXT if w.text else (BASELINE, *CONCURRENT)


def text_window(w: Workload, s: Setting) -> int:
    """Texts one in-process run of ``w`` takes at setting ``s``: every text of the ``c``
    requests in flight, shared among the setting's runs (T1: 128 sentences one at a time,
    64 each with two; T2: 32 query texts or 16; T2L: one)."""
    return w.batch * max(1, w.concurrency // s.runs)


def text_batch_sizes(w: Workload, s: Setting) -> list[int]:
    """Batch sizes of a text run's length-sorted texts, up to its window (T2L: one text)."""
    window = text_window(w, s)
    return [k for k in TEXT_BATCHES.get(w.key, (1,)) if k <= window] or [window]


def batch_sizes(w: Workload, s: Setting) -> list[int]:
    """Batch sizes per run: the request merged with others, as a server could, with no
    more requests in flight than ``c`` over the setting's runs, ≤ 4096 tokens (≤ 8
    sequences with attention); the ragged batch as one padded run."""
    if w.ragged:
        return [1]
    cap = 8 if w.attention else 4096 // (w.batch * w.seq)
    top = max(1, min(w.concurrency // s.runs, cap))
    return [k for k in (1, 2, 4, 8, 16, 32) if k <= top]


def limit_name(k: int, s: Setting) -> str:
    """A limit row's contender name (workload ``"{key} limit"``)."""
    return f"batch ×{k}, {s.label}"


def _limit_rows(results: Results, w: Workload) -> dict[str, Row]:
    """The workload's in-process rows by name. Runs saved before the sweep named only
    the batch size (``batch ×1``) and held one setting: one run × 2 threads; T1's one
    row was ``onnxruntime, our graphs`` (text rows are named ``onnxruntime, our graphs,
    batch ×k, SETTING``)."""
    if w.text:
        return {
            c.removeprefix(f"{OUR_GRAPHS}, ") if c != OUR_GRAPHS else BASELINE.label: r
            for (k, c), r in results.rows.items()
            if k == w.key and (c == OUR_GRAPHS or c.startswith(f"{OUR_GRAPHS}, "))
        }
    return {
        c if "," in c else f"{c}, {BASELINE.label}": r
        for (k, c), r in results.rows.items()
        if k == f"{w.key} limit"
    }


def _one_at_a_time(name: str) -> bool:
    """Whether a row runs one request's batch one run at a time (the latency reference)."""
    return name.startswith(("batch ×1, 1 run ", "1 run ")) or name == "batch ×1"


def _per_round(results: Results, w: Workload) -> tuple[list[int], dict[str, RoundsById]]:
    """Round ids every in-process row of ``w`` holds, and each row's rounds. A round counts
    only if every row has it (a setting that failed would otherwise lower that round's
    best and flatter every server)."""
    rows = {name: r.by_round() for name, r in _limit_rows(results, w).items()}
    ids = set.intersection(*(set(r) for r in rows.values())) if rows else set()
    return sorted(ids), rows


def limit_of(results: Results, w: Workload) -> tuple[dict[int, float], dict[int, float]]:
    """Per round id: in-process best items/s, and the lowest p50 of one request's batch
    run one at a time."""
    ids, rows = _per_round(results, w)
    best = {i: max(r[i]["items_per_s"] for r in rows.values()) for i in ids}
    single = {n: r for n, r in rows.items() if _one_at_a_time(n)}
    p50 = {i: min(r[i]["p50_ms"] for r in single.values()) for i in ids if single}
    return best, p50


def limit_names(results: Results, w: Workload) -> tuple[str, str]:
    """Which setting gave the limit, and which the latency reference: the one best in
    the most rounds (then by median), with how many rounds it won when not all."""
    ids, rows = _per_round(results, w)
    single = {n: r for n, r in rows.items() if _one_at_a_time(n)}
    return (
        _winner(ids, rows, "items_per_s", highest=True),
        _winner(ids, single, "p50_ms", highest=False),
    )


def _winner(ids: list[int], rows: dict[str, RoundsById], key: str, *, highest: bool) -> str:
    if not ids or not rows:
        return ""
    sign = 1 if highest else -1
    wins = Counter(max(rows, key=lambda n: sign * rows[n][i][key]) for i in ids)
    name = max(
        wins, key=lambda n: (wins[n], sign * statistics.median(rows[n][i][key] for i in ids))
    )
    return name + (f" (best in {wins[name]}/{len(ids)} rounds)" if wins[name] < len(ids) else "")
