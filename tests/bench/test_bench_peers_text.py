"""T2, the query workload of bench.peers: its held set of texts, the load client sending
each once, the checked calls, and the length-sorted in-process limit on the real
all-MiniLM-L6-v2 (answers against one text at a time, tolerance 1e-4 as every check)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.lib.http import Request
from bench.lib.load import load_run
from bench.peers.checks import CHECKED_QUERIES, checked_calls
from bench.peers.common import ATOL
from bench.peers.limit import settings, text_batch_sizes, text_window
from bench.peers.workers.inproc_worker import Text, run_task
from bench.peers.workloads import QUERIES, WORKLOADS, query_texts
from tests.bench.echo_server import Recorder, echo_server

BY_KEY = {w.key: w for w in WORKLOADS}


def test_the_query_texts_are_a_fixed_held_set_of_different_6_to_30_word_texts() -> None:
    texts = query_texts()
    assert len(texts) == QUERIES == 3000
    assert len(set(texts)) == len(texts)  # all different: no server can cache an answer
    words = [len(t.split()) for t in texts]
    assert min(words) == 6 and max(words) == 30
    assert texts == query_texts()  # seeded: the same texts every run, in the same order
    assert query_texts(10, seed=1) != texts[:10]


def test_the_load_client_sends_every_request_once_over_all_connections() -> None:
    """Before, each connection began at request 0: at c=32 every text went 32 times."""
    requests = [Request("/q", b"%d" % i) for i in range(64)]
    recorder = Recorder()
    with echo_server(recorder) as port:
        stats, _ = load_run(port, requests, concurrency=4, count=48, seconds=30)
    assert stats["requests"] == 48
    assert len(recorder.bodies) == 8 + 48  # the warm-up (2 per connection), then the run
    assert len(set(recorder.bodies)) == len(recorder.bodies)


def test_t2_checks_a_spread_of_the_held_set_and_t1_every_batch() -> None:
    spread = checked_calls(BY_KEY["T2"], QUERIES)
    assert len(spread) == CHECKED_QUERIES and spread[0] == 0 and spread[-1] > QUERIES // 2
    assert checked_calls(BY_KEY["T1"], 4) == [0, 1, 2, 3]
    assert checked_calls(BY_KEY["W1"], 1) == [0]


def test_the_text_limit_sweeps_what_a_server_could_hold() -> None:
    t2, t2l, t1 = BY_KEY["T2"], BY_KEY["T2L"], BY_KEY["T1"]
    labels = [s.label for s in settings(t2)]
    assert labels == ["1 run × 2 threads", "2 runs × 1 thread", "2 sessions × 1 thread"]
    one, two = settings(t2)[:2]
    assert (text_window(t2, one), text_window(t2, two)) == (32, 16)
    assert text_batch_sizes(t2, two) == [4, 8, 16]
    assert (text_window(t1, one), text_window(t1, two)) == (128, 64)
    assert [s.label for s in settings(t2l)] == ["1 run × 2 threads", "1 run × 1 thread"]
    assert all(text_batch_sizes(t2l, s) == [1] for s in settings(t2l))


def test_length_sorted_batches_answer_as_one_text_at_a_time(minilm_repository: Path) -> None:
    model_dir = minilm_repository / "minilm-l6"
    texts = query_texts(24)
    text = Text(str(model_dir), False, 1)
    alone = np.stack([text.texts([t])[0] for t in texts])
    sorted_ = text.sorted_texts(texts, 8)
    assert sorted_.shape == alone.shape
    assert float(np.abs(sorted_ - alone).max()) <= ATOL  # in the texts' order, not sorted

    task = {"name": "T2 x", "kind": "text-limit", "texts": texts, "check": texts[:5]}
    task |= {"window": 16, "batch": 4, "model_dir": str(model_dir)}
    task |= {"seconds": 30.0, "runs": 6, "threads": 1, "concurrent": 2, "sessions": 2}
    outputs: dict[str, np.ndarray] = {}
    stats = run_task(task, {}, outputs)
    assert stats["runs"] == 6 and stats["items"] == 16
    assert float(np.abs(outputs["T2 x#check"] - alone[:5]).max()) <= ATOL


def test_the_docs_say_what_the_code_decides() -> None:
    """docs/benchmarks.md's T2 prose: the held set's size, its word counts, the checked
    texts, the latency target and where wrk runs, as the code has them."""
    from bench.peers.report import OVERHEAD_TARGET_MS
    from bench.peers.workloads import QUERY_WORDS
    from bench.peers.wrk import WRK_WORKLOADS

    text = " ".join((Path(__file__).parents[2] / "docs" / "benchmarks.md").read_text().split())
    low, high = QUERY_WORDS
    assert f"a held set of {QUERIES:,} different texts of {low}–{high} words" in text
    assert f"check before timing covers {CHECKED_QUERIES} of the held texts" in text
    assert f"(target ≤ +{OVERHEAD_TARGET_MS:.1f} ms)" in text
    workloads = WRK_WORKLOADS.split(",")
    assert f"On {', '.join(workloads[:-1])} and {workloads[-1]} (`--wrk-workloads`)" in text
