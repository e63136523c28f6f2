"""Sessions of their own for the inference lanes: which graphs get them, with how many
intra-op threads, and what they hold in memory.

A graph's own session runs with ``ATTNSERVE_INTRA_OP_THREADS`` threads (default one per
core): best for a run alone. Two small runs at once on it each leave the cores idle
at every operator's join and fight over its threads; two one-thread sessions of the
same graph keep a core each busy (measured in-process, MiniLM, 2 cores: two runs at
once on one-thread sessions against one run on two threads, [1,16] 1.82×, [1,128]
1.20×, [8,128] 1.01×, [32,128] 0.84×; a lone run on one thread 0.61× at [1,128]). So,
beside its own session, a pre-packed graph gets one session per lane with the threads
split between the lanes, and which of them a run takes is measured per graph and
shape at start-up (``run_planner.LaneModel``). Opened from the session cache's
optimised file (service/prepacked_cache.py), every one of them maps the same
pre-packed weights: held once. Without the cache each would pack a private copy, so
then they exist only when ``ATTNSERVE_LANE_SESSIONS=on`` asks for them.
"""

from __future__ import annotations

import os

from service.settings import Settings


def session_threads(settings: Settings) -> int:
    """Intra-op threads of a graph's own session (``0`` in the settings: one per core)."""
    return settings.intra_op_threads or os.cpu_count() or 1


def lane_threads(settings: Settings) -> int:
    """Intra-op threads of each lane's own session; 0: no lane sessions (one lane, the
    setting off, or too few threads to split: they would be the graph's session again)."""
    lanes, threads = settings.inference_lanes, session_threads(settings)
    if settings.lane_sessions == "off" or lanes < 2 or threads < 2:
        return 0
    return max(1, threads // lanes)


def opens_lane_sessions(settings: Settings, *, cached: bool) -> bool:
    """Does a graph get lane sessions: opened from the session cache (``cached``), or
    asked for without it?"""
    if not lane_threads(settings):
        return False
    return cached or settings.lane_sessions == "on"


def lane_session_copies(settings: Settings) -> int:
    """Private pre-packed copies of the encoder's weights each pre-packed graph's lane
    sessions may add, for the memory ledger: with ``auto`` none (they exist only mapping
    the session cache's file: shared pages, counted once with the graph's own session);
    with ``on`` one per lane, cache or not (a cache found unwritable at load falls back
    to packing in memory, so the copies are real then). What a session holds beside its
    weights (its state, a few MiB, and its arena) is not counted: the runs' working
    memory is bounded by the batch budgets, one run per lane at a time, as with one
    session."""
    if not lane_threads(settings) or settings.lane_sessions != "on":
        return 0
    return settings.inference_lanes
