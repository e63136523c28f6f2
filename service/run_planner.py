"""Which queued sequences run together: padding-aware run planning.

A run of B sequences padded to T tokens costs about ``a + b·B·T + c·B·T²``
seconds: a fixed cost per run (session call, padding, cutting), the work per
padded token, and attention's quadratic term. Greedy packing (longest first,
as many as fit) pads every short sequence to the longest in its run; splitting
costs one more ``a``. :class:`RunCostModel` fits ``a, b, c`` per graph from
measured runs (timed shapes at warm-up, then every live run), and
:func:`plan_runs` picks, among the partitions of the length-sorted queue into
contiguous runs that each fit the memory bounds, the one with the least
modelled time: for sorted lengths a contiguous partition is optimal, and a
dynamic programme over the prefixes finds it exactly in O(n·k) (k: the most
sequences one run may hold).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from itertools import combinations

import numpy as np

# Runs kept per graph for the fit (the newest win: the machine's load changes).
OBSERVATIONS = 256
# Runs between refits of a model, once it has its first fit, while it predicts them well.
# A refit (the non-negative fit over up to OBSERVATIONS runs) costs 0.7-1 ms
# of the event loop: every 16 runs it was 2% of the loop's busy time at [1,16] c=1.
REFIT_EVERY = 128
# A run off its modelled time by more than this factor (either way) is a surprise: the
# refit then comes as soon as REFIT_SOONEST runs have passed since the last one.
REFIT_SURPRISE = 1.5
REFIT_SOONEST = 16
# Distinct (B, T) shapes needed before a model is trusted.
MIN_SHAPES = 4
# What a run costs at the least, whatever the fit says (a thread hand-over and a session
# call): a fit whose fixed cost came out 0 would make every partition of equal sequences
# cost the same, and the planner would run them one by one.
MIN_RUN_SECONDS = 1e-4

# A run holding at least this share of the batch budget in padded tokens is a full run:
# its seconds per padded token are the full-batch rate (``RunCostModel.estimate``).
FULL_RUN_SHARE = 0.5
# Weight of each new full run in that rate (an exponential average: the load changes).
FULL_RATE_WEIGHT = 0.25

Fits = Callable[[int, int], bool]  # (sequences in the run, its longest) -> within bounds
Cost = Callable[[int, int], float]  # (sequences in the run, its longest) -> seconds


class RunCostModel:
    """``seconds ≈ a + b·B·T + c·B·T²``, fitted to relative error, coefficients ≥ 0;
    with ``batch_tokens`` (the batch budget), also the full-batch rate: seconds per
    padded token of the runs filling at least ``FULL_RUN_SHARE`` of it."""

    def __init__(self, batch_tokens: int | None = None) -> None:
        self._runs: deque[tuple[int, int, float]] = deque(maxlen=OBSERVATIONS)
        self._since_fit = 0
        self._surprised = False  # a run since the last fit was far from its modelled time
        self.coefficients: tuple[float, float, float] | None = None
        self._full_tokens = None if batch_tokens is None else FULL_RUN_SHARE * batch_tokens
        self.full_rate: float | None = None  # seconds per padded token of full runs

    def observe(self, batch: int, longest: int, seconds: float) -> None:
        """One measured run; the model is refitted every ``REFIT_EVERY`` runs, or every
        ``REFIT_SOONEST`` while runs surprise it (the load changed)."""
        if seconds <= 0:
            return
        self.observe_rate(batch, longest, seconds)
        self._runs.append((batch, longest, seconds))
        self._since_fit += 1
        if self.coefficients is None:
            self.fit()
            return
        modelled = self(batch, longest)
        if not modelled / REFIT_SURPRISE <= seconds <= modelled * REFIT_SURPRISE:
            self._surprised = True
        if self._since_fit >= (REFIT_SOONEST if self._surprised else REFIT_EVERY):
            self.fit()

    def observe_rate(self, batch: int, longest: int, seconds: float) -> None:
        """One measured run, for the full-batch rate only (if it is a full run): the
        calibration's full batch, kept out of the fit, where a single large point
        among the small shapes bent the quadratic term (it put MiniLM's [16, 256]
        at 1.7 s against 1.24 measured)."""
        if seconds > 0 and self._full(batch, longest):
            rate = seconds / (batch * longest)
            known = self.full_rate
            self.full_rate = rate if known is None else known + FULL_RATE_WEIGHT * (rate - known)

    def fit(self) -> None:
        if len({(b, t) for b, t, _ in self._runs}) < MIN_SHAPES:
            return
        self._since_fit = 0
        self._surprised = False
        runs = np.array(self._runs, dtype=np.float64)
        batch, longest, seconds = runs[:, 0], runs[:, 1], runs[:, 2]
        features = np.stack([np.ones_like(batch), batch * longest, batch * longest**2], axis=1)
        self.coefficients = _non_negative_fit(features / seconds[:, None], np.ones_like(seconds))

    def __call__(self, batch: int, longest: int) -> float:
        if self.coefficients is None:
            raise RuntimeError("the run cost model has no fit yet")
        a, b, c = self.coefficients
        return max(a, MIN_RUN_SECONDS) + batch * longest * (b + c * longest)

    def estimate(self, batch: int, longest: int) -> float:
        """A run's seconds for admission: the full-batch rate for a full run once
        measured, else the fit. The fit is mostly small runs (calibration's and the
        live ones), whose seconds per token are lower while they fit in the caches: it
        put MiniLM's full batches (4,096 tokens, 2 cores) 20-35 % under their time."""
        if self.full_rate is not None and self._full(batch, longest):
            return self.full_rate * batch * longest
        return self(batch, longest)

    def _full(self, batch: int, longest: int) -> bool:
        return self._full_tokens is not None and batch * longest >= self._full_tokens

    @property
    def fitted(self) -> bool:
        return self.coefficients is not None


def _non_negative_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares with every coefficient ≥ 0: the best of the fits on each subset of
    the three features whose own solution is non-negative (8 tiny solves)."""
    best: tuple[float, np.ndarray] | None = None
    for size in (3, 2, 1):
        for subset in combinations(range(3), size):
            solution, *_ = np.linalg.lstsq(x[:, subset], y, rcond=None)
            if (solution < 0).any():
                continue
            full = np.zeros(3)
            full[list(subset)] = solution
            error = float(np.sum((x @ full - y) ** 2))
            if best is None or error < best[0]:
                best = (error, full)
    assert best is not None  # a single feature with positive values fits non-negatively
    a, b, c = best[1]
    return float(a), float(b), float(c)


def memory_bounds(
    max_tokens: int, maps: float, max_attention_floats: int, per_token: int = 0
) -> Fits:
    """(sequences, longest) -> within the bounds of one run: padded tokens bound the
    embeddings; with ``maps`` attention maps per sequence (0: none returned), their
    floats grow with longest², so they get their own budget (the graph's memory is
    mostly these), which also bounds ``per_token`` floats a graph makes per token
    (SPLADE's logits over the vocabulary)."""

    def fits(batch: int, longest: int) -> bool:
        if batch * longest > max_tokens:
            return False
        floats = batch * maps * longest * longest + batch * longest * per_token
        return floats <= max_attention_floats

    return fits


# The compact attention graph's [B, h, T, T] buffers alive at once, at its peak: the
# scores, the bias added, their softmax, the entropy's clamp, log and product, the
# distance's product, and the next layer's first ones before the last are freed (the
# graph runs without onnxruntime's arena). Measured: one 512-token sequence through
# all-mpnet-base-v2 (12 heads) peaked 192 MiB over its RSS before, 15.3 such maps.
COMPACT_LAYER_MAPS = 16
COMPACT_SUMMARIES = 6  # graph_io.SUMMARIES, one float each per query row


def compact_run_floats(n_layers: int, n_heads: int, top_k: int) -> tuple[int, int]:
    """(maps, floats per token) of one compact attention run for ``memory_bounds``: one
    layer's transient maps, and per token every layer's and head's top-k weights and
    indices (4 bytes each) and row summaries."""
    return COMPACT_LAYER_MAPS * n_heads, n_layers * n_heads * (2 * top_k + COMPACT_SUMMARIES)


# The selected-maps graph at its peak: one layer's transient maps, as the compact graph
# (the same unfused layer), and each kept map about 4 times (its selected copy, the copy
# masked at padded rows, the concatenated output, and what the allocator keeps of the
# freed ones). Measured: one 512-token sequence through all-mpnet-base-v2 (12 x 12),
# peak RSS over the RSS before: every map float32 756 MiB (768 by this count), float16
# 480 (480), one layer 216 (240), one head of one layer 192 (194); the full graph 985.
SELECTED_KEPT_MAPS = 4


def selected_run_maps(n_heads: int, kept: int, half: bool) -> float:
    """Maps (float32 [T, T] each) per sequence of one selected-maps run keeping ``kept``
    (layer, head) maps, in float16 if ``half``, for ``memory_bounds``."""
    return COMPACT_LAYER_MAPS * n_heads + SELECTED_KEPT_MAPS * kept * (0.5 if half else 1.0)


def plan_runs(lengths: list[int], fits: Fits, cost: Cost | None = None) -> list[list[int]]:
    """Sequence indices grouped into runs, longest first.

    Without ``cost``: greedy, each run as full as ``fits`` allows. With it: the
    partition of the length-sorted sequences into contiguous runs, each within
    ``fits``, whose summed ``cost(batch, longest)`` is least.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    if cost is None:
        return _greedy(order, lengths, fits)
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[i]: least cost of the first i sequences
    cut = [0] * (n + 1)  # where the last run of that best partition starts
    for end in range(1, n + 1):
        for start in range(end - 1, -1, -1):
            batch, longest = end - start, lengths[order[start]]  # sorted: first is longest
            # A longer run from an earlier start only holds more, longer sequences; one
            # sequence always runs, alone (its own limits were checked upstream).
            if batch > 1 and not fits(batch, longest):
                break
            total = best[start] + cost(batch, longest)
            if total < best[end]:
                best[end], cut[end] = total, start
    runs: list[list[int]] = []
    end = n
    while end > 0:
        runs.append(order[cut[end] : end])
        end = cut[end]
    return runs[::-1]


def _greedy(order: list[int], lengths: list[int], fits: Fits) -> list[list[int]]:
    runs: list[list[int]] = []
    for i in order:
        # Sorted descending, so the run's first sequence is its longest.
        if runs and fits(len(runs[-1]) + 1, lengths[runs[-1][0]]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


# Two runs at once must beat one at a time by this much for a run's class to share the
# lanes: below it, the gain is within a calibration's noise, and a shared run costs its
# own request latency (it gets half the cores).
MIN_SHARING_GAIN = 1.1
# How far beyond the largest calibrated run the fitted trend is trusted.
SHARING_EXTRAPOLATION = 4.0


class SharingModel:
    """Which runs of one graph go faster two at a time than one at a time, on one kind
    of session (the graph's own, or each lane's own).

    Calibration times each of its shapes alone (``t``) and two at once on two lanes
    (``t2``); the gain ``2·t / t2`` falls as runs grow (a large run already keeps the
    cores busy). The gain is fitted linearly in ``log t``, and runs whose modelled
    time alone is at most where the fit crosses ``MIN_SHARING_GAIN`` share the lanes;
    the others run alone. No calibration, no sharing.
    """

    def __init__(self) -> None:
        self._points: list[tuple[float, float]] = []  # (seconds alone, gain)
        self.limit_seconds = 0.0
        self._line = (0.0, 0.0)  # (slope, intercept) of the gain in log t

    def observe(self, alone: float, shared_pair: float) -> None:
        if alone > 0 and shared_pair > 0:
            self._points.append((alone, 2 * alone / shared_pair))
            self._fit()

    def _fit(self) -> None:
        seconds = np.log([t for t, _ in self._points])
        gains = np.array([g for _, g in self._points])
        largest = float(np.exp(seconds.max()))
        if len(self._points) < 2 or np.ptp(seconds) < 1e-9:
            self._line = (0.0, float(gains.mean()))
            self.limit_seconds = largest if gains.min() >= MIN_SHARING_GAIN else 0.0
            return
        slope, intercept = np.polyfit(seconds, gains, 1)
        self._line = (float(slope), float(intercept))
        if slope >= 0:  # no fall within the range measured
            shares = intercept + slope * seconds.max() >= MIN_SHARING_GAIN
            self.limit_seconds = largest * SHARING_EXTRAPOLATION if shares else 0.0
            return
        crossing = float(np.exp((MIN_SHARING_GAIN - intercept) / slope))
        self.limit_seconds = min(crossing, largest * SHARING_EXTRAPOLATION)

    @property
    def observed(self) -> int:
        """Shapes measured."""
        return len(self._points)

    def shares(self, seconds_alone: float) -> bool:
        return seconds_alone <= self.limit_seconds

    def gain(self, seconds_alone: float) -> float:
        """The fitted gain of two such runs at once (0 where they do not share)."""
        if not self.shares(seconds_alone):
            return 0.0
        slope, intercept = self._line
        return intercept + slope * float(np.log(seconds_alone))


class Placement(enum.Enum):
    """Where one run goes: alone on every lane, on one lane with the graph's own session,
    or on one lane with that lane's own session."""

    ALONE = "alone"
    SHARED = "shared"
    OWN = "own"


class LaneModel:
    """How one graph's runs use the lanes, by their modelled time alone: ``k`` sessions
    × ``t`` threads. Two at once on the graph's own session (``shared``), two at once
    on the lanes' own sessions (``own``, when the graph has them), or one at a time
    with every thread (``ALONE``): the placement of the larger measured gain, where
    it reaches ``MIN_SHARING_GAIN``."""

    def __init__(self) -> None:
        self.shared = SharingModel()
        self.own = SharingModel()  # never observed: the graph has no lane sessions

    def place(self, seconds_alone: float) -> Placement:
        shared, own = self.shared.gain(seconds_alone), self.own.gain(seconds_alone)
        if not shared and not own:
            return Placement.ALONE
        return Placement.OWN if own >= shared else Placement.SHARED

    def limits(self) -> tuple[float, float]:
        """(shared, own): the longest run alone, in seconds, each sharing placement takes."""
        return self.shared.limit_seconds, self.own.limit_seconds
