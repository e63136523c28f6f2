"""What the hostile-client and shutdown tests share: raw requests, metrics, polling."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def post_head(path: str, length: int, **headers: str) -> bytes:
    """The request line and headers of a JSON POST announcing ``length`` body bytes."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` on /metrics that carry ``labels`` (0 if none)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def wait_for(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``check`` until it holds or ``timeout`` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
