"""Progress of a model's load, warm-up and calibration, as log lines.

A server's output is its log (text or JSON lines, ``service.logs``), so each step
is one line as it starts: ``loading model minilm-l6: graph 3/7
model_attn.onnx (2.1 s so far, about 3.4 s left)``, the time left estimated from
the graphs done so far. The lines are INFO once the work has run ``QUIET_FOR``
seconds and DEBUG before: a load that takes half a second (MiniLM's) fills no
one's start-up log with lines nobody has time to read; a slow one shows how far
it has come.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

QUIET_FOR = 1.0  # seconds of a load, warm-up or calibration logged at DEBUG only


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
        self._log.log(
            logging.INFO if elapsed >= QUIET_FOR else logging.DEBUG,
            "%s: graph %d/%d %s (%.1f s so far, %s)",
            self._what,
            self._done + 1,
            n,
            name,
            elapsed,
            left,
        )
        self._done += 1
