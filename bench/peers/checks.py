"""The answer checks: every contender's answers against in-process onnxruntime on our
graphs, each round; a round with a wrong answer fails loudly and is not counted."""

from __future__ import annotations

import numpy as np

from bench.lib.reference import SequenceReference
from bench.peers.common import ATOL, THREADS, Bench, Row
from bench.peers.workers.inproc_worker import Text
from bench.peers.workloads import WORKLOADS, Workload


class WrongAnswer(RuntimeError):
    """A contender's answer differs from the reference (shape, or beyond ``ATOL``)."""


def max_difference(
    reference: dict[str, list[np.ndarray]], got: dict[str, list[np.ndarray]]
) -> float:
    """Max abs difference over every output and sequence; WrongAnswer if an output is
    missing, a shape differs or a value is not finite."""
    worst = 0.0
    for name, mine in reference.items():
        if name not in got:
            raise WrongAnswer(f"no {name!r} in the answer")
        if len(got[name]) != len(mine):
            raise WrongAnswer(f"{len(got[name])} {name} arrays, expected {len(mine)}")
        for ours_, theirs in zip(mine, got[name], strict=True):
            if ours_.shape != theirs.shape:
                raise WrongAnswer(f"{name} shape {list(theirs.shape)} ≠ {list(ours_.shape)}")
            difference = float(np.abs(ours_ - theirs).max())
            if not np.isfinite(difference):  # max() would skip a NaN
                raise WrongAnswer(f"{name} holds a NaN or an infinity")
            worst = max(worst, difference)
    return worst


def check_answers(
    bench: Bench, w: Workload, answers: list[tuple[int, dict[str, list[np.ndarray]]]]
) -> dict[str, float]:
    """Checks decoded answers (call index, outputs) against the reference of their call.

    Returns what the round records (``check_max_abs``, ``checked``); raises WrongAnswer
    when any answer is off by more than ``ATOL`` or has the wrong shape."""
    if not answers:
        raise WrongAnswer("no answer to check")
    worst = 0.0
    for index, got in answers:
        worst = max(worst, max_difference(bench.reference[w.key][index], got))
    if not worst <= ATOL:  # also catches NaN
        raise WrongAnswer(f"max |difference| {worst:.2e} > {ATOL:g}")
    return {"check_max_abs": worst, "checked": float(len(answers))}


def record_round(bench: Bench, w: Workload, contender: str, stats: dict[str, float]) -> None:
    """A checked round of a contender: its statistics join the row, the summary follows."""
    row = bench.row(w.key, contender, "sentences" if w.text else "tokens")
    row.rounds.append(stats | {"round": bench.round})
    row.check = check_summary(row)


def fail_round(bench: Bench, w: Workload, contender: str, reason: str) -> None:
    """A contender's round that is not counted: said loudly, kept in the row and notes."""
    row = bench.row(w.key, contender, "sentences" if w.text else "tokens")
    row.failures.append({"round": bench.round, "reason": reason})
    row.check = check_summary(row)
    print(f"\n!!! {w.key} {contender}: round {bench.round} FAILED: {reason}\n", flush=True)
    bench.note(
        f"✗ {w.key} {contender}: round {bench.round} failed and is left out of its ratios: {reason}"
    )


def check_summary(row: Row) -> str:
    """✓ and the worst difference over every checked answer of every counted round, or ✗
    and the rounds that failed."""
    checked = [r for r in row.rounds if "check_max_abs" in r]
    worst = max((r["check_max_abs"] for r in checked), default=float("nan"))
    answers = int(sum(r.get("checked", 0) for r in checked))
    plural = "s" if len(checked) > 1 else ""
    text = f"✓ {worst:.1e} ({answers} answers, {len(checked)} round{plural})" if checked else ""
    if row.failures:
        failed = ", ".join(f"round {f['round']}" for f in row.failures)
        text = f"✗ {failed} failed" + (f"; others {text}" if text else "")
    return text


CHECKED_QUERIES = 64  # T2: the query texts whose answers are checked before timing


def checked_calls(w: Workload, calls: int) -> list[int]:
    """The calls whose answers are checked before a run is timed: every one, but of T2's
    held set (one text per call) a spread of ``CHECKED_QUERIES``; the answers sampled
    under load are checked too, whichever they are."""
    if w.key == "T1" or not w.text:
        return list(range(calls))
    return list(range(0, calls, max(1, calls // CHECKED_QUERIES)))[:CHECKED_QUERIES]


def compute_reference(bench: Bench) -> None:
    """Our graphs in this process (not timed): what every contender's answer must match,
    per call a workload sends (one for arrays; one per text batch for T1; one per query
    text for T2, encoded in length-sorted batches)."""
    graphs = SequenceReference(bench.model_dir, THREADS)
    queries: list[dict[str, list[np.ndarray]]] = []
    for w in WORKLOADS:
        if w.text:
            if not bench.text:
                continue
            text = Text(str(bench.model_dir), False, THREADS)
            if w.key == "T1":
                bench.reference[w.key] = [
                    {"pooled": list(text.texts(batch))} for batch in bench.inputs.texts
                ]
                continue
            if not queries:  # T2 and T2L share the held set
                pooled = text.sorted_texts(bench.inputs.queries, 64)
                queries = [{"pooled": [vector]} for vector in pooled]
            bench.reference[w.key] = queries
            continue
        ref: dict[str, list[np.ndarray]] = {"hidden": [], "attention": []}
        for s in bench.inputs.seqs[w.key]:  # one by one: what each sequence alone gives
            hidden, attentions = graphs.run(s, w.attention)
            ref["hidden"].append(hidden)
            if attentions is not None:
                ref["attention"].append(attentions)
        bench.reference[w.key] = [{k: v for k, v in ref.items() if v}]
