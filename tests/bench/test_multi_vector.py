"""``bench.multi_vector``'s parsing and rendering on a hand-made result (no model, no
server, no timing: the benchmark itself is run by hand)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import multi_vector as bench


def result() -> dict[str, Any]:
    """A results JSON as ``bench.multi_vector.run`` writes it, with round numbers."""
    return {
        "model": "minilm-colbert",
        "model_dir": "bench/out/models/minilm-colbert",
        "dim": 128,
        "texts": 4,
        "tokens": {"mean": 100.0, "min": 50, "max": 150},
        "texts_per_request": 2,
        "cores": 2,
        "in_process_sweep": {
            "rows": [
                {"batch": 8, "threads": 2, "sessions": 1, "texts_per_s": 90.0},
                {"batch": 16, "threads": 1, "sessions": 2, "texts_per_s": 100.0},
            ],
            "best": {"batch": 16, "threads": 1, "sessions": 2, "texts_per_s": 100.0},
        },
        "served": {
            "in_process": [100.0, 50.0],
            "setting": [16, 1, 2],
            "values": {
                "base64 float16|1": [80.0, 30.0],
                "base64 float16|1|p50_ms": [25.0, 35.0],
            },
        },
        "sizes": {
            "texts": 4,
            "rows": {
                "JSON floats (float32)": {
                    "bytes": 8000,
                    "tokens": 400,
                    "vectors": 200,
                    "max_abs_diff": 0.0,
                },
                "base64 float16": {
                    "bytes": 2000,
                    "tokens": 400,
                    "vectors": 200,
                    "max_abs_diff": 5e-4,
                },
                "dense vector, base64": {"bytes": 400, "tokens": 396, "vectors": 4},
            },
        },
        "dense_path": {
            "model": "minilm-l6",
            "before": "4fc8ddd",
            "rounds": 2,
            "values": {
                "W1 [1,16] c=1 p50 ms": {"before": [4.0, 5.0], "after": [5.0, 5.0]},
                "W2 [1,16] c=32 tokens/s": {"before": [100.0, 200.0], "after": [110.0, 180.0]},
            },
        },
        "seconds": 60.0,
    }


def test_served_rows_are_ratios_per_round_to_the_in_process_baseline() -> None:
    header, rows = bench.served_cells(result())
    assert header[-1].startswith("÷ in-process")
    baseline, served = rows
    assert baseline[0] == "in-process onnxruntime (batch 16, 2 sessions × 1 thread)"
    assert baseline[2:4] == ["75", "7,500"]  # median texts/s, × 100 tokens per text
    # Per round: 80/100 and 30/50, not the medians' 55/75.
    assert served == ["served, base64 float16", "1", "55", "5,500", "30", "0.70 (0.60–0.80)"]


def test_sizes_are_per_text_token_and_vector_against_the_compact_wire() -> None:
    header, rows = bench.size_cells(result())
    assert header[:4] == ["answer", "bytes per text", "per token", "per vector"]
    assert rows[0] == ["JSON floats (float32)", "2,000", "20.0", "40", "4.00", "0.0e+00"]
    assert rows[1][4] == "1.00"
    assert rows[2] == ["dense vector, base64", "100", "1.0", "—", "0.20", "—"]


def test_dense_ratios_say_faster_after_above_one_whatever_the_unit() -> None:
    values = result()["dense_path"]["values"]
    # W1 is a latency (lower is better): before ÷ after.
    assert bench.dense_ratios(values["W1 [1,16] c=1 p50 ms"], "W1 [1,16] c=1 p50 ms") == [0.8, 1.0]
    assert bench.dense_ratios(values["W2 [1,16] c=32 tokens/s"], "W2") == [1.1, 0.9]
    _, rows = bench.dense_cells(result())
    assert rows[1] == ["W2 [1,16] c=32 tokens/s", "150.0", "145.0", "1.00 (0.90–1.10)"]


def test_the_block_renders_between_its_markers_and_replaces_only_itself(tmp_path: Path) -> None:
    block = bench.render(result())
    assert block.startswith(bench.BEGIN) and block.endswith(bench.END)
    assert "Median ratios W1 0.90, W2 1.00; every round between 0.80 and 1.10. Every" in block
    assert "batch 16, 2 sessions × 1 thread 100; batch 8, 1 session × 2 threads 90" in block
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nbefore\n")
    bench.write_doc(doc, block)
    first = doc.read_text()
    assert first.count(bench.HEADING) == 1 and first.startswith("# Benchmarks\n\nbefore\n")
    bench.write_doc(doc, block.replace("Median", "MEDIAN"))
    second = doc.read_text()
    assert second.count(bench.BEGIN) == 1 and "MEDIAN ratios" in second
    assert second.replace("MEDIAN", "Median") == first


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_answers_decode_from_either_wire(dtype: str) -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    packed = vectors.astype(dtype).astype(f"<{dtype[0]}{int(dtype[-2:]) // 8}")
    b64 = {"shape": [2, 3], "dtype": dtype, "data": base64.b64encode(packed.tobytes()).decode()}
    assert bench.decoded({"embeddings": b64}).tolist() == vectors.tolist()
    assert bench.decoded({"embeddings": vectors.tolist()}).tolist() == vectors.tolist()


def test_request_bodies_read_the_texts_as_documents_on_each_wire() -> None:
    texts = [f"text {i}" for i in range(5)]
    requests = bench.requests_of(texts, "base64 float16")
    assert [json.loads(r.body)["input"] for r in requests] == [texts[:8]]
    body = json.loads(bench.multi_vector_body(texts[:2], "JSON floats (float32)"))
    assert body == {
        "model": bench.MODEL_NAME,
        "input": texts[:2],
        "input_type": "document",
        "embedding_type": "float",
        "dtype": "float32",
    }


def test_the_dense_verdict_names_a_workload_whose_rounds_all_lie_on_one_side() -> None:
    assert bench.dense_verdict({"W1 x": [0.9, 1.1], "W2 y": [0.95, 1.0]}).startswith("Every")
    verdict = bench.dense_verdict({"W1 x": [0.9, 0.95], "W2 y": [1.1, 1.2], "W3 z": [0.9, 1.1]})
    assert verdict == "Slower after in every round: W1; faster after in every round: W2."
