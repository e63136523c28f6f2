"""Sparse answers within every bound, on a SPLADE head with random weights (a nonzero
for nearly every vocabulary word: the worst case a bound must hold against).

A server whose ATTNSERVE_MAX_RESPONSE_BYTES is 4 MiB prices a SPLADE answer at its worst
case (every word of the vocabulary, with its token for return_text) before anything
runs: one text more than fits is a 413 that says how many do, and runs nothing; as
many as fit are answered within the limit, natively and on TEI's route.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import running_server
from tests.support.metrics import scrape

LIMIT = 4 * 1024 * 1024
WORDS = [f"word{i}" for i in range(64)]


@pytest.fixture(scope="module")
def url(head_models: tuple[Path, dict[str, Path]]) -> Iterator[str]:
    with running_server(
        head_models[0], default_model="bert-splade", max_response_bytes=str(LIMIT)
    ) as base:
        yield base


def splade_runs(url: str) -> float:
    return scrape(url).value(
        "attnserve_inference_seconds_count", model="bert-splade", graph="splade"
    )


def fitting(answer: httpx.Response) -> int:
    """How many texts the 413 says fit."""
    found = re.search(r"at most ([\d,]+) of these texts fit", answer.text)
    assert found, answer.text
    return int(found.group(1).replace(",", ""))


@pytest.mark.parametrize("return_text", [False, True])
def test_a_splade_answer_over_the_limit_is_refused_before_it_runs(
    url: str, return_text: bool
) -> None:
    before = splade_runs(url)
    body = {"model": "bert-splade", "inputs": WORDS, "return_text": return_text}
    refused = httpx.post(f"{url}/v1/embed_sparse", json=body, timeout=120)
    assert refused.status_code == 413, refused.text[:300]
    fit = fitting(refused)
    assert 1 <= fit < len(WORDS)
    over = httpx.post(
        f"{url}/v1/embed_sparse", json={**body, "inputs": WORDS[: fit + 1]}, timeout=120
    )
    assert over.status_code == 413 and fitting(over) == fit, over.text[:300]
    assert splade_runs(url) == before  # nothing ran
    answer = httpx.post(f"{url}/v1/embed_sparse", json={**body, "inputs": WORDS[:fit]}, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.content) <= LIMIT
    assert ("text" in answer.json()["data"][0]) == return_text
    # a random head's vectors are dense: the bound is met by a real answer, not a lenient one
    assert len(answer.json()["data"][0]["indices"]) > 10_000


def test_top_k_lets_every_text_fit(url: str) -> None:
    body = {"model": "bert-splade", "inputs": WORDS, "return_text": True, "top_k": 8}
    answer = httpx.post(f"{url}/v1/embed_sparse", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    assert [len(item["indices"]) for item in answer.json()["data"]] == [8] * len(WORDS)


def test_tei_route_is_priced_too(url: str) -> None:
    """TEI answers limits with 422 Validation (413 only for a body too large)."""
    refused = httpx.post(f"{url}/embed_sparse", json={"inputs": WORDS}, timeout=120)
    assert refused.status_code == 422, refused.text[:300]
    fit = fitting(refused)
    answer = httpx.post(f"{url}/embed_sparse", json={"inputs": WORDS[:fit]}, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.content) <= LIMIT


@pytest.mark.parametrize("kind", [None, "splade"])
def test_an_empty_text_is_refused_as_on_every_other_route(url: str, kind: str | None) -> None:
    body = {"model": "bert-splade", "inputs": ["fine", ""], "kind": kind}
    answer = httpx.post(f"{url}/v1/embed_sparse", json=body, timeout=60)
    assert answer.status_code == 422, answer.text[:300]
    assert answer.json()["error"].startswith("inputs[1]: is empty"), answer.text


def test_the_documented_costs_of_a_nonzero_are_the_codes() -> None:
    from service.protocols import wire

    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    index, value = int(wire.JSON_SPARSE_INDEX), int(wire.JSON_SPARSE_VALUE)
    assert f"its index (up to {index} bytes) and its value (up to {value}:" in api
