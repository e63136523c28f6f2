"""How fast the inference lanes drain work: the estimate behind Retry-After.

Tokens finished ÷ seconds the lanes were busy, both decayed by
``exp(-busy seconds ÷ MEMORY_SECONDS)`` so the newest runs count most (the
machine's load changes). Each run adds the seconds since it started or since
the last run finished, whichever is later: runs overlapping on two lanes add
their tokens over the same seconds and count at their combined rate, not at
the mean of each run's own.
"""

from __future__ import annotations

import math

# Seconds of busy lanes over which an older run's weight falls by e.
MEMORY_SECONDS = 2.0
# Retry-After bounds, in seconds.
RETRY_AFTER_MIN, RETRY_AFTER_MAX = 1, 60


class DrainRate:
    def __init__(self) -> None:
        self._tokens = 0.0  # decayed tokens finished, and the busy seconds they took
        self._seconds = 0.0
        self._last_finish = 0.0

    def finished(self, tokens: int, start: float, now: float) -> None:
        """A run of ``tokens`` that started at ``start`` finished at ``now``
        (``time.monotonic()``)."""
        busy = max(now - max(start, self._last_finish), 1e-6)
        self._last_finish = now
        keep = math.exp(-busy / MEMORY_SECONDS)
        self._tokens = self._tokens * keep + tokens
        self._seconds = self._seconds * keep + busy

    def seconds_for(self, tokens: float) -> float:
        """How long ``tokens`` take at the measured rate (0 while nothing is measured)."""
        if not self._tokens or not self._seconds:
            return 0.0
        return tokens * self._seconds / self._tokens


def retry_after(seconds: float) -> str:
    """Retry-After for ``seconds`` of backlog: whole seconds, within the bounds."""
    return str(min(max(math.ceil(seconds), RETRY_AFTER_MIN), RETRY_AFTER_MAX))
