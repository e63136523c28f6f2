"""A server whose warm-up failed is never ready, and says so on liveness too.

Orchestrators restart a process whose liveness fails; one that stays "alive"
but can never be ready would sit there forever.
"""

from __future__ import annotations

import httpx

from attnserve_client import Client


def test_failed_warmup_fails_readiness_and_liveness(not_ready_url: str) -> None:
    with Client(not_ready_url, max_retries=0) as client:
        assert client.ready() is False
    deadline_tries = 100
    for _ in range(deadline_tries):  # bounded: the warm-up fails within moments of start-up
        live = httpx.get(f"{not_ready_url}/health/live")
        if live.status_code == 503:
            break
        httpx.get(f"{not_ready_url}/health/ready")  # a beat between polls
    assert live.status_code == 503
    assert live.json()["error_type"] == "not_ready"
    assert "warm-up failed" in live.json()["error"]
