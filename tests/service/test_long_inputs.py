"""The served length of a long-context model: its own, unless the server's setting or
the memory budget is shorter, and then the shorter one, said where a caller sees it."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from model_export.config import EncoderConfig
from model_export.export import export_model
from model_export.model import Encoder
from service.attention_scratch import FLOAT32, SCRATCH_MAPS, longest_affordable
from service.settings import Settings
from tests.conftest import running_server
from tests.service.helpers import b64_array

D_MODEL, HEADS = 32, 2
MODEL_LENGTH = 2048  # longer than the 512 the server once capped every model to
BUDGET = 16 * 2**20  # the smallest ATTNSERVE_MAX_INFLIGHT_BYTES allowed
# The longest sequence whose scratch fits BUDGET: isqrt(16 MiB / (4 * 3 * 2)) = 836.
AFFORDED = 836
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = EncoderConfig(
        d_model=D_MODEL, n_heads=HEADS, n_layers=1, d_ff=64, max_seq_len=MODEL_LENGTH
    )
    repo = tmp_path_factory.mktemp("long")
    export_model(Encoder(config, seed=3), repo / "long", exporter="torchscript", optimize=False)
    return repo


def encode(url: str, tokens: int) -> httpx.Response:
    sequence = np.random.default_rng(tokens).standard_normal((tokens, D_MODEL), np.float32)
    body = {"inputs": [b64_array(sequence)], "encoding_format": "base64", "pooling": "mean"}
    return httpx.post(f"{url}/v1/encode", json=body, timeout=60)


def served_length(url: str) -> tuple[object, object]:
    """The model's (max_seq_len, max_seq_len_by) as /v1/models says."""
    models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    card = next(m for m in models if m["name"] == "long")
    return card["max_seq_len"], card["max_seq_len_by"]


def test_a_long_context_model_serves_its_own_length_by_default(repo: Path) -> None:
    with running_server(repo) as url:
        assert served_length(url) == (
            MODEL_LENGTH,
            "the model",
        )
        assert encode(url, MODEL_LENGTH).status_code == 200  # 413 when 512 capped it
        refused = encode(url, MODEL_LENGTH + 1)
        assert refused.status_code == 413, refused.text
        assert f"at most {MODEL_LENGTH} (set by the model)" in refused.json()["error"]


def test_the_memory_budget_caps_the_length_and_says_so(repo: Path) -> None:
    assert AFFORDED**2 * FLOAT32 * SCRATCH_MAPS * HEADS <= BUDGET
    assert (AFFORDED + 1) ** 2 * FLOAT32 * SCRATCH_MAPS * HEADS > BUDGET
    with running_server(repo, max_inflight_bytes=str(BUDGET)) as url:
        assert served_length(url) == (
            AFFORDED,
            "ATTNSERVE_MAX_INFLIGHT_BYTES",
        )
        # Below the cap, what the rest of the request holds fits beside its scratch.
        assert encode(url, AFFORDED * 9 // 10).status_code == 200
        refused = encode(url, AFFORDED + 1)
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert f"at most {AFFORDED} (set by ATTNSERVE_MAX_INFLIGHT_BYTES)" in error
    with running_server(repo, max_seq_len="100") as url:  # the setting, when shorter
        assert served_length(url) == (
            100,
            "ATTNSERVE_MAX_SEQ_LEN",
        )


def test_the_lengths_the_docs_state_are_the_codes() -> None:
    """docs/benchmarks.md's default ATTNSERVE_MAX_SEQ_LEN, its length for 12 heads under
    the default budget, and the budget 8,192 tokens need, computed here."""
    twelve = EncoderConfig(d_model=768, n_heads=12, n_layers=12, d_ff=3072, max_seq_len=8192)
    default = Settings().max_inflight_bytes
    need = FLOAT32 * SCRATCH_MAPS * 12 * 8192**2
    text = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    assert f"the setting ({Settings().max_seq_len:,} by default)" in text
    assert (
        f"For 12 heads the default {default // 2**30} GiB budget holds "
        f"{longest_affordable(twelve, default):,} tokens; 8,192 need about "
        f"{round(need / 2**30)} GiB."
    ) in text
