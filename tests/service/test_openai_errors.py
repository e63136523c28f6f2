"""/v1/embeddings renders every error in OpenAI's shape, with OpenAI's statuses.

The tiny model has no tokenizer, so everything it is asked here is refused;
the successful paths run against all-MiniLM-L6-v2 in tests/pretrained.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.tiny import MODEL

CASES = [
    # (id, body or raw bytes, headers, status, code, param)
    ("text-without-tokenizer", {"model": MODEL, "input": "hi"}, None, 400,
     "unsupported_by_model", None),
    ("ids-without-tokenizer", {"model": MODEL, "input": [1, 2]}, None, 400,
     "unsupported_by_model", None),
    ("unknown-model", {"model": "nope", "input": "hi"}, None, 404, "model_not_found", "model"),
    ("model-missing", {"input": "hi"}, None, 400, "invalid_input", "model"),
    ("input-missing", {"model": MODEL}, None, 400, "invalid_input", "input"),
    ("input-a-number", {"model": MODEL, "input": 3}, None, 400, "invalid_input", "input"),
    ("unknown-field", {"model": MODEL, "input": "hi", "temperature": 1}, None, 400,
     "invalid_input", "temperature"),
    ("dimensions-zero", {"model": MODEL, "input": "hi", "dimensions": 0}, None, 400,
     "invalid_input", "dimensions"),
    ("too-many", {"model": MODEL, "input": ["a"] * 2049}, None, 413, "payload_too_large", None),
    ("bad-json", b'{"model": ', None, 400, "invalid_json", None),
    ("not-json", b"{}", {"content-type": "text/plain"}, 415, "unsupported_media_type", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "headers", "status", "code", "param"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_errors_in_openai_shape(
    http_client: httpx.Client,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None,
    status: int,
    code: str,
    param: str | None,
) -> None:
    if isinstance(body, bytes):
        r = http_client.post(
            "/v1/embeddings",
            content=body,
            headers=headers or {"content-type": "application/json"},
        )
    else:
        r = http_client.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == "invalid_request_error"
    assert error["message"] and "Traceback" not in r.text
    # The native routes keep their own shape on the same server.
    native = http_client.post("/v1/encode", json={"inputs": [], "model": "nope"})
    assert set(native.json()) == {"error", "error_type"}
