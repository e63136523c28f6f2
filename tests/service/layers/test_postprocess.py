"""``service.engine.postprocess`` against numpy references written here, loop by loop.

Real attention maps come from the runtime on tiny. Inputs are scaled by SHARP:
at unit scale tiny's random weights give near-uniform attention, where a wrong
head, layer or rollout order would still pass; scaled, heads and layers differ
by ~1e-1 and the two rollout orders by 2e-3..1e-2 (measured), far beyond the
1e-6 tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from model_export import graph_io
from service.engine import postprocess
from service.errors import InvalidInput
from service.runtime import ModelRuntime
from tests.support.inputs import sequences
from tests.support.tiny import D_MODEL, N_HEADS, N_LAYERS

SHARP = 8.0
# Rollout is computed in float64 and returned as float32: values in [0, 1] round by
# <= 6e-8, so 1e-6 against the float64 reference is float32 rounding plus margin.
ATOL_ROLLOUT = 1e-6
ATOL_ROW_SUM = 1e-5  # rows of float32 softmax maps, mixed and multiplied
ATOL_MEAN = 1e-6  # float32 mean of a few values in [0, 1] vs a float64 loop
ATOL_UNIT = 1e-6  # norm of a float32 unit vector
ATOL_POOL = 1e-6  # float32 pooling vs a float64 loop, values ~N(0, 1)


def real_attention(runtime: ModelRuntime, n: int, seed: int) -> np.ndarray:
    """One sequence's attention maps from tiny's attention graph: [L, H, n, n]."""
    (seq,) = sequences((n,), seed)
    embeds = (SHARP * seq)[None]  # (1, n, d)
    mask = np.ones((1, n), dtype=np.int64)  # (1, n)
    outputs = runtime.run(embeds, mask, graph_io.GRAPH_ATTENTION)
    assert list(outputs) == list(graph_io.GRAPH_OUTPUTS[graph_io.GRAPH_ATTENTION])
    assert outputs[graph_io.OUTPUT_HIDDEN].shape == (1, n, D_MODEL)
    attn = outputs[graph_io.OUTPUT_ATTENTIONS]
    assert attn.shape == (1, N_LAYERS, N_HEADS, n, n)
    return attn[0]


def random_attention(layers: int, heads: int, n: int, seed: int) -> np.ndarray:
    """Row-stochastic float32 maps [L, H, n, n], sharper than uniform."""
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal((layers, heads, n, n))
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


def reference_rollout(attn: np.ndarray, *, bottom_up: bool = True) -> np.ndarray:
    """Abnar & Zuidema rollout, loop by loop in float64: [L, H, n, n] -> [n, n].

    Per layer: average the heads, mix with the identity (0.5 A + 0.5 I), normalise each
    row to sum 1. Then R = Â_L ... Â_1 (layer 1 applied first). ``bottom_up=False`` is
    the wrong order, Â_1 ... Â_L, kept to show that these tests tell the two apart.
    """
    n_layers, n_heads, n, _ = attn.shape
    mixed = []
    for layer in range(n_layers):
        average = np.zeros((n, n))
        for head in range(n_heads):
            average += attn[layer, head].astype(np.float64)
        average /= n_heads
        a_hat = 0.5 * average + 0.5 * np.eye(n)
        for row in range(n):
            a_hat[row] /= a_hat[row].sum()
        mixed.append(a_hat)
    product = np.eye(n)
    # Left to right: Â_L @ Â_{L-1} @ ... @ Â_1 (or Â_1 @ ... @ Â_L if not bottom_up).
    for a_hat in reversed(mixed) if bottom_up else mixed:
        product = product @ a_hat
    return product


# -- rollout ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 9, 33])
def test_rollout_matches_reference_on_real_maps(tiny_runtime: ModelRuntime, n: int) -> None:
    attn = real_attention(tiny_runtime, n, seed=n)
    got = postprocess.rollout(attn)
    assert got.shape == (1, 1, n, n) and got.dtype == np.float32
    np.testing.assert_allclose(got[0, 0], reference_rollout(attn), rtol=0, atol=ATOL_ROLLOUT)


@pytest.mark.parametrize(("layers", "heads", "n"), [(1, 1, 4), (3, 2, 7), (6, 12, 16)])
def test_rollout_matches_reference_on_random_maps(layers: int, heads: int, n: int) -> None:
    attn = random_attention(layers, heads, n, seed=layers * 100 + n)
    np.testing.assert_allclose(
        postprocess.rollout(attn)[0, 0], reference_rollout(attn), rtol=0, atol=ATOL_ROLLOUT
    )


@pytest.mark.parametrize("n", [2, 17, 64])
def test_rollout_order_is_distinguishable(tiny_runtime: ModelRuntime, n: int) -> None:
    """The reference in the wrong order is far outside the tolerance on these maps, so the
    comparison above would catch a service that multiplied top-down."""
    attn = real_attention(tiny_runtime, n, seed=n)
    wrong = reference_rollout(attn, bottom_up=False)
    gap = np.abs(postprocess.rollout(attn)[0, 0] - wrong).max()
    assert gap > 100 * ATOL_ROLLOUT, gap


@pytest.mark.parametrize("n", [1, 5, 40, 128])
def test_rollout_rows_of_real_maps_sum_to_one(tiny_runtime: ModelRuntime, n: int) -> None:
    attn = real_attention(tiny_runtime, n, seed=100 + n)
    np.testing.assert_allclose(attn.sum(axis=-1), 1.0, rtol=0, atol=ATOL_ROW_SUM)
    for layers in ([0, 1], [1], [0]):
        rolled = postprocess.select_attention(attn, layers, list(range(N_HEADS)), "rollout")
        assert rolled.shape == (1, 1, n, n)
        np.testing.assert_allclose(rolled.sum(axis=-1), 1.0, rtol=0, atol=ATOL_ROW_SUM)
        assert (rolled >= 0).all()


# -- select_attention ---------------------------------------------------------------------

SELECTIONS = [
    ([0, 1], [0, 1, 2, 3]),
    ([1, 0], [3, 1]),  # the order asked is the order returned
    ([1], [2]),
    ([0, 0], [1, 1]),  # repeats are kept
]


@pytest.mark.parametrize(("layers", "heads"), SELECTIONS)
def test_select_attention_none_mean_max(
    tiny_runtime: ModelRuntime, layers: list[int], heads: list[int]
) -> None:
    n = 11
    attn = real_attention(tiny_runtime, n, seed=7)
    chosen = np.zeros((len(layers), len(heads), n, n), dtype=np.float32)
    mean = np.zeros((len(layers), 1, n, n))
    top = np.full((len(layers), 1, n, n), -np.inf, dtype=np.float32)
    for i, layer in enumerate(layers):
        for j, head in enumerate(heads):
            chosen[i, j] = attn[layer, head]
            mean[i, 0] += attn[layer, head].astype(np.float64) / len(heads)
            top[i, 0] = np.maximum(top[i, 0], attn[layer, head])

    np.testing.assert_array_equal(postprocess.select_attention(attn, layers, heads, "none"), chosen)
    got_mean = postprocess.select_attention(attn, layers, heads, "mean")
    assert got_mean.shape == (len(layers), 1, n, n)
    np.testing.assert_allclose(got_mean, mean, rtol=0, atol=ATOL_MEAN)
    np.testing.assert_array_equal(postprocess.select_attention(attn, layers, heads, "max"), top)


def test_select_attention_rollout_uses_only_the_chosen_heads(tiny_runtime: ModelRuntime) -> None:
    attn = real_attention(tiny_runtime, 13, seed=3)
    got = postprocess.select_attention(attn, [0, 1], [2, 0], "rollout")
    expected = reference_rollout(attn[:, [2, 0]])
    np.testing.assert_allclose(got[0, 0], expected, rtol=0, atol=ATOL_ROLLOUT)


# -- pool -----------------------------------------------------------------------------------


def reference_pool(hidden: np.ndarray, pooling: str, skip: int = 0) -> np.ndarray:
    n, d = hidden.shape
    out = np.zeros(d)
    for k in range(d):
        column = [float(hidden[t, k]) for t in range(skip, n)]
        out[k] = {
            "mean": sum(column) / len(column),
            "max": max(column),
            "cls": column[0],
            "last": column[-1],
        }[pooling]
    return out


POOLINGS = ["mean", "max", "cls", "last"]


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("n", [1, 6, 50])
def test_pool_matches_reference(pooling: str, n: int) -> None:
    (hidden,) = sequences((n,), seed=n)
    got = postprocess.pool(hidden, pooling, normalize=False)
    assert got.shape == (D_MODEL,) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference_pool(hidden, pooling), rtol=0, atol=ATOL_POOL)


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize(("n", "skip"), [(6, 3), (4, 3), (50, 1)])
def test_pool_leaves_the_first_skip_tokens_out(pooling: str, n: int, skip: int) -> None:
    """include_prompt false: a prompt's tokens ([CLS] with them) are not pooled; cls is
    then the first token after them (sentence-transformers' Pooling)."""
    (hidden,) = sequences((n,), seed=n + skip)
    hidden[:skip] += 5.0  # the left-out tokens would move every pooling but last's
    got = postprocess.pool(hidden, pooling, normalize=False, skip=skip)
    want = reference_pool(hidden, pooling, skip)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL_POOL)
    if pooling != "last":  # the last token is kept either way
        assert np.abs(want - reference_pool(hidden, pooling)).max() > 1e-3


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("dimensions", [None, 1, 8, D_MODEL])
def test_pool_normalize_and_dimensions(pooling: str, dimensions: int | None) -> None:
    (hidden,) = sequences((9,), seed=5)
    width = D_MODEL if dimensions is None else dimensions
    reference = reference_pool(hidden, pooling)[:width]  # truncate first...

    truncated = postprocess.pool(hidden, pooling, normalize=False, dimensions=dimensions)
    assert truncated.shape == (width,)
    np.testing.assert_allclose(truncated, reference, rtol=0, atol=ATOL_POOL)

    unit = postprocess.pool(hidden, pooling, normalize=True, dimensions=dimensions)
    assert unit.shape == (width,) and unit.dtype == np.float32
    assert abs(float(np.linalg.norm(unit.astype(np.float64))) - 1.0) <= ATOL_UNIT
    # ...then renormalise: the direction of the truncated vector, not of the full one.
    np.testing.assert_allclose(unit, reference / np.linalg.norm(reference), rtol=0, atol=ATOL_UNIT)


def test_normalizing_a_zero_vector_gives_zeros_not_nan() -> None:
    hidden = np.zeros((3, D_MODEL), dtype=np.float32)
    np.testing.assert_array_equal(postprocess.pool(hidden, "mean", normalize=True), 0.0)


# -- resolve_indices ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("indices", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ([0], [0]),
        ([-1], [3]),
        ([-4, 3, -2, 1], [0, 3, 2, 1]),
    ],
)
def test_resolve_indices(indices: list[int] | None, expected: list[int]) -> None:
    assert postprocess.resolve_indices(indices, 4, "heads", ("attention", "heads")) == expected


@pytest.mark.parametrize(
    ("indices", "repeated"),
    [([2, 2], "[2]"), ([0, -4], "[0]"), ([1, 0, -3, 3, -1], "[1, 3]"), ([0] * 200_000, "[0]")],
)
def test_resolve_indices_refuses_repeats(indices: list[int], repeated: str) -> None:
    """A repeat would multiply work and answer: refused, naming the repeated indices once."""
    with pytest.raises(InvalidInput) as info:
        postprocess.resolve_indices(indices, 4, "heads", ("attention", "heads"))
    assert info.value.field == ("attention", "heads")
    assert f"heads {repeated} repeated" in info.value.message


def test_out_of_range_errors_stay_short() -> None:
    """200,000 bad indices are named by their first ten, not echoed whole."""
    with pytest.raises(InvalidInput) as info:
        postprocess.resolve_indices(list(range(5, 200_005)), 4, "heads", ("attention", "heads"))
    assert info.value.message.startswith("[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, ...] out of range")


@pytest.mark.parametrize("indices", [[2], [-3], [0, 5], [], [1, -9, 7]])
@pytest.mark.parametrize(
    ("what", "where"),
    [
        ("layers", ("attention", "layers")),
        ("heads", ("attention", "heads")),
        ("hidden states", ("hidden_states", "layers")),
    ],
)
def test_resolve_indices_rejects_with_the_field(
    indices: list[int], what: str, where: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidInput) as info:
        postprocess.resolve_indices(indices, 2, what, where)
    assert info.value.field == where
    if indices:
        bad = [i for i in indices if not -2 <= i < 2]
        assert str(bad) in info.value.message and "-2..1" in info.value.message
        assert f"the model has 2 {what}" in info.value.message
