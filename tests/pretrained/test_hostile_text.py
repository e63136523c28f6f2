"""Hostile text tensors on /v2, against a real all-MiniLM-L6-v2 server (issue 22).

BYTES ``data`` nested ≥ 481 levels deep reached the recursion limit: a 500 and a
190 kB traceback in the log per request. The nesting is now bounded by the
tensor's rank, without recursion.
"""

from __future__ import annotations

import httpx
import pytest

MODEL = "minilm-l6"
INFER = f"/v2/models/{MODEL}/infer"


def nested_text_body(depth: int) -> bytes:
    data = "[" * depth + '"a text"' + "]" * depth
    return (
        f'{{"inputs":[{{"name":"text","datatype":"BYTES","shape":[1],"data":{data}}}]}}'
    ).encode()


@pytest.mark.parametrize("depth", [2, 480, 481, 1000])
def test_deeply_nested_bytes_data_is_422(minilm_server_url: str, depth: int) -> None:
    r = httpx.post(f"{minilm_server_url}{INFER}", content=nested_text_body(depth), timeout=30)
    assert r.status_code == 422, r.text
    assert "nested deeper" in r.json()["error"]


def test_bytes_data_nested_as_its_shape_is_answered(minilm_server_url: str) -> None:
    r = httpx.post(f"{minilm_server_url}{INFER}", content=nested_text_body(1), timeout=30)
    assert r.status_code == 200, r.text
