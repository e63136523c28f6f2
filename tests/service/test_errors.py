"""Every bad request gets its status and error_type, and the server keeps serving.

Two real servers: the session's default one and, for the limits, a second one
with small ATTNSERVE_* limits (module-scoped).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import running_server
from tests.service.helpers import TIMEOUT, as_array, b64_array
from tests.support.inputs import sequences
from tests.support.onnx_runs import ort_encode
from tests.support.tiny import D_MODEL, MODEL_MAX_SEQ_LEN, N_HEADS, N_LAYERS

LIMITS = {
    "max_sequences": "3",
    "max_tokens": "40",
    "max_body_bytes": "20000",
    "max_response_bytes": "50000",
    "max_seq_len": "32",
}

ROW = [0.5] * D_MODEL


@pytest.fixture(scope="module")
def limited_url(model_repository: Path) -> Iterator[str]:
    with running_server(model_repository, **LIMITS) as url:
        yield url


def _b64(shape: list[int]) -> dict[str, Any]:
    return b64_array(np.ones(shape, dtype=np.float32))


def _b64_with(value: float) -> dict[str, Any]:
    """A valid [2, D_MODEL] base64 sequence with one element set to ``value``."""
    values = np.ones((2, D_MODEL), dtype=np.float32)
    values[1, 5] = value
    return b64_array(values)


def _chunked(body: bytes) -> Callable[[], Iterator[bytes]]:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the server must count
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    return chunks


def _padded_body(size: int) -> bytes:
    """A valid small request padded with JSON whitespace to ``size`` bytes."""
    body = json.dumps({"inputs": [[ROW]]}).encode()
    return body[:-1] + b" " * (size - len(body)) + b"}"


@dataclass(frozen=True)
class Bad:
    """One bad request and the answer it must get."""

    id: str
    status: int
    error_type: str
    json: Any = None
    content: bytes | Callable[[], Iterator[bytes]] | None = None
    headers: dict[str, str] | None = None  # None: application/json
    method: str = "POST"
    path: str = "/v1/encode"
    server: str = "default"  # or "limited"
    says: tuple[str, ...] = ()  # case-insensitive substrings of the message


def _req(**fields: Any) -> dict[str, Any]:
    return {"inputs": [[ROW, ROW]], **fields}


def _attn(**attention: Any) -> dict[str, Any]:
    return _req(return_attention=True, attention=attention)


SEQ14 = b64_array(np.ones((14, D_MODEL), dtype=np.float32))
SEQ30 = b64_array(np.ones((30, D_MODEL), dtype=np.float32))

CASES = [
    # 400 / 415: the body is not JSON
    Bad("malformed-json", 400, "invalid_json", content=b'{"inputs": [[', says=("json",)),
    Bad("empty-body", 400, "invalid_json", content=b""),
    Bad("nan-literal", 400, "invalid_json", content=b'{"inputs": [[[NaN]]]}'),
    Bad("text-plain", 415, "unsupported_media_type", content=b"{}",
        headers={"content-type": "text/plain"}, says=("application/json",)),
    Bad("no-content-type", 415, "unsupported_media_type", content=b"{}", headers={}),
    # 422: well-formed JSON, bad content
    Bad("body-is-a-list", 422, "invalid_input", json=[1, 2]),
    Bad("inputs-missing", 422, "invalid_input", json={}, says=("inputs",)),
    Bad("inputs-not-a-list", 422, "invalid_input", json={"inputs": 3}, says=("inputs",)),
    Bad("inputs-empty", 422, "invalid_input", json={"inputs": []}, says=("empty",)),
    Bad("sequence-empty", 422, "invalid_input", json={"inputs": [[]]}),
    Bad("sequence-empty-b64", 422, "invalid_input",
        json={"inputs": [{"shape": [0, D_MODEL], "data": ""}]}, says=("empty",)),
    Bad("rank-1", 422, "invalid_input", json={"inputs": [ROW]}, says=("rank",)),
    Bad("rank-3", 422, "invalid_input", json={"inputs": [[[ROW]]]}, says=("rank",)),
    Bad("rank-3-b64", 422, "invalid_input", json={"inputs": [_b64([1, 2, D_MODEL])]},
        says=("rank",)),
    Bad("shape-rank-70-b64", 422, "invalid_input",
        json={"inputs": [{"shape": [1] * 70, "data": "AAAAAA=="}]}, says=("shape",)),
    Bad("shape-huge-dim-b64", 422, "invalid_input",
        json={"inputs": [{"shape": [0, 2**63], "data": ""}]}),
    Bad("normalize-without-pooling", 422, "invalid_input",
        json={"inputs": [[ROW]], "normalize": True}, says=("pooling",)),
    Bad("width", 422, "invalid_input", json={"inputs": [[[0.5] * (D_MODEL - 1)]]},
        says=("width", str(D_MODEL))),
    Bad("width-b64", 422, "invalid_input", json={"inputs": [_b64([2, D_MODEL + 1])]},
        says=("width",)),
    Bad("ragged-rows", 422, "invalid_input", json={"inputs": [[ROW, ROW[:-1]]]}),
    Bad("not-numbers", 422, "invalid_input", json={"inputs": [[[{"a": 1}] * D_MODEL]]}),
    Bad("numbers-as-strings", 422, "invalid_input", json={"inputs": [[["1.5"] * D_MODEL]]},
        says=("numbers",)),
    Bad("numbers-as-booleans", 422, "invalid_input", json={"inputs": [[[True] * D_MODEL]]},
        says=("numbers",)),
    Bad("layer-without-return-attention", 422, "invalid_input",
        json={"inputs": [[ROW]], "attention": {"layers": [99]}}, says=("layers",)),
    Bad("sequence-is-number", 422, "invalid_input", json={"inputs": [3]}),
    Bad("sequence-is-null", 422, "invalid_input", json={"inputs": [None]}),
    # text needs a tokenizer, and the tiny model has none
    Bad("text-without-tokenizer", 422, "unsupported_by_model", json={"inputs": ["a text"]},
        says=("tokenizer",)),
    Bad("tokenize-without-tokenizer", 422, "unsupported_by_model", path="/v1/tokenize",
        json={"text": "a text"}, says=("tokenizer",)),
    Bad("tokenize-text-plain", 415, "unsupported_media_type", path="/v1/tokenize",
        content=b"{}", headers={"content-type": "text/plain"}),
    Bad("nan-b64", 422, "invalid_input", json={"inputs": [_b64_with(np.nan)]}, says=("nan",)),
    Bad("inf-b64", 422, "invalid_input", json={"inputs": [_b64_with(-np.inf)]}, says=("inf",)),
    Bad("overflows-float32", 422, "invalid_input", json={"inputs": [[[1e39] * D_MODEL]]},
        says=("float32",)),
    Bad("bad-base64", 422, "invalid_input",
        json={"inputs": [{"shape": [1, D_MODEL], "data": "not base64!!"}]}, says=("base64",)),
    Bad("base64-length", 422, "invalid_input",
        json={"inputs": [{"shape": [2, D_MODEL], "data": _b64([1, D_MODEL])["data"]}]},
        says=("bytes",)),
    Bad("base64-dtype", 422, "invalid_input",
        json={"inputs": [{**_b64([1, D_MODEL]), "dtype": "float16"}]}, says=("dtype",)),
    Bad("base64-shape", 422, "invalid_input",
        json={"inputs": [{"shape": "1x32", "data": _b64([1, D_MODEL])["data"]}]},
        says=("shape",)),
    Bad("base64-unknown-key", 422, "invalid_input",
        json={"inputs": [{**_b64([1, D_MODEL]), "order": "C"}]}, says=("order",)),
    Bad("layer-too-high", 422, "invalid_input", json=_attn(layers=[N_LAYERS]),
        says=("layers",)),
    Bad("layer-too-low", 422, "invalid_input", json=_attn(layers=[-N_LAYERS - 1]),
        says=("layers",)),
    Bad("head-too-high", 422, "invalid_input", json=_attn(heads=[0, N_HEADS]), says=("heads",)),
    Bad("layers-empty", 422, "invalid_input", json=_attn(layers=[]), says=("layers",)),
    Bad("layers-not-ints", 422, "invalid_input", json=_attn(layers=["last"]),
        says=("layers",)),
    Bad("unknown-reduce", 422, "invalid_input", json=_attn(reduce="median"), says=("reduce",)),
    Bad("unknown-pooling", 422, "invalid_input", json=_req(pooling="sum"), says=("pooling",)),
    Bad("unknown-encoding", 422, "invalid_input", json=_req(encoding_format="npy"),
        says=("encoding_format",)),
    Bad("unknown-field", 422, "invalid_input", json=_req(temperature=1.0),
        says=("temperature",)),
    Bad("unknown-attention-field", 422, "invalid_input", json=_attn(layer=[0]),
        says=("layer",)),
    # 404
    Bad("unknown-model", 404, "model_not_found", json=_req(model="nope"), says=("nope",)),
    Bad("unknown-model-card", 404, "model_not_found", method="GET", path="/v1/models/nope",
        says=("nope",)),
    Bad("unknown-route", 404, "not_found", method="GET", path="/v2/encode"),
    Bad("wrong-method", 405, "method_not_allowed", method="GET"),
    # 413 on the default server: the model's own limit (128 tokens)
    Bad("longer-than-model", 413, "payload_too_large",
        json={"inputs": [b64_array(np.ones((MODEL_MAX_SEQ_LEN + 1, D_MODEL), np.float32))]},
        says=(str(MODEL_MAX_SEQ_LEN + 1), str(MODEL_MAX_SEQ_LEN))),
    # 413 on the limited server
    Bad("too-many-sequences", 413, "payload_too_large", server="limited",
        json={"inputs": [[ROW]] * 4}, says=("4 sequences", "3")),
    Bad("sequence-too-long", 413, "payload_too_large", server="limited",
        json={"inputs": [b64_array(np.ones((33, D_MODEL), np.float32))]}, says=("33", "32")),
    Bad("too-many-tokens", 413, "payload_too_large", server="limited",
        json={"inputs": [SEQ14, SEQ14, SEQ14]}, says=("42", "40")),
    Bad("body-too-large", 413, "payload_too_large", server="limited",
        content=_padded_body(20001), says=("20,000",)),
    Bad("body-too-large-chunked", 413, "payload_too_large", server="limited",
        content=_chunked(_padded_body(30000)), says=("20,000",)),
    Bad("response-too-large", 413, "payload_too_large", server="limited",
        json={"inputs": [SEQ30], "return_attention": True},
        says=("response", "layers", "heads", "reduce")),
    Bad("response-too-large-b64", 413, "payload_too_large", server="limited",
        json={"inputs": [SEQ30], "return_attention": True, "return_hidden_states": True,
              "encoding_format": "base64"},
        says=("response", "layers", "heads", "reduce")),
]  # fmt: skip


@pytest.fixture(scope="module")
def good_reference(embeddings_session: ort.InferenceSession) -> tuple[np.ndarray, np.ndarray]:
    """The good request sent after each bad one, and its expected embeddings."""
    seq = sequences((5,), seed=21)[0]
    ((hidden, _),) = ort_encode(embeddings_session, [seq])
    return seq, hidden


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_request_then_good_request(
    case: Bad,
    server_url: str,
    limited_url: str,
    good_reference: tuple[np.ndarray, np.ndarray],
) -> None:
    url = limited_url if case.server == "limited" else server_url
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        if case.json is not None:
            r = client.request(case.method, case.path, json=case.json)
        elif case.content is not None:
            content = case.content if isinstance(case.content, bytes) else case.content()
            headers = {"content-type": "application/json"} if case.headers is None else case.headers
            r = client.request(case.method, case.path, content=content, headers=headers)
        else:
            r = client.request(case.method, case.path)

        assert r.status_code == case.status, r.text
        assert r.headers["content-type"].startswith("application/json")
        body = r.json()
        assert set(body) == {"error", "error_type"}, body
        assert body["error_type"] == case.error_type, body
        assert isinstance(body["error"], str) and body["error"]
        assert "Traceback" not in r.text and 'File "' not in r.text
        for words in case.says:
            assert words.lower() in body["error"].lower(), body["error"]

        # ... and the server still answers a good request correctly.
        seq, hidden = good_reference
        good = client.post("/v1/encode", json={"inputs": [seq.tolist()]})
        assert good.status_code == 200, good.text
        got = as_array(good.json()["data"][0]["embeddings"])
        np.testing.assert_allclose(got, hidden, rtol=0, atol=1e-5)  # same graph: fp32 noise


def test_response_too_large_says_how_large(limited_url: str) -> None:
    body = {"inputs": [SEQ30], "return_attention": True}
    r = httpx.post(f"{limited_url}/v1/encode", json=body, timeout=TIMEOUT)
    assert r.status_code == 413, r.text
    message = r.json()["error"]
    assert re.search(r"\d[\d,.]*\s*(bytes|B|kB|KB|MB)\b", message), message


def test_limits_are_inclusive(limited_url: str) -> None:
    """Exactly at every limit is accepted, and an accepted response fits the response limit."""
    seqs = sequences((14, 14, 12), seed=22)  # 3 sequences, 40 tokens
    with httpx.Client(base_url=limited_url, timeout=TIMEOUT) as client:
        r = client.post("/v1/encode", json={"inputs": [b64_array(s) for s in seqs]})
        assert r.status_code == 200, r.text
        assert len(r.content) <= int(LIMITS["max_response_bytes"])
        assert r.json()["usage"] == {"sequences": 3, "tokens": 40}
        longest = b64_array(sequences((32,), seed=23)[0])
        r = client.post(
            "/v1/encode",
            json={
                "inputs": [longest],
                "return_attention": True,
                "attention": {"reduce": "mean"},
                "encoding_format": "base64",  # as float, its bound (~57 kB) exceeds the limit
            },
        )
        assert r.status_code == 200, r.text
        assert len(r.content) <= int(LIMITS["max_response_bytes"])
        assert as_array(r.json()["data"][0]["attention"]).shape == (N_LAYERS, 1, 32, 32)


def test_body_at_limit_is_accepted(limited_url: str) -> None:
    body = _padded_body(int(LIMITS["max_body_bytes"]))
    r = httpx.post(
        f"{limited_url}/v1/encode",
        content=body,
        headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text


def test_content_type_with_charset_is_accepted(http_client: httpx.Client) -> None:
    r = http_client.post(
        "/v1/encode",
        content=json.dumps({"inputs": [[ROW]]}).encode(),
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_huge_finite_inputs_never_answer_nan(
    http_client: httpx.Client, encoding_format: str
) -> None:
    """1e20 is a valid float32, but LayerNorm's variance overflows: the model yields NaN.

    A 200 must never carry NaN (JSON null in float format); the server should refuse
    such inputs (422 invalid_input) or answer finite numbers.
    """
    x = sequences((4,), seed=24)[0] * np.float32(1e20)
    assert np.isfinite(x).all()
    r = http_client.post(
        "/v1/encode",
        json={
            "inputs": [b64_array(x)],
            "return_attention": True,
            "pooling": "mean",
            "return_embeddings": True,
            "encoding_format": encoding_format,
        },
    )
    if r.status_code == 200:
        item = r.json()["data"][0]
        for key in ("embeddings", "attention", "pooled"):
            value = item[key]
            assert "null" not in json.dumps(value), f"{key} holds null (NaN) in a 200 answer"
            assert np.isfinite(as_array(value)).all(), f"{key} holds NaN/Inf in a 200 answer"
    else:
        assert (r.status_code, r.json()["error_type"]) == (422, "invalid_input"), r.text
