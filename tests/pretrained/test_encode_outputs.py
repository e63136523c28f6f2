"""``/v1/encode`` with ``output``: a late-interaction model's outputs of one run, on a
real server (the MultiVectorEncoder and bge-m3 layouts of
tests/support/late_interaction.py, exported by the CLI, beside the tiny model that has
no late interaction).

- Its answer holds exactly ``/v1/multi-vector``'s vectors for the same texts and side
  (``multi_vector`` for ``embeddings``; ``dense``, ``sparse``), float and base64.
- All outputs come from one graph run: the server's run counter moves by one for a
  request asking dense, sparse and multi_vector of one text (three runs would fail it).
- Arrays (or any non-text item) with ``output`` are 422 naming ``output``; a model
  without late interaction is 422 naming ``model``; an encode-only field with
  ``output`` is 422 naming it.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import running_server
from tests.support.late_interaction import DOCUMENTS, QUERIES, build_all, export_all
from tests.support.metrics import metric

LAYOUTS = ("multi_vector_encoder", "bge_m3")
OUTPUTS = {"multi-vector-encoder": ["multi_vector"], "bge-m3": ["multi_vector", "dense", "sparse"]}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, model_repository: Path) -> Iterator[str]:
    built = build_all(tmp_path_factory.mktemp("late-checkpoints"))
    repository = export_all(
        {name: built[name] for name in LAYOUTS}, tmp_path_factory.mktemp("late-models")
    )
    shutil.copytree(model_repository / "tiny", repository / "tiny")  # links are refused
    with running_server(repository, default_model="multi-vector-encoder") as base:
        yield base


def post(url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{route}", json=body, timeout=60)


def array(value: Any) -> np.ndarray:
    """A float answer's nested lists, or a base64 answer's {shape, dtype, data}."""
    if isinstance(value, dict):
        data = np.frombuffer(base64.b64decode(value["data"]), dtype="<" + value["dtype"][0] + "4")
        return data.reshape(value["shape"])
    return np.asarray(value, dtype=np.float32)


@pytest.mark.parametrize("model", list(OUTPUTS))
@pytest.mark.parametrize("side", ["query", "document"])
@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_encode_with_output_is_the_multi_vector_answer(
    url: str, model: str, side: str, fmt: str
) -> None:
    texts = QUERIES if side == "query" else DOCUMENTS
    output = OUTPUTS[model]
    common = {"model": model, "input_type": side, "output": output, "return_text": True}
    want = post(url, "/v1/multi-vector", {"input": texts, "embedding_type": fmt, **common})
    got = post(url, "/v1/encode", {"inputs": texts, "encoding_format": fmt, **common})
    assert want.status_code == 200 and got.status_code == 200, got.text
    w, g = want.json(), got.json()
    assert g["model"] == w["model"] == model
    assert g["usage"] == {"sequences": len(texts), "tokens": w["usage"]["total_tokens"]}
    assert [item["index"] for item in g["data"]] == list(range(len(texts)))
    for mine, theirs in zip(g["data"], w["data"], strict=True):
        assert set(mine) == {"index", *output}
        assert np.array_equal(array(mine["multi_vector"]), array(theirs["embeddings"]))
        if "dense" in output:
            assert np.array_equal(array(mine["dense"]), array(theirs["dense"]))
            assert mine["sparse"] == theirs["sparse"] and mine["sparse"]["text"]
        if fmt == "base64":
            assert isinstance(mine["multi_vector"], dict)


def test_every_output_comes_from_one_run(url: str) -> None:
    runs = "attnserve_inference_seconds_count"
    before = metric(url, runs, model="bge-m3")
    body = {
        "model": "bge-m3",
        "inputs": DOCUMENTS[:1],
        "output": ["dense", "sparse", "multi_vector"],
    }
    answer = post(url, "/v1/encode", body)
    assert answer.status_code == 200, answer.text
    assert metric(url, runs, model="bge-m3") - before == 1
    # the control: the counter counts runs, so the outputs asked one by one count three
    before = metric(url, runs, model="bge-m3")
    for output in ("dense", "sparse", "multi_vector"):
        assert post(url, "/v1/encode", {**body, "output": [output]}).status_code == 200
    assert metric(url, runs, model="bge-m3") - before == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "bge-m3", "inputs": [[[0.0] * 32]], "output": ["dense"]}, "output"),
        (
            {
                "model": "bge-m3",
                "inputs": ["a", {"text": "ab", "spans": [[0, 1]]}],
                "output": ["dense"],
            },
            "output",
        ),
        ({"model": "tiny", "inputs": ["a text"], "output": ["multi_vector"]}, "model"),
        ({"model": "bge-m3", "inputs": ["a"], "output": ["dense"], "pooling": "mean"}, "pooling"),
        ({"model": "bge-m3", "inputs": ["a"], "output": []}, "output"),
        (
            {"model": "bge-m3", "inputs": ["a"], "output": ["dense"], "input_type": "x"},
            "input_type",
        ),
    ],
)
def test_what_encode_with_output_cannot_answer_is_refused_by_name(
    url: str, body: dict[str, Any], field: str
) -> None:
    answer = post(url, "/v1/encode", body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith(f"{field}"), answer.text


def test_encode_without_output_answers_as_before(url: str) -> None:
    """The encode answer, its keys unchanged, on the same late-interaction model."""
    answer = post(url, "/v1/encode", {"model": "bge-m3", "inputs": ["a text"], "pooling": "mean"})
    assert answer.status_code == 200, answer.text
    item = answer.json()["data"][0]
    assert "multi_vector" not in item and item["pooled"] is not None
    assert set(answer.json()["usage"]) == {"sequences", "tokens"}
