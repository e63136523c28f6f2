"""Waiting for something a server does in its own time: one poller for every test."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    check: Callable[[], object], what: str, timeout: float = 30.0, interval: float = 0.05
) -> float:
    """Poll ``check()`` until it is true; the seconds it took. Past ``timeout`` seconds,
    fail with an AssertionError saying ``what`` (what did not happen, or what went on)."""
    started = time.monotonic()
    while not check():
        waited = time.monotonic() - started
        if waited > timeout:
            raise AssertionError(f"{what} (waited {timeout:g} s)")
        time.sleep(interval)
    return time.monotonic() - started
