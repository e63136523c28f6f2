"""A request's texts are tokenized in parts, priced before any is tokenized (issue 44).

Before, a request's texts were one ``encode_batch`` on a codec thread: once its
deadline passed the request was answered 504, but the thread tokenized on, using the
cores (the tokenizers package's own thread pool) and, once its slot was freed, beside
the requests behind it; nothing priced its memory. Now ``tokenizer.in_parts`` runs
the request's stop check before each part of at most ``PART_CHARS`` characters, the
codec slot is held until the thread really ends, and ``limits.tokenizing_bytes`` is
held on the ticket first (429 with Retry-After while the budget lacks it, 413 beyond
all of it).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.engine import limits
from service.tokenizer import PART_CHARS
from tests.conftest import ServerProcess, server_process
from tests.support.metrics import metric
from tests.support.wait import wait_until

MODEL = "minilm-l6"
TIMEOUT = httpx.Timeout(120.0)
# 2,048 texts of ~15,000 characters of words (each under the 16,384 a 256-token model's
# first prefix holds, so each is tokenized whole): ~30 MB of text, 4.5 s of one core's
# tokenizing measured (encode_batch alone), a part of it ~0.15 s.
WORDS = "the committee reviewed every clause of the long report before voting "
HEAVY = [f"{i} " + WORDS * 210 for i in range(2048)]
# Its deadline: past the body's parse (~0.5 s), within its tokenizing (>= 4.5 s).
HEAVY_TIMEOUT = "2.5"
# The CPU the server may spend once the abandoned request was answered 504: the part
# under way and the request behind it (0.28 s measured). CPU seconds, not wall time, so
# a loaded machine stretches neither side; before, the rest of the tokenizing ran on
# (7.7 s measured).
MAX_CPU_AFTER = 1.5
# The request behind is answered within this (it has a core of its own either way).
PROMPT_SECONDS = 3.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _when_idle(pid: int) -> float:
    """The server's CPU seconds once it spends under 0.05 s of CPU in 0.5 s."""
    last = _cpu_seconds(pid)
    for _ in range(120):
        time.sleep(0.5)
        now = _cpu_seconds(pid)
        if now - last < 0.05:
            return now
        last = now
    raise AssertionError("the server never went idle")


@pytest.fixture(scope="module")
def one_codec(minilm_repository: Path) -> Iterator[ServerProcess]:
    with server_process(minilm_repository, max_concurrent_codecs="1") as running:
        yield running


def test_an_abandoned_requests_tokenizing_stops_between_parts(one_codec: ServerProcess) -> None:
    body = json.dumps({"model": MODEL, "text": HEAVY, "truncate": True}).encode()
    pid = one_codec.proc.pid
    with httpx.Client(base_url=one_codec.url, timeout=TIMEOUT) as client:
        _when_idle(pid)  # the model's calibration after its load is done
        late = client.post(
            "/v1/tokenize",
            content=body,
            headers={"Content-Type": "application/json", "X-Request-Timeout": HEAVY_TIMEOUT},
        )
        answered = _cpu_seconds(pid)
        assert late.status_code == 504, late.text
        assert late.headers["Retry-After"]
        began = time.monotonic()
        small = client.post("/v1/tokenize", json={"model": MODEL, "text": ["A small one."]})
        waited = time.monotonic() - began
        assert small.status_code == 200, small.text
        assert waited < PROMPT_SECONDS, f"the small request waited {waited:.1f} s"
        spent = _when_idle(pid) - answered
        assert spent < MAX_CPU_AFTER, f"{spent:.1f} CPU seconds after the 504"


def test_texts_tokenized_in_parts_are_the_tokenizers_own(one_codec: ServerProcess) -> None:
    """150 texts of ~15,000 characters: three parts, each text's ids those of the
    tokenizer itself, in order."""
    from tokenizers import Tokenizer

    from model_export.hf_import import minilm_l6_dir

    texts = HEAVY[:150]
    assert sum(map(len, texts)) > 2 * PART_CHARS
    answer = httpx.post(
        f"{one_codec.url}/v1/tokenize",
        json={"model": MODEL, "text": texts, "truncate": True},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 200, answer.text
    tokenizer = Tokenizer.from_file(str(minilm_l6_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    expected = [e.ids for e in tokenizer.encode_batch(texts)]
    assert [item["ids"] for item in answer.json()["data"]] == expected


# Two texts of 600,000 characters, a token each (punctuation: ~220 bytes a character
# measured in flight): the tokenizer sees 262,144 of each (``bound_text``), priced at
# ~134 MB against a 64 MiB budget; the body costs ~16 MB to parse.
DENSE = [".," * 300_000 for _ in range(2)]
BUDGET = 64 * 1024 * 1024
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def small_budget(minilm_repository: Path) -> Iterator[ServerProcess]:
    with server_process(minilm_repository, max_inflight_bytes=str(BUDGET)) as running:
        yield running


def test_tokenizing_past_the_memory_budget_is_413_before_any_tokenizing(
    small_budget: ServerProcess,
) -> None:
    price = 2 * 256 * limits.MAX_CHARS_PER_TOKEN * limits.TOKENIZING_BYTES_PER_CHAR
    assert price > BUDGET  # so the request can never fit
    answer = httpx.post(
        f"{small_budget.url}/v1/encode",
        json={"model": MODEL, "inputs": DENSE, "truncate": True},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 413, answer.text
    assert "tokenizing" in answer.json()["error"]


def _held(url: str) -> float:
    return metric(url, "attnserve_in_flight_bytes")


def test_tokenizing_beside_held_memory_is_429_with_retry_after(
    small_budget: ServerProcess,
) -> None:
    """A body still arriving holds its parse's price (~13 bytes a byte): 3 MB of it hold
    ~40 MB, so a request whose tokenizing costs ~30 MB gets 429 meanwhile, 200 after."""
    host, port = small_budget.url.removeprefix("http://").split(":")
    texts = [".," * 50_000]  # 100,000 characters: priced ~26 MB
    body = json.dumps({"model": MODEL, "inputs": texts, "truncate": True})
    with socket.create_connection((host, int(port))) as held:
        head = (
            "POST /v1/encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 20000000\r\n\r\n"
        )
        held.sendall(head.encode() + b'{"inputs": ["' + b"a" * 3_000_000)
        wait_until(lambda: _held(small_budget.url) > 30e6, "the trickled body held")
        refused = httpx.post(f"{small_budget.url}/v1/encode", content=body, headers=JSON)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"]
        assert "memory" in refused.json()["error"]
    wait_until(lambda: _held(small_budget.url) < 1e6, "the trickled body let go")
    answered = httpx.post(f"{small_budget.url}/v1/encode", content=body, headers=JSON)
    assert answered.status_code == 200, answered.text


def test_the_docs_state_the_tokenizing_parts_and_prices() -> None:
    """The figures docs/api.md and docs/deployment.md give are the code's."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name in ("api.md", "deployment.md"):
        text = " ".join((docs / name).read_text().split())
        assert f"at most {PART_CHARS:,} characters" in text, name
        assert f"{limits.TOKENIZING_BYTES_PER_CHAR} bytes a character" in text, name
        assert f"{limits.KEPT_BYTES_PER_TOKEN} bytes" in text, name
    api = " ".join((docs / "api.md").read_text().split())
    assert f"(at most `max_seq_len`, plus {limits.SPECIAL_TOKENS}, a text)" in api
    megabytes = PART_CHARS * limits.TOKENIZING_BYTES_PER_CHAR / 1e6
    assert f"~{megabytes:.0f} MB more" in " ".join((docs / "deployment.md").read_text().split())
