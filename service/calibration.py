"""Calibration: each graph timed on a few shapes before its first request.

Each shape runs alone (twice: the first pays the allocations), the run
planner's first cost model, which every live run alone refines; with more
than one lane and no ``ATTNSERVE_SHARED_RUN_MS`` chosen, also two at once on
two lanes, the graph's lane model (which runs share the lanes, and on which
sessions: the graph's own, or each lane's own where it has them).
"""

from __future__ import annotations

import logging

from model_export.manifest import graph_io
from service.inference_lanes import Idle, InferenceLanes
from service.metrics import GRAPH_LABELS
from service.run_planner import Fits, LaneModel, RunCostModel
from service.runtime import ModelRuntime

log = logging.getLogger(__name__)


# Shapes (sequences, tokens) timed per graph at warm-up, so the run planner has a cost
# model (and a sharing model) before the first request. The hidden-state graph gets
# small shapes only: onnxruntime's arena keeps what a run needed, and its outputs grow
# with B·T·L (with large shapes, idle RSS was 540 MB instead of 300); its live runs
# refine the fit. The attention graph runs without the arena, so it gets the small
# shapes and W4's [1,128] class, where sharing its lanes pays most.
CALIBRATION_SHAPES = ((1, 8), (1, 64), (8, 16), (4, 32), (2, 128), (4, 96))
SMALL_CALIBRATION_SHAPES = ((1, 8), (1, 32), (4, 8), (2, 32), (1, 64), (4, 16))
ATTENTION_CALIBRATION_SHAPES = (*SMALL_CALIBRATION_SHAPES, (1, 128), (2, 96))
# The embeddings and text graphs also time one full batch (the batch budget in sequences
# of this many tokens, or the model's longest if shorter), once and giving its arena
# growth back: the full-batch rate that prices requests larger than one batch
# (``RunCostModel.estimate``), which the small shapes put 20-35 % low. Mid-length: the
# rate is per padded token, between short texts' (lower) and the longest's (higher).
FULL_BATCH_LONGEST = 128


def full_batch_shape(graph: str, batch_tokens: int, max_seq_len: int) -> tuple[int, int] | None:
    """(sequences, tokens) of ``graph``'s full-batch timing, if it has one."""
    if graph not in (graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_TEXT):
        return None
    longest = min(FULL_BATCH_LONGEST, max_seq_len, batch_tokens)
    return batch_tokens // longest, longest


def calibration_shapes(graph: str) -> tuple[tuple[int, int], ...]:
    """The (sequences, tokens) shapes timed for ``graph`` before its first request."""
    if graph in (graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_TEXT):
        return CALIBRATION_SHAPES
    if graph == graph_io.GRAPH_ATTENTION:
        return ATTENTION_CALIBRATION_SHAPES
    return SMALL_CALIBRATION_SHAPES


async def calibrate_graph(
    lanes: InferenceLanes,
    runtime: ModelRuntime,
    graph: str,
    fits: Fits,
    cost: RunCostModel,
    *,
    measure_sharing: bool,
    batch_tokens: int,
    idle: Idle | None = None,
) -> LaneModel:
    """Time ``graph``'s calibration shapes that fit, into ``cost``, then its full batch
    of ``batch_tokens`` (if it has one); the lane model measured (empty unless
    ``measure_sharing``; a full batch never shares): each shape two at once on the
    graph's own session, and on the lanes' own sessions where it has them. ``idle``:
    awaited before each run (a model loaded while serving runs its shapes between
    requests)."""
    sharing = LaneModel()
    own = graph in runtime.lane_graphs
    for batch, longest in calibration_shapes(graph):
        longest = min(longest, runtime.info.max_seq_len)
        if not fits(batch, longest):
            continue
        seconds = await lanes.time(runtime, graph, batch, longest, idle=idle)
        cost.observe(batch, longest, seconds)
        if measure_sharing:
            shared = await lanes.time_shared(runtime, graph, batch, longest, idle=idle)
            sharing.shared.observe(seconds, shared)
            if own:
                pair = await lanes.time_shared(runtime, graph, batch, longest, idle=idle, own=True)
                sharing.own.observe(seconds, pair)
    full = full_batch_shape(graph, batch_tokens, runtime.info.max_seq_len)
    if full is not None and fits(*full):
        cost.observe_rate(*full, await lanes.time_full(runtime, graph, *full, idle=idle))
    if measure_sharing:  # for whoever tunes the run planner, not for a user: debug
        shared, own_limit = sharing.limits()
        log.debug(
            "model %s, graph %s: runs of up to %.1f ms (timed alone) gain two at once "
            "on its session, up to %.1f ms on the lanes' own sessions; longer ones run alone",
            runtime.info.name,
            GRAPH_LABELS[graph],
            1000 * shared,
            1000 * own_limit,
        )
    return sharing
