"""The model memory ledger counts what loading really made resident (PSS), so a graph's
pre-packed weights shared through the session cache count once, and admission still
refuses a load whose estimate does not fit. Real exports, a real server, real metrics."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from tests.conftest import server_process
from tests.support.metrics import metric

MiB = 2**20
LEDGER = "attnserve_model_memory_bytes"
# What a second set of MiniLM's pre-packed sessions costs without the cache and does not
# with it: its two pre-packed graphs' copies of the encoder's weights, ~2 x 42 MiB
# (docs/deployment.md, "The session cache": +125 MiB per extra runtime against +40).
SHARED_AT_LEAST = 50 * MiB


def _two_versions(source: Path, repository: Path) -> Path:
    """``minilm-l6/1`` and ``minilm-l6/2``: the same export twice, so the same cache entries."""
    for version in ("1", "2"):
        shutil.copytree(source, repository / "minilm-l6" / version)
    return repository


def _held(url: str) -> float:
    return metric(url, LEDGER, model="minilm-l6")


def test_shared_prepacked_weights_are_counted_once(minilm_repository: Path, tmp_path: Path) -> None:
    repo = _two_versions(minilm_repository / "minilm-l6", tmp_path / "models")
    held = {}
    for label, cache in (("off", ""), ("on", str(tmp_path / "sessions"))):
        with server_process(repo, version_policy="all", session_cache_dir=cache) as server:
            held[label] = _held(server.url)
    print(f"ledger, two versions: cache off {held['off'] / MiB:.0f} MiB, on {held['on'] / MiB:.0f}")
    assert held["on"] <= held["off"] - SHARED_AT_LEAST, held


def test_a_load_over_the_budget_is_refused_whatever_the_ledger_holds(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Admission prices a load at its estimate before anything is opened: a model whose
    files alone exceed what the budget leaves is refused, with the cache on."""
    repo = tmp_path / "models"
    shutil.copytree(tiny_model_dir, repo / "tiny")
    budget = 64 * MiB
    with server_process(
        repo,
        model_control="explicit",
        model_memory_bytes=str(budget),
        session_cache_dir=str(tmp_path / "sessions"),
    ) as server:
        held = metric(server.url, LEDGER, model="tiny")
        assert 0 < held < budget
        big = repo / "big"
        shutil.copytree(tiny_model_dir, big)
        (big / "padding.bin").write_bytes(b"\0" * (budget - int(held) + MiB))
        answer = httpx.post(f"{server.url}/v2/repository/models/big/load", timeout=120)
        assert answer.status_code == 400, answer.text
        assert "ATTNSERVE_MODEL_MEMORY_BYTES" in answer.text
        assert metric(server.url, LEDGER, model="tiny") == held  # nothing else counted
