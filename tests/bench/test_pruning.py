"""The pruning math of ``service.engine.pruning`` and the metrics of ``bench.pruning``
on tiny hand-made arrays (no model: the benchmark itself is run by hand)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import pruning as bench
from bench.lib.models import ROOT
from service.engine import pruning
from service.engine.pruning import FdeConfig


def reference_maxsim(q: np.ndarray, d: np.ndarray) -> float:
    """Σ_i max_j q_i·d_j, term by term."""
    return sum(max(float(np.dot(qi, dj)) for dj in d) for qi in q)


def test_maxsim_is_the_formula_one_document_or_many() -> None:
    rng = np.random.default_rng(0)
    q = pruning.normalize(rng.standard_normal((5, 16)))
    docs = [pruning.normalize(rng.standard_normal((m, 16))) for m in (1, 3, 7, 2)]
    want = [reference_maxsim(q, d) for d in docs]
    assert [pruning.maxsim(q, d) for d in docs] == pytest.approx(want, abs=1e-5)
    stacked, offsets = pruning.stack(docs)
    assert offsets.tolist() == [0, 1, 4, 11, 13]
    assert pruning.maxsim_many(q, stacked, offsets) == pytest.approx(want, abs=1e-5)
    q2 = pruning.normalize(rng.standard_normal((2, 16)))
    queries, q_offsets = pruning.stack([q, q2])
    matrix = pruning.maxsim_matrix(queries, q_offsets, stacked, offsets)
    assert matrix.shape == (2, 4)
    assert matrix[1] == pytest.approx([reference_maxsim(q2, d) for d in docs], abs=1e-5)
    assert matrix[0] == pytest.approx(want, abs=1e-5)
    # The per-document max matters: the max over every stacked row is another number.
    assert [float((q @ stacked.T).max(axis=1).sum())] * len(docs) != pytest.approx(want)


def test_maxsim_explains_each_query_token_by_its_best_document_token() -> None:
    q = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    d = np.array([[0.0, 1.0], [0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    score, best = pruning.maxsim_explained(q, d)
    assert best.tolist() == [2, 0]
    assert score == pytest.approx(2.0)
    assert pruning.normalize(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist() == [
        [pytest.approx(0.6), pytest.approx(0.8)],
        [0.0, 0.0],
    ]


def test_each_rule_keeps_k_tokens_in_order_and_only_candidates() -> None:
    scores = np.array([0.1, 0.9, 0.3, 0.8, 0.2, 0.7], dtype=np.float32)
    assert pruning.keep_by_attention(scores, 3).tolist() == [1, 3, 5]
    assert pruning.keep_by_norm(scores, 2).tolist() == [1, 3]
    candidates = np.array([True, False, True, True, True, False])  # e.g. no specials
    assert pruning.keep_by_attention(scores, 3, candidates).tolist() == [2, 3, 4]
    assert pruning.keep_by_norm(scores, 9, candidates).tolist() == [0, 2, 3, 4]  # all there are
    assert pruning.keep_by_norm(np.ones(4, dtype=np.float32), 2).tolist() == [0, 1]  # ties
    rng = np.random.default_rng(0)
    picks = {tuple(pruning.keep_at_random(6, 3, rng).tolist()) for _ in range(20)}
    assert all(len(p) == 3 == len(set(p)) and list(p) == sorted(p) for p in picks)
    assert len(picks) > 1
    with pytest.raises(ValueError):
        pruning.keep_by_norm(scores, 0)


def test_attention_received_is_summed_over_rows_and_averaged_over_heads() -> None:
    # 2 layers, 2 heads, 3 tokens; rows are queries.
    maps = np.zeros((2, 2, 3, 3), dtype=np.float32)
    maps[1, 0] = [[0, 1, 0], [0, 1, 0], [0, 1, 0]]  # last layer, head 0: all to token 1
    maps[1, 1] = [[1, 0, 0], [1, 0, 0], [0, 0, 1]]
    maps[0, :] = [[0, 0, 1], [0, 0, 1], [0, 0, 1]]  # first layer: all to token 2
    assert pruning.received_attention(maps).tolist() == [1.0, 1.5, 0.5]
    assert pruning.received_attention(maps, layers="mean").tolist() == [0.5, 0.75, 1.75]
    assert pruning.received_attention(maps, rows="first").tolist() == [0.5, 0.5, 0.0]
    norms = np.ones((2, 2, 3), dtype=np.float32)
    norms[1, :, 1] = 0.0  # token 1 sends nothing
    got = pruning.received_attention(maps, value_norms=norms)
    assert got.tolist() == [1.0, 0.0, 0.5]


def test_muvera_of_a_one_vector_document_is_its_maxsim() -> None:
    """A one-vector document fills every partition with that vector, so a query's
    encoding (its vectors summed per partition) dotted with it is Σ_i q_i·d: MaxSim,
    once per repetition."""
    rng = np.random.default_rng(1)
    q = pruning.normalize(rng.standard_normal((6, 8)))
    d = pruning.normalize(rng.standard_normal((1, 8)))
    config = FdeConfig(k_sim=3, d_proj=8, repetitions=2, seed=5)
    q_fde = pruning.muvera_fde(q, config, query=True)
    d_fde = pruning.muvera_fde(d, config, query=False)
    assert q_fde.shape == d_fde.shape == (config.dim(),) == (8 * 8 * 2,)
    assert float(q_fde @ d_fde) == pytest.approx(2 * pruning.maxsim(q, d), abs=1e-5)
    # A query's empty partitions stay empty: its blocks sum to its vectors, per repetition.
    blocks = q_fde.reshape(2, 8, 8)
    assert blocks.sum(axis=1) == pytest.approx(np.stack([q.sum(axis=0)] * 2), abs=1e-5)
    # Projected, it has the projection's width, and the same draws give the same encoding.
    small = FdeConfig(k_sim=2, d_proj=4, repetitions=3)
    assert pruning.muvera_fde(q, small, query=True).shape == (4 * 4 * 3,)
    assert (
        pruning.muvera_fde(q, small, query=True) == pruning.muvera_fde(q, small, query=True)
    ).all()


def test_muvera_means_a_documents_partition() -> None:
    plane = np.array([[1.0], [0.0]], dtype=np.float32)  # one bit: the first coordinate's sign
    config = FdeConfig(k_sim=1, d_proj=2, repetitions=1)
    d = np.array([[1.0, 0.0], [0.5, 1.0], [-1.0, 2.0]], dtype=np.float32)
    got = pruning.muvera_fde(d, config, query=False, draws=[(plane, None)])
    assert got.tolist() == [-1.0, 2.0, 0.75, 0.5]  # partition 0: x<=0; 1: the mean of two
    as_query = pruning.muvera_fde(d, config, query=True, draws=[(plane, None)])
    assert as_query.tolist() == [-1.0, 2.0, 1.5, 1.0]


def test_kendall_tau_and_top_overlap_on_hand_made_rankings() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert bench.kendall_tau(x, x) == 1.0
    assert bench.kendall_tau(x, -x) == -1.0
    assert bench.kendall_tau(x, np.array([1.0, 3.0, 2.0, 4.0])) == pytest.approx(4 / 6)
    # τ-b: one tie in x leaves 5 of 6 pairs, all concordant: 5 / sqrt(5 * 6).
    ties = np.array([1.0, 2.0, 2.0, 3.0])
    assert bench.kendall_tau(ties, x) == pytest.approx(5 / np.sqrt(30))
    ref = np.arange(20, 0, -1, dtype=np.float32)  # document 0 best
    other = ref.copy()
    other[[0, 15]] = other[[15, 0]]  # the best swapped with the 16th
    assert bench.top_overlap(ref, ref) == 1.0
    assert bench.top_overlap(ref, other) == pytest.approx(0.9)
    assert bench.top_overlap(ref, -ref) == 0.0


def test_the_benchmark_on_tiny_documents_agrees_where_nothing_is_pruned(tmp_path: Path) -> None:
    """Documents of at most 8 tokens keep every vector at k=8: every rule agrees
    exactly there, and less where half the tokens go; the doc block renders."""
    rng = np.random.default_rng(2)

    def encoded(n: int, attention: bool) -> bench.Encoded:
        special = np.zeros(n, dtype=bool)
        special[[0, -1]] = True
        received = {}
        if attention:
            maps = rng.random((2, 2, n, n)).astype(np.float32)
            maps /= maps.sum(axis=-1, keepdims=True)
            norms = rng.random((2, 2, n)).astype(np.float32)
            for name, (layers, rows, scaled) in bench.ATTENTION.items():
                received[name] = pruning.received_attention(
                    maps, layers=layers, rows=rows, value_norms=norms if scaled else None
                )
        hidden = rng.standard_normal((n, 16)).astype(np.float32)
        return bench.Encoded(hidden=hidden, special=special, received=received)

    queries = [encoded(5, False) for _ in range(4)]
    documents = [encoded(int(n), True) for n in rng.integers(4, 9, size=24)]
    split = bench.evaluate(queries, documents)
    by = {(r["method"], r["column"]): r for r in split["rows"]}
    for method in bench.METHODS:
        if "no [CLS]" not in method:  # those drop two tokens even at k=8
            assert by[(method, "k=8")]["overlap"] == by[(method, "k=8")]["tau"] == 1.0
    assert by[(bench.RANDOM, "50%")]["tau"] < 1.0
    assert by[(bench.RANDOM, "k=8")]["floats"] == pytest.approx(split["unpruned_floats"])
    result = {"model": "tiny", "dev": split, "held_out": split, "seconds": 1.0}
    result["corpus"] = {"source": "synthetic", "pairs_kept": 24, "seed": 2}
    result["recommended"] = bench.recommend(result)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nkept\n")
    bench.write_doc(doc, bench.render(result))
    bench.write_doc(doc, bench.render(result))  # replaced, not appended twice
    text = doc.read_text()
    assert text.count(bench.BEGIN) == 1 and "kept" in text and bench.HEADING in text
    assert "| random (mean of 5 seeds) | 1.00 · 1.00 |" in text


def test_the_docs_section_states_the_benchmarks_own_settings() -> None:
    """docs/benchmarks.md's prose names the recipe's numbers: they are the code's."""
    text = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    section = text[text.index(bench.HEADING) :]
    assert bench.BEGIN in section and bench.END in section
    for phrase in (
        f"at least {bench.MIN_QUERY_WORDS} words",
        f"the document {bench.MIN_TOKENS}–{bench.MAX_TOKENS} tokens",
        f"shuffled with seed {bench.SEED} into two disjoint splits of {bench.DOCUMENTS}",
        f"the first {bench.QUERIES} of which give their query",
        f"the mean of {bench.RANDOM_SEEDS} seeds",
        f"top-{bench.TOP} overlap |top{bench.TOP} ∩ top{bench.TOP}'| / {bench.TOP}",
        f"top {bench.TAU_TOP} documents",
    ):
        assert phrase in section, phrase
    (_, k8, _, reps8), (_, k32, d_proj, reps32) = bench.FDE_FAMILIES
    assert f"{1 << k8} partitions unprojected ({', '.join(map(str, reps8))} repetitions)" in section
    assert f"{1 << k32} partitions projected to {d_proj} dimensions" in section
    assert f"({', '.join(map(str, reps32))} repetitions)" in section
    assert (
        f"the floats of {', '.join(map(str, bench.K_VALUES[:-1]))} and {bench.K_VALUES[-1]}"
        in section
    )
