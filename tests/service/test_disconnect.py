"""Work for clients that went away is dropped, not computed.

A long attention request keeps the inference thread busy; meanwhile clients
send the same request and hang up. Their runs must never execute: the
server's own run counter (``attnserve_inference_seconds_count``) shows how
many onnxruntime runs happened.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx

from tests.support.metrics import metric

TEXTS = ["word " * 250] * 16  # 16 sequences of 252 tokens: several seconds with attention
BODY = {"inputs": TEXTS, "return_attention": True, "attention": {"reduce": "rollout"}}


def attention_runs(url: str) -> float:
    return metric(url, "attnserve_inference_seconds_count", graph="attention", model="minilm-l6")


def send_and_hang_up(url: str) -> None:
    """Send a whole request, then close the socket without reading the answer."""
    body = httpx.Request("POST", f"{url}/v1/encode", json=BODY)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST /v1/encode HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body.read())}\r\n\r\n"
        )
        sock.sendall(head.encode() + body.read())
        time.sleep(0.2)


def test_abandoned_requests_are_not_computed(minilm_server_url: str) -> None:
    url = minilm_server_url
    before = attention_runs(url)
    result: dict[str, httpx.Response] = {}
    first = threading.Thread(
        target=lambda: result.update(r=httpx.post(f"{url}/v1/encode", json=BODY, timeout=120))
    )
    first.start()
    time.sleep(0.3)  # the first request is now running
    for _ in range(4):
        send_and_hang_up(url)
    first.join(timeout=120)
    assert result["r"].status_code == 200, result["r"].text
    runs_of_first = attention_runs(url) - before
    time.sleep(1.0)  # anything abandoned but still computed would show up by now
    assert attention_runs(url) - before == runs_of_first
    # Had the 4 abandoned requests been computed, there would be 5x the runs.
    assert runs_of_first >= 1
    alone = attention_runs(url)
    r = httpx.post(f"{url}/v1/encode", json=BODY, timeout=120)
    assert r.status_code == 200
    assert attention_runs(url) - alone == runs_of_first  # one request's worth, as above
