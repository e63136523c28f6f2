"""Where one request's time went: a record written by the engine (preparing) and the
batcher (queueing, running), read by the request scope's traces, metrics and TEI's
timing headers. A module of its own, below both, so the request scope protocols hold
imports no batcher."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunTiming:
    """Where one request's time went (seconds): preparing by the engine, the rest by
    the batcher."""

    # When (time.monotonic()) each phase began and ended, for traces; None: never reached.
    prepare_began: float | None = None  # parsing, tokenizing, checking: before queueing
    prepare_ended: float | None = None
    queued: float | None = None  # first submitted to the batcher
    started: float | None = None  # its first run began
    finished: float | None = None  # its last run ended
    queue: float = 0.0  # from submission to its first run
    compute: float = 0.0  # the runs that held its sequences (shared with their batch)

    @property
    def prepare(self) -> float:
        """Seconds spent preparing (0 if it never was)."""
        if self.prepare_began is None or self.prepare_ended is None:
            return 0.0
        return self.prepare_ended - self.prepare_began
