"""``service.run_planner``: how queued sequences are cut into onnxruntime runs.

Properties, for any lengths and any token budget (``fits`` as the batcher's
padded-token bound, ``batch * longest <= budget``):

- every sequence index is in exactly one run;
- a run fits the budget, or it is one sequence alone (a sequence longer than
  the budget still runs, by itself);
- runs are longest first: the concatenated runs are in descending length, so
  a run's first element is its longest (the batcher pads to it);
- greedy (no cost model): a run is not closed while the next sequence still fits it;
- with a cost model: the same first three, and the partition's modelled cost is the
  least of every partition into contiguous runs of the sorted order (checked by brute
  force on small queues);
- the cost model recovers known coefficients from exact timings and never goes
  negative on noisy ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.run_planner import (
    OBSERVATIONS,
    REFIT_EVERY,
    REFIT_SOONEST,
    REFIT_SURPRISE,
    RunCostModel,
    plan_runs,
)
from tests.support.tiny import MODEL_MAX_SEQ_LEN

# Bounded: each example is microseconds, 200 of them a few tenths of a second.
# derandomize and no database: the same examples every run, nothing written to disk.
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None)

lengths_strategy = st.lists(st.integers(1, MODEL_MAX_SEQ_LEN), max_size=64)
budget_strategy = st.integers(1, 4096)


def token_budget(budget: int) -> Callable[[int, int], bool]:
    return lambda batch, longest: batch * longest <= budget


def check_plan(lengths: list[int], budget: int) -> list[list[int]]:
    fits = token_budget(budget)
    runs = plan_runs(lengths, fits)

    flat = [i for run in runs for i in run]
    assert sorted(flat) == list(range(len(lengths))), "each index exactly once"
    assert all(run for run in runs), "no empty run"
    for run in runs:
        longest = lengths[run[0]]
        assert longest == max(lengths[i] for i in run), "a run's first element is its longest"
        assert len(run) == 1 or fits(len(run), longest), (run, [lengths[i] for i in run])
    flat_lengths = [lengths[i] for i in flat]
    assert flat_lengths == sorted(flat_lengths, reverse=True), "descending length order"
    for run, following in itertools.pairwise(runs):
        # Greedy: the next run's first sequence would not have fitted into this run.
        assert not fits(len(run) + 1, lengths[run[0]]), (run, following)
    return runs


@PROPERTY
@given(lengths=lengths_strategy, budget=budget_strategy)
@example(lengths=[], budget=1)
@example(lengths=[MODEL_MAX_SEQ_LEN] * 3, budget=1)  # every sequence beyond the budget
@example(lengths=[1] * 64, budget=4096)  # everything fits one run
def test_plan_runs_properties(lengths: list[int], budget: int) -> None:
    check_plan(lengths, budget)


@PROPERTY
@given(lengths=lengths_strategy, budget=st.integers(MODEL_MAX_SEQ_LEN, 4096))
def test_every_run_is_within_a_budget_that_covers_each_sequence(
    lengths: list[int], budget: int
) -> None:
    """With every sequence within the budget, padded tokens per run stay within it."""
    runs = check_plan(lengths, budget)
    for run in runs:
        assert len(run) * lengths[run[0]] <= budget


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([], 10, []),
        ([5], 1, [[0]]),  # too long for the budget: alone, never dropped
        ([3, 9, 1, 9], 18, [[1, 3], [0, 2]]),  # 9+9 padded = 18 fits; then 3 and 1
        ([2, 2, 2, 2], 6, [[0, 1, 2], [3]]),  # ties keep their order (sorted is stable)
        ([4, 8, 6], 100, [[1, 2, 0]]),
    ],
)
def test_plan_runs_examples(lengths: list[int], budget: int, expected: list[list[int]]) -> None:
    assert check_plan(lengths, budget) == expected


def check_partition(lengths: list[int], runs: list[list[int]], fits: Callable[[int, int], bool]):
    flat = [i for run in runs for i in run]
    assert sorted(flat) == list(range(len(lengths))), "each index exactly once"
    flat_lengths = [lengths[i] for i in flat]
    assert flat_lengths == sorted(flat_lengths, reverse=True), "descending length order"
    for run in runs:
        assert run and (len(run) == 1 or fits(len(run), lengths[run[0]]))


def cost_of(runs: list[list[int]], lengths: list[int], cost: Callable[[int, int], float]) -> float:
    return sum(cost(len(run), lengths[run[0]]) for run in runs)


def brute_force_least_cost(
    lengths: list[int], fits: Callable[[int, int], bool], cost: Callable[[int, int], float]
) -> float:
    """Every partition of the sorted order into contiguous runs that fit."""
    order = sorted(lengths, reverse=True)
    if not order:
        return 0.0
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=max(len(order) - 1, 0)):
        runs, current = [], [0]
        for k, cut in enumerate(cuts, start=1):
            if cut:
                runs.append(current)
                current = [k]
            else:
                current.append(k)
        runs.append(current)
        if all(len(r) == 1 or fits(len(r), order[r[0]]) for r in runs):
            best = min(best, sum(cost(len(r), order[r[0]]) for r in runs))
    return best


def attention_like(a: float, b: float, c: float) -> Callable[[int, int], float]:
    return lambda batch, longest: a + batch * longest * (b + c * longest)


@PROPERTY
@given(
    lengths=st.lists(st.integers(1, MODEL_MAX_SEQ_LEN), max_size=9),
    budget=st.integers(1, 1024),
    a=st.floats(0, 0.01),
    b=st.floats(0, 1e-4),
    c=st.floats(0, 1e-6),
)
def test_the_planned_partition_is_the_least_costly(
    lengths: list[int], budget: int, a: float, b: float, c: float
) -> None:
    fits, cost = token_budget(budget), attention_like(a, b, c)
    runs = plan_runs(lengths, fits, cost)
    check_partition(lengths, runs, fits)
    least = brute_force_least_cost(lengths, fits, cost)
    assert cost_of(runs, lengths, cost) == pytest.approx(least, rel=1e-9, abs=1e-15)


@PROPERTY
@given(lengths=lengths_strategy, budget=budget_strategy)
def test_planned_runs_keep_every_bound_on_long_queues(lengths: list[int], budget: int) -> None:
    fits = token_budget(budget)
    check_partition(lengths, plan_runs(lengths, fits, attention_like(2e-3, 1e-5, 1e-8)), fits)


def test_padding_is_split_off_only_when_it_costs_more_than_a_run() -> None:
    lengths = [60, 58, 12, 10, 9, 8]
    fits = token_budget(4096)
    greedy = plan_runs(lengths, fits)
    assert greedy == [[0, 1, 2, 3, 4, 5]]  # one run padded to 60
    # Per-token work dominates: the short ones run apart from the long ones.
    assert plan_runs(lengths, fits, attention_like(1e-4, 1e-5, 0)) == [[0, 1], [2, 3, 4, 5]]
    # A run's fixed cost dominates: one run, as greedy.
    assert plan_runs(lengths, fits, attention_like(1.0, 1e-5, 0)) == greedy


def test_a_fit_without_fixed_cost_still_merges_equal_sequences() -> None:
    """Timings exactly proportional to B·T fit a = 0; equal sequences must still run
    together (before MIN_RUN_SECONDS every partition tied and each ran alone)."""
    model = RunCostModel()
    for batch, longest in [(1, 8), (1, 64), (8, 16), (4, 64), (2, 128), (8, 128)]:
        model.observe(batch, longest, 1e-6 * batch * longest)
    assert model.coefficients is not None and model.coefficients[0] == pytest.approx(0, abs=1e-9)
    assert plan_runs([128] * 8, token_budget(4096), model) == [list(range(8))]


def test_the_cost_model_recovers_known_coefficients() -> None:
    model = RunCostModel()
    truth = attention_like(1.5e-3, 2e-6, 3e-9)
    for batch, longest in [(1, 8), (1, 64), (8, 16), (4, 64), (2, 128), (8, 128)]:
        model.observe(batch, longest, truth(batch, longest))
    assert model.fitted and model.coefficients is not None
    for got, want in zip(model.coefficients, (1.5e-3, 2e-6, 3e-9), strict=True):
        assert got == pytest.approx(want, rel=1e-6)


SHAPES = [(1, 8), (1, 64), (8, 16), (4, 64), (2, 128), (8, 128)]


def fitted_on(truth: Callable[[int, int], float]) -> RunCostModel:
    """A model whose first fit came from runs exactly on ``truth``."""
    model = RunCostModel()
    for batch, longest in SHAPES:
        model.observe(batch, longest, truth(batch, longest))
    assert model.fitted
    return model


def test_the_cost_model_refits_rarely_while_it_predicts_well() -> None:
    """Runs within REFIT_SURPRISE of the model wait REFIT_EVERY runs for a refit (a
    refit costs the event loop 0.7-1 ms; every 16 runs it was 2% of it at [1,16])."""
    truth = attention_like(1.5e-3, 2e-6, 3e-9)
    model = fitted_on(truth)
    first = model.coefficients
    slower = 1.2  # within REFIT_SURPRISE: not a surprise, yet a refit would move the fit
    assert slower < REFIT_SURPRISE
    runs = 0
    while model.coefficients == first:
        batch, longest = SHAPES[runs % len(SHAPES)]
        model.observe(batch, longest, slower * truth(batch, longest))
        runs += 1
        assert runs <= REFIT_EVERY
    assert runs > REFIT_EVERY - len(SHAPES)  # the first fit came with the 4th shape
    assert runs >= 100  # it was every 16


def test_runs_far_from_the_model_bring_the_refit_forward_and_it_converges() -> None:
    """The machine turns 3x slower: refits come every REFIT_SOONEST runs until the model
    is within REFIT_SURPRISE of them, and once the window has held only such runs for
    a routine refit, the model predicts them exactly."""
    truth = attention_like(1.5e-3, 2e-6, 3e-9)
    model = fitted_on(truth)
    first = model.coefficients
    for run in range(OBSERVATIONS + REFIT_EVERY):
        batch, longest = SHAPES[run % len(SHAPES)]
        model.observe(batch, longest, 3 * truth(batch, longest))
        if run == REFIT_SOONEST - 1:
            assert model.coefficients != first
        if run == 8 * REFIT_SOONEST:
            for b, t in SHAPES:
                assert 3 * truth(b, t) / REFIT_SURPRISE <= model(b, t) <= 3 * truth(b, t)
    for batch, longest in SHAPES:
        assert model(batch, longest) == pytest.approx(3 * truth(batch, longest), rel=1e-6)


def test_architecture_states_the_refit_cadence() -> None:
    page = Path(__file__).parents[3] / "docs" / "architecture.md"
    text = " ".join(page.read_text(encoding="utf-8").split())
    assert (
        f"refitted every {REFIT_EVERY} runs while they fall within {REFIT_SURPRISE}× of it"
        f" and every {REFIT_SOONEST} while they do not"
    ) in text


def test_the_cost_model_waits_for_enough_shapes_and_stays_non_negative() -> None:
    model = RunCostModel()
    for _ in range(3):
        model.observe(1, 16, 0.002)
    assert not model.fitted  # one shape says nothing about B or T
    rng = np.random.default_rng(0)
    for batch, longest in [(1, 8), (8, 16), (4, 64), (2, 128), (16, 16)]:
        # Larger runs measured as cheaper (noise): a fit must still not go negative.
        model.observe(batch, longest, float(0.004 * rng.uniform(0.5, 1.5) / batch))
    assert model.fitted and model.coefficients is not None
    assert min(model.coefficients) >= 0 and model(8, 128) > 0
