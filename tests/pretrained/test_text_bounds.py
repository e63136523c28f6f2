"""Texts are bounded by characters before tokenizing: a huge text costs a comparison.

Before, a 32 MB ``/v1/tokenize`` body was tokenized in full (15 s, +2.0 GB of
which 1.1 GB was never released) before its 413, even with ``truncate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from service.engine.limits import CHARS_PER_TOKEN
from tests.conftest import ServerProcess, server_process

MODEL = "minilm-l6"
MAX_SEQ_LEN = 256  # the model's (sentence-transformers' max_seq_length)
LIMIT_CHARS = MAX_SEQ_LEN * CHARS_PER_TOKEN
HUGE_CHARS = 32_000_000  # a body just under ATTNSERVE_MAX_BODY_BYTES (32 MiB)
# What the server may grow by while refusing a 32 MB text: the body, its parsed string
# and a copy or two (~100 MB measured); tokenizing it in full cost +2.0 GB.
MAX_RSS_GROWTH = 500 * 1024 * 1024
TIMEOUT = httpx.Timeout(120.0)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(minilm_repository: Path) -> Iterator[ServerProcess]:
    with server_process(minilm_repository) as running:
        yield running


def test_a_huge_text_is_refused_before_tokenizing(server: ServerProcess) -> None:
    huge = "word " * (HUGE_CHARS // 5)
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        before = _rss_bytes(server.proc.pid)
        r = c.post("/v1/tokenize", json={"text": [huge]})
        grown = _rss_bytes(server.proc.pid) - before
        assert r.status_code == 413 and r.json()["error_type"] == "payload_too_large", r.text
        assert "refused before tokenizing" in r.json()["error"]
        assert r.json()["error"].startswith("text[0]: 32,000,000 characters")
        assert grown < MAX_RSS_GROWTH, f"RSS grew by {grown / 1e6:.0f} MB"
        # With truncation it is cut first, then tokenized to the model's length.
        r = c.post("/v1/tokenize", json={"text": [huge], "truncate": True})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"][0]["tokens"]) == MAX_SEQ_LEN
        assert _rss_bytes(server.proc.pid) - before < MAX_RSS_GROWTH


def test_the_character_bound_sits_above_any_fitting_text(server: ServerProcess) -> None:
    """Just over the bound is refused without tokenizing; just under is tokenized and then
    refused (or kept) on its real token count."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        over = c.post("/v1/encode", json={"inputs": ["a" * (LIMIT_CHARS + 1)], "pooling": "mean"})
        assert over.status_code == 413 and "before tokenizing" in over.json()["error"]
        # 64 characters per token at most: a text at the bound made of long words still
        # fits (each 63-letter word is a few WordPiece tokens) or is refused by its count.
        words = ("x" * 63 + " ") * (LIMIT_CHARS // 64)
        at = c.post("/v1/encode", json={"inputs": [words], "pooling": "mean"})
        assert at.status_code == 413 and "tokens" in at.json()["error"]
        assert "before tokenizing" not in at.json()["error"]
        cut = c.post(
            "/v1/encode",
            json={"inputs": ["hello " * 100_000], "pooling": "mean", "truncate": True},
        )
        assert cut.status_code == 200 and cut.json()["usage"]["tokens"] == MAX_SEQ_LEN


def test_openai_answers_context_length_exceeded(server: ServerProcess) -> None:
    with (
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as info,
    ):
        client.embeddings.create(model=MODEL, input="a" * (LIMIT_CHARS + 1))
    assert info.value.code == "context_length_exceeded"
