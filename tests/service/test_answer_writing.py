"""How answers are written and JSON arrays read, over a real server: large base64 strings
are joined into the answer's JSON as bytes (``wire.dumps``), and nested JSON floats become
float32 in one conversion (``wire.float32_numbers``). Both must change nothing a client
sees: the answer's bytes are those of writing each base64 string as a ``str`` (what
``orjson.dumps`` of the parsed answer gives back), and floats read in one step are the
bits read through float64 first (tolerance 0)."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import orjson

from tests.service.helpers import TIMEOUT, as_array, b64_array
from tests.support.inputs import sequences
from tests.support.tiny import D_MODEL, MODEL_MAX_SEQ_LEN


def _post(url: str, body: dict[str, Any], path: str = "/v1/encode") -> bytes:
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.content


def _same_as_str_writer(written: bytes) -> None:
    """``written`` is byte for byte what the str writer makes of the same answer."""
    assert orjson.dumps(orjson.loads(written)) == written


def test_base64_answers_are_the_bytes_of_the_str_writer(server_url: str) -> None:
    # The full-length sequence's maps (and float32 embeddings at 128 tokens) are joined
    # as bytes (64 KiB and more), the short one's written as str: both in one answer.
    seqs = sequences((MODEL_MAX_SEQ_LEN, 3), seed=46)
    inputs = [b64_array(s) for s in seqs]
    plain = _post(server_url, {"inputs": inputs, "encoding_format": "base64"})
    _same_as_str_writer(plain)
    for dtype in ("float32", "float16"):
        maps = _post(
            server_url,
            {
                "inputs": inputs,
                "encoding_format": "base64",
                "return_attention": True,
                "attention": {"dtype": dtype},
            },
        )
        _same_as_str_writer(maps)
        assert orjson.loads(maps)["data"][0]["attention"]["dtype"] == dtype
        top_k = _post(
            server_url,
            {
                "inputs": inputs,
                "encoding_format": "base64",
                "return_attention": True,
                "attention": {"dtype": dtype, "top_k": 2},  # values and int32 key indices
            },
        )
        _same_as_str_writer(top_k)
        assert orjson.loads(top_k)["data"][1]["attention_indices"]["dtype"] == "int32"
    for kind in ("float", "binary", "ubinary"):  # float32 vectors, packed bits as base64
        pooled = _post(
            server_url,
            {
                "inputs": inputs,
                "encoding_format": "base64",
                "pooling": "mean",
                "embedding_type": kind,
            },
        )
        _same_as_str_writer(pooled)


def test_base64_answer_decodes_to_the_float_answer(server_url: str) -> None:
    inputs = [b64_array(s) for s in sequences((4,), seed=47)]
    as_base64 = orjson.loads(_post(server_url, {"inputs": inputs, "encoding_format": "base64"}))
    as_floats = orjson.loads(_post(server_url, {"inputs": inputs}))
    got = as_array(as_base64["data"][0]["embeddings"])
    want = np.asarray(as_floats["data"][0]["embeddings"], dtype=np.float32)
    np.testing.assert_array_equal(got, want)  # tolerance 0: the same float32 values


def test_json_floats_read_as_float64_then_float32(server_url: str) -> None:
    """float64 values (not float32's: each rounds on the way), ints, and a value beyond
    float32 (refused as non-finite) read as reading them through float64 would."""
    rng = np.random.default_rng(46)
    values = rng.standard_normal((6, D_MODEL)) * 10.0 ** rng.integers(-8, 3, (6, D_MODEL))
    nested: list[list[Any]] = values.tolist()
    nested[0][:3] = [1, -2, 0]  # JSON integers among the floats
    expected = np.asarray(nested, dtype=np.float64).astype(np.float32)
    as_floats = orjson.loads(_post(server_url, {"inputs": [nested], "encoding_format": "base64"}))
    as_bits = orjson.loads(
        _post(server_url, {"inputs": [b64_array(expected)], "encoding_format": "base64"})
    )
    assert as_floats["data"][0]["embeddings"] == as_bits["data"][0]["embeddings"]
    nested[1][1] = 1e39  # beyond float32: inf, which the engine refuses
    with httpx.Client(base_url=server_url, timeout=TIMEOUT) as client:
        refused = client.post("/v1/encode", json={"inputs": [nested]})
    assert refused.status_code == 422, refused.text
