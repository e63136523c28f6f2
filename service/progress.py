"""Progress of a model's load, warm-up and calibration, as log lines.

A server's output is its log (text or JSON lines, ``service.logs``), so each step
is one INFO line as it starts: ``loading model minilm-l6: graph 3/7
model_attn.onnx (2.1 s so far, about 3.4 s left)``, the time left estimated from
the graphs done so far.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence


class GraphSteps:
    """Logs ``<what>: graph k/n <name> (...)`` as each of ``names`` starts."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        names: Sequence[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._what, self._names = log, what, list(names)
        self._clock = clock
        self._start = clock()
        self._done = 0

    def start(self, name: str) -> None:
        """``name`` starts now (the one after those started before it)."""
        elapsed, n = self._clock() - self._start, len(self._names)
        left = (
            f"about {elapsed / self._done * (n - self._done):.1f} s left"
            if self._done
            else "time left: after the first"
        )
        self._log.info(
            "%s: graph %d/%d %s (%.1f s so far, %s)",
            self._what,
            self._done + 1,
            n,
            name,
            elapsed,
            left,
        )
        self._done += 1
