"""Texts are bounded by a prefix search on real tokens (``limits.bound_text``).

Before, texts were cut (``truncate``) or refused at 64 characters per token of the
model's length before tokenizing: ``("word" + " " * 200) * 300`` kept 83 tokens instead
of 256, its vector at cosine 0.876 to the model's own truncation, and a 102-token text
of 20,400 characters was a 413. A 32 MB text still costs a prefix's tokenizing, not
seconds and gigabytes (before the character bound: 15 s, +2.0 GB).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from transformers import BertModel, BertTokenizerFast

from model_export.hf_import import minilm_l6_dir
from tests.conftest import ServerProcess, server_process

MODEL = "minilm-l6"
MAX_SEQ_LEN = 256  # the model's (sentence-transformers' max_seq_length)
SPARSE_TEXT = ("word" + " " * 200) * 300  # 300 words in 61,200 characters
FITTING_TEXT = ("word" + " " * 200) * 100  # 102 tokens in 20,400 characters
HUGE_CHARS = 32_000_000  # a body just under ATTNSERVE_MAX_BODY_BYTES (32 MiB)
UNBROKEN_CHARS = 30_000_000  # one pre-token: a single [UNK], whatever its length
# The most characters of one text the tokenizer sees (limits.MAX_CHARS_PER_TOKEN x 256).
MOST_CHARS = 1024 * MAX_SEQ_LEN
# The served vector against transformers eager on the same tokens (fp32; observed ~1e-7).
VECTOR_ATOL = 1e-5
MIN_COSINE = 0.9999
# What the server may grow by while refusing a 32 MB text: the body, its parsed string
# and a copy or two (~100 MB measured); tokenizing it in full cost +2.0 GB.
MAX_RSS_GROWTH = 500 * 1024 * 1024
TIMEOUT = httpx.Timeout(120.0)


def _rss_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def _peak_bytes(pid: int) -> int:
    """The server's peak RSS so far (tokenizing 30 MB whole peaked ~1.9 GB above idle)."""
    return _rss_bytes(pid, "VmHWM")


def reference_vector(text: str, *, truncate: bool) -> np.ndarray:
    """sentence-transformers' answer: BertModel eager on the tokenizer's own truncation
    at 256 tokens (or the whole text), masked mean, L2-normalised."""
    path = minilm_l6_dir()
    tokenizer = BertTokenizerFast.from_pretrained(path)
    model = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    batch = tokenizer([text], truncation=truncate, max_length=MAX_SEQ_LEN, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state[0].numpy()
    mean = hidden.mean(axis=0)
    return np.asarray(mean / np.linalg.norm(mean))


def assert_same_vector(got: list[float], expected: np.ndarray) -> None:
    vector = np.asarray(got, dtype=np.float64)
    cosine = float(vector @ expected / np.linalg.norm(vector) / np.linalg.norm(expected))
    assert cosine > MIN_COSINE, cosine
    np.testing.assert_allclose(vector, expected, rtol=0, atol=VECTOR_ATOL)


@pytest.fixture(scope="module")
def server(minilm_repository: Path) -> Iterator[ServerProcess]:
    with server_process(minilm_repository) as running:
        yield running


def test_a_whitespace_heavy_text_is_truncated_as_the_tokenizer_does(
    server: ServerProcess,
) -> None:
    expected = reference_vector(SPARSE_TEXT, truncate=True)
    body = {"inputs": [SPARSE_TEXT], "pooling": "mean", "normalize": True, "truncate": True}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        r = c.post("/v1/encode", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["tokens"] == MAX_SEQ_LEN
        assert_same_vector(r.json()["data"][0]["pooled"], expected)
        tei = c.post("/embed", json={"inputs": SPARSE_TEXT, "truncate": True})
        assert tei.status_code == 200, tei.text
        assert_same_vector(tei.json()[0], expected)
        tokens = c.post("/v1/tokenize", json={"text": [SPARSE_TEXT], "truncate": True})
        assert tokens.status_code == 200, tokens.text
        assert len(tokens.json()["data"][0]["tokens"]) == MAX_SEQ_LEN


def test_a_fitting_text_of_many_characters_is_served_whole(server: ServerProcess) -> None:
    """Without truncate: served on its real token count, however many characters."""
    assert len(FITTING_TEXT) > 20_000
    body = {"inputs": [FITTING_TEXT], "pooling": "mean", "normalize": True}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        r = c.post("/v1/encode", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["tokens"] == 102
    assert_same_vector(
        r.json()["data"][0]["pooled"], reference_vector(FITTING_TEXT, truncate=False)
    )


def test_a_huge_text_is_refused_or_cut_on_a_prefix(server: ServerProcess) -> None:
    huge = "word " * (HUGE_CHARS // 5)
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        before = _rss_bytes(server.proc.pid)
        r = c.post("/v1/tokenize", json={"text": [huge]})
        grown = _rss_bytes(server.proc.pid) - before
        assert r.status_code == 413 and r.json()["error_type"] == "payload_too_large", r.text
        assert r.json()["error"].startswith("text[0]: 32,000,000 characters whose first")
        assert grown < MAX_RSS_GROWTH, f"RSS grew by {grown / 1e6:.0f} MB"
        r = c.post("/v1/tokenize", json={"text": [huge], "truncate": True})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"][0]["tokens"]) == MAX_SEQ_LEN
        assert _rss_bytes(server.proc.pid) - before < MAX_RSS_GROWTH


def test_an_8_mb_text_of_whitespace_is_answered(server: ServerProcess) -> None:
    """The search grows its prefix to the whole text: bounded by the body's size."""
    text = " " * 8_000_000 + "word " * 1000
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        r = c.post("/v1/encode", json={"inputs": [text], "pooling": "mean", "truncate": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["tokens"] == MAX_SEQ_LEN
        r = c.post("/v1/encode", json={"inputs": [text], "pooling": "mean"})
        assert r.status_code == 413, r.text


def test_too_long_texts_are_refused_without_truncate(server: ServerProcess) -> None:
    """Over the model's length on the prefix search, or on the whole text's count."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        sparse = c.post("/v1/encode", json={"inputs": [SPARSE_TEXT], "pooling": "mean"})
        assert sparse.status_code == 413 and "302 tokens" in sparse.json()["error"], sparse.text
        long = c.post("/v1/encode", json={"inputs": ["hello " * 100_000], "pooling": "mean"})
        assert long.status_code == 413 and "over 256 tokens" in long.json()["error"], long.text
        # One 16,385-letter word is a single [UNK]: served, whatever its characters.
        word = c.post("/v1/encode", json={"inputs": ["a" * 16_385], "pooling": "mean"})
        assert word.status_code == 200 and word.json()["usage"]["tokens"] == 3, word.text


def test_openai_answers_context_length_exceeded(server: ServerProcess) -> None:
    with (
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as info,
    ):
        client.embeddings.create(model=MODEL, input="word " * 10_000)
    assert info.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    "text",
    [
        " ".join(f"word{i}" for i in range(400)),  # over 256 tokens, under the search's size
        "start " + "x " * 3_000_000 + "the very end of it",  # a suffix search of ~6 MB
        "start " + "\t" * 200_000 + " ".join(f"tail{i}" for i in range(300)),
    ],
    ids=["long", "huge", "whitespace-heavy"],
)
def test_left_truncation_keeps_what_the_tokenizer_keeps(server: ServerProcess, text: str) -> None:
    """truncation_direction left equals transformers' truncation_side="left" (the last
    256 tokens between [CLS] and [SEP]), on every text route; a huge text is bounded by
    a suffix whose tokens the rest of it cannot change, as the prefix is for right."""
    tokenizer = BertTokenizerFast.from_pretrained(minilm_l6_dir(), truncation_side="left")
    want = tokenizer([text[-200_000:]], truncation=True, max_length=MAX_SEQ_LEN)["input_ids"][0]
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        native = c.post(
            "/v1/tokenize",
            json={"text": [text], "truncate": True, "truncation_direction": "left"},
        )
        assert native.status_code == 200, native.text
        assert native.json()["data"][0]["ids"] == want
        right = c.post("/v1/tokenize", json={"text": [text], "truncate": True})
        assert right.json()["data"][0]["ids"] != want  # the control: right keeps the start
        tei = c.post(
            "/tokenize",
            json={"inputs": text, "truncate": True, "truncation_direction": "Left"},
        )
        assert tei.status_code == 200, tei.text
        assert [t["id"] for t in tei.json()[0]] == want
        encoded = c.post(
            "/v1/encode",
            json={
                "inputs": [text],
                "truncate": True,
                "truncation_direction": "left",
                "pooling": "mean",
            },
        )
        assert encoded.status_code == 200, encoded.text
        assert encoded.json()["usage"]["tokens"] == len(want)


def test_an_unbroken_30_mb_word_is_one_unk_read_from_a_bounded_prefix(
    server: ServerProcess,
) -> None:
    """The issue's case: "x" * 30,000,000 is one pre-token, past WordPiece's 100
    characters a word, so the tokenizer's answer is [CLS] [UNK] [SEP], truncated or not.
    Tokenizing it whole took 25-35 s and ~1 GB each; now the run is cut to 101
    characters first (``service.condense``), the same tokens, its span the whole text."""
    text = "x" * UNBROKEN_CHARS
    tokenizer = BertTokenizerFast.from_pretrained(minilm_l6_dir())
    want = tokenizer([text[:MOST_CHARS]])["input_ids"][0]  # the same single [UNK]
    assert want == [tokenizer.cls_token_id, tokenizer.unk_token_id, tokenizer.sep_token_id]
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        before = _peak_bytes(server.proc.pid)
        for truncate in (True, False):
            r = c.post("/v1/tokenize", json={"text": [text], "truncate": truncate})
            assert r.status_code == 200, r.text
            assert r.json()["data"][0]["ids"] == want
            r = c.post(
                "/v1/encode", json={"inputs": [text], "pooling": "mean", "truncate": truncate}
            )
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["tokens"] == 3
        for direction in ("Right", "Left"):  # TEI's /tokenize: where each token came from
            r = c.post(
                "/tokenize",
                json={"inputs": text, "truncate": True, "truncation_direction": direction},
            )
            assert r.status_code == 200, r.text
            unk = r.json()[0][1]
            assert (unk["id"], unk["start"], unk["stop"]) == (want[1], 0, UNBROKEN_CHARS), unk
        grown = _peak_bytes(server.proc.pid) - before
    assert grown < MAX_RSS_GROWTH, f"peak RSS grew by {grown / 1e6:.0f} MB"


def test_a_10_mb_word_is_explained(server: ServerProcess) -> None:
    """/v1/explain/similarity bounds its texts as every text route does (18.6 s before)."""
    body = {"query": "x" * 10_000_000, "documents": ["a short document"]}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        before = _peak_bytes(server.proc.pid)
        r = c.post("/v1/explain/similarity", json=body)
        grown = _peak_bytes(server.proc.pid) - before
    assert r.status_code == 200, r.text
    assert r.json()["data"][0]["query_tokens"] == ["[CLS]", "[UNK]", "[SEP]"], r.json()
    assert grown < MAX_RSS_GROWTH, f"peak RSS grew by {grown / 1e6:.0f} MB"


def test_a_text_of_fewer_tokens_than_its_bound_holds_is_refused(server: ServerProcess) -> None:
    """Characters no run condenses (control characters the normalizer drops) past the
    bound, with fewer than 256 tokens in it: refused without tokenizing the rest, as a
    text of over 1,024 characters a token; at the bound it is served."""
    at_bound = "\x00" * (MOST_CHARS - 5) + " word"
    beyond = "\x00" * (MOST_CHARS + 1) + " word"
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        served = c.post("/v1/tokenize", json={"text": [at_bound], "truncate": True})
        assert served.status_code == 200, served.text
        assert served.json()["data"][0]["tokens"] == ["[CLS]", "word", "[SEP]"]
        for truncate in (True, False):
            r = c.post("/v1/tokenize", json={"text": [beyond], "truncate": truncate})
            assert r.status_code == 413, r.text
            assert f"whose first {MOST_CHARS:,} hold fewer than 256 tokens" in r.json()["error"]
