from __future__ import annotations

import httpx


def test_server_answers(server_url: str) -> None:
    r = httpx.get(f"{server_url}/v1/models")
    assert r.status_code == 200
    assert r.json()["data"][0]["name"] == "tiny"
