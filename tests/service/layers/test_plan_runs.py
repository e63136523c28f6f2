"""``service.batcher.plan_runs``: how queued sequences are cut into onnxruntime runs.

Properties, for any lengths and any token budget (``fits`` as the batcher's
padded-token bound, ``batch * longest <= budget``):

- every sequence index is in exactly one run;
- a run fits the budget, or it is one sequence alone (a sequence longer than
  the budget still runs, by itself);
- runs are longest first: the concatenated runs are in descending length, so
  a run's first element is its longest (the batcher pads to it);
- runs are greedy: a run is not closed while the next sequence still fits it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.batcher import plan_runs
from tests.service.helpers import MODEL_MAX_SEQ_LEN

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
