"""Measuring: every server up at once, then rounds in which each workload's contenders
run one after the other (order rotated), each round's answers checked."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from functools import partial
from multiprocessing import get_context
from pathlib import Path

from bench.lib.load import Kept, grpc_load_run, load_run
from bench.lib.models import ROOT
from bench.lib.procs import Sampler, cpu_and_rss, process_tree
from bench.peers.checks import (
    WrongAnswer,
    check_answers,
    checked_calls,
    compute_reference,
    fail_round,
    record_round,
)
from bench.peers.common import Bench, Server
from bench.peers.contenders.inprocess import run_inprocess
from bench.peers.wire import Call, decode_answer, send_once
from bench.peers.workloads import Workload
from bench.peers.wrk import WRK, wrk_ready, wrk_run

# How to start a server contender: (its name, a context manager yielding it running).
Starter = tuple[str, Callable[[], AbstractContextManager[Server]]]


def workload_items(bench: Bench, w: Workload) -> int:
    if w.text:
        return w.batch
    return sum(len(s) for s in bench.inputs.seqs[w.key])


def measure_server(
    bench: Bench, pid: int, port: int, w: Workload, contender: str, calls: list[Call]
) -> tuple[dict[str, float], list[Kept]]:
    """Drives one workload against a running server: one round's statistics, and the
    sample of answers kept from the run (not recorded here: the caller checks them)."""
    with Sampler(pid) as sampler:
        if calls[0].grpc:
            bodies = [c.body for c in calls]
            stats, sample = bench.load.apply(
                grpc_load_run,
                (port, calls[0].path, bodies, w.concurrency, bench.requests, bench.seconds),
            )
        else:
            requests = [c.request for c in calls]
            stats, sample = bench.load.apply(
                load_run, (port, requests, w.concurrency, bench.requests, bench.seconds)
            )
    items = workload_items(bench, w)
    stats |= {
        "round": bench.round,
        "items_per_s": stats["requests"] * items / stats["wall_s"],
        "server_peak_rss_mb": sampler.peak / 2**20,
        "server_cores": sampler.cores,
    }
    print(
        f"  {w.key} {contender}: {stats['items_per_s']:,.0f} /s, p50 {stats['p50_ms']:.1f} ms",
        flush=True,
    )
    return stats, sample


def measure_contender(
    bench: Bench, server: Server, w: Workload, contender: str, calls: list[Call]
) -> None:
    """One round of a server contender: the checked calls' answers checked before timing,
    the timed run, then a sample of the answers it got under load checked too. A round
    that fails any of it (or cannot be run) is reported loudly and left out of the ratios."""

    def run() -> dict[str, float]:
        before = check_before(bench, server, w, calls)
        stats, sample = measure_server(
            bench, server.pid, server.port_of(calls[0]), w, contender, calls
        )
        got = [(i, decode_answer(b, h, calls[i], w, bench.inputs)) for i, b, h in sample]
        after = check_answers(bench, w, got)
        stats["check_max_abs"] = max(before["check_max_abs"], after["check_max_abs"])
        stats["checked"] = before["checked"] + after["checked"]
        return stats

    if (stats := counted(bench, w, contender, run)) is not None:
        record_round(bench, w, contender, stats)


def counted(
    bench: Bench, w: Workload, contender: str, run: Callable[[], dict[str, float]]
) -> dict[str, float] | None:
    """A contender's round, or None when it failed (said loudly, kept in its row)."""
    try:
        return run()
    except WrongAnswer as exc:
        fail_round(bench, w, contender, f"wrong answer: {exc}")
    except Exception as exc:  # a refused request, a dead server: the round is lost, not the run
        fail_round(bench, w, contender, f"{type(exc).__name__}: {exc}")
    return None


def check_before(bench: Bench, server: Server, w: Workload, calls: list[Call]) -> dict[str, float]:
    """The Python client's check before a timed run: the checked calls' answers, one by
    one (WrongAnswer if any is off)."""
    answers = []
    for index in checked_calls(w, len(calls)):
        call = calls[index]
        body, headers = send_once(server.port_of(call), call)
        answers.append((index, decode_answer(body, headers, call, w, bench.inputs)))
    return check_answers(bench, w, answers)


def measure_wrk(
    bench: Bench, server: Server, w: Workload, contender: str, calls: list[Call]
) -> None:
    """One round of a server contender driven by wrk (row ``contender + WRK``): the
    Python client's check first (wrk reads no answer), then wrk's timed run."""
    wrk, name = bench.wrk, contender + WRK
    assert wrk is not None

    def run() -> dict[str, float]:
        before = check_before(bench, server, w, calls)
        with Sampler(server.pid) as sampler:
            stats = wrk_run(wrk, server.port, calls, w.concurrency, bench.seconds)
        return (
            stats
            | before
            | {
                "items_per_s": stats["requests"] * workload_items(bench, w) / stats["wall_s"],
                "server_peak_rss_mb": sampler.peak / 2**20,
                "server_cores": sampler.cores,
            }
        )

    if (stats := counted(bench, w, name, run)) is not None:
        print(f"  {w.key} {name}: {stats['items_per_s']:,.0f} /s, p50 {stats['p50_ms']:.1f} ms")
        record_round(bench, w, name, stats)


def idle_cores(server: Server, seconds: float = 2.0) -> float:
    """CPU a server burns while nobody asks it anything (spinning threads, pollers)."""
    with Sampler(server.pid) as sampler:
        time.sleep(seconds)
    return sampler.cores


def start_servers(
    bench: Bench,
    stack: ExitStack,
    starters: list[Starter],
    settle: float,
) -> list[Server]:
    """Every server up at once (each idles while another is measured), idle cost noted."""
    servers = []
    for what, start in starters:
        print(f"starting {what} …", flush=True)
        try:
            servers.append(stack.enter_context(start()))
        except Exception as exc:  # a peer that cannot start is reported, the rest go on
            bench.note(f"{what}: failed to start: {type(exc).__name__}: {exc}")
    time.sleep(settle)  # let start-up work (warm-ups, loaders) settle
    idle = [f"{s.name} {idle_cores(s, settle):.2f}" for s in servers]
    rss = [f"{s.name} {cpu_and_rss(process_tree(s.pid))[1] / 2**20:,.0f} MB" for s in servers]
    if servers:
        bench.note(
            f"Idle servers, cores busy over {settle:g} s: {', '.join(idle)}; RSS: {', '.join(rss)}."
        )
    return servers


def interleaved(
    bench: Bench,
    w: Workload,
    servers: list[Server],
    optimum_dir: Path | None,
    st: bool,
    inproc: bool,
) -> list[tuple[str, Callable[[], None]]]:
    """One round of one workload: the in-process limit and every contender that takes it."""
    steps: list[tuple[str, Callable[[], None]]] = []
    if inproc:
        steps.append(("in-process", lambda: run_inprocess(bench, w, optimum_dir, st)))
    for server in servers:
        for contender, calls in server.calls(w).items():
            steps.append(
                (contender, partial(measure_contender, bench, server, w, contender, calls))
            )
            if bench.wrk and w.key in bench.wrk_workloads and wrk_ready(calls):
                wrk = partial(measure_wrk, bench, server, w, contender, calls)
                steps.append((contender + WRK, wrk))
    return steps


def guarded(bench: Bench, what: str, fn: Callable[[], None]) -> None:
    """A peer that fails to start or answer is reported, and the run goes on."""
    try:
        fn()
    except Exception as exc:  # any peer failure: report it and keep measuring the others
        bench.note(f"{what}: failed this round: {type(exc).__name__}: {exc}")


def git_source() -> str:
    """The commit the service ran from, and whether service/ differed from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "service", "model_export")
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def measure(
    bench: Bench,
    starters: list[Starter],
    workloads: list[Workload],
    settle: float,
    optimum_dir: Path | None,
    st: bool,
    inproc: bool,
) -> None:
    """Reference answers, then every round: each workload's contenders in rotated order."""
    bench.results.source = git_source()
    print("computing the reference answers …", flush=True)
    compute_reference(bench)
    rounds = bench.results.rounds
    with ExitStack() as stack, get_context("spawn").Pool(1) as pool:
        bench.load = pool  # the load generator's own process
        servers = start_servers(bench, stack, starters, settle)
        for r in range(rounds):
            bench.round = r + 1
            for w in workloads:
                steps = interleaved(bench, w, servers, optimum_dir, st, inproc)
                for label, fn in steps[r % len(steps) :] + steps[: r % len(steps)]:
                    print(f"round {r + 1}/{rounds}: {w.key} {label}", flush=True)
                    guarded(bench, f"{w.key} {label}", fn)
    bench.load = None
