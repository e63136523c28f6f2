"""A 2xx answer the SDK cannot read is an APIResponseError, never a bare decode error.

Only a broken proxy or a mismatched server version can produce these, so the
answers come from httpx.MockTransport.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from attnserve_client import APIResponseError, AttnserveError, Client


def _client(body: bytes, content_type: str = "application/json") -> Client:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return Client("http://attnserve.test", transport=httpx.MockTransport(answer), max_retries=0)


def test_html_instead_of_json() -> None:
    client = _client(b"<html>proxy login</html>", "text/html")
    with client, pytest.raises(APIResponseError, match="not JSON") as info:
        client.models()
    assert isinstance(info.value, AttnserveError)


def test_json_of_the_wrong_shape() -> None:
    with _client(b'{"unexpected": true}') as client, pytest.raises(APIResponseError):
        client.encode(np.zeros((1, 2, 4), dtype=np.float32))


def test_an_array_missing_beside_its_siblings_is_an_error_not_nan() -> None:
    body = (
        b'{"model": "m", "usage": {"sequences": 2, "tokens": 2}, "data": ['
        b'{"index": 0, "embeddings": [[1.0]], "attention": null, "pooled": null},'
        b'{"index": 1, "embeddings": null, "attention": null, "pooled": null}]}'
    )
    with _client(body) as client, pytest.raises(APIResponseError, match="missing"):
        client.encode(np.zeros((2, 1, 1), dtype=np.float32))
