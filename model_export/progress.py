"""Progress of an export: which step, how far (k of n), the time left.

An export plans its steps first (``Progress.plan``: each graph's export, then each
graph's validation, ...), each with its expected share of the whole, then runs them
(``Progress.step``). On a terminal one line is rewritten in place (a bar); otherwise
(CI, a container's log, ``make serve`` piped) one plain line is written as each step
starts. The time left is the time so far, scaled by the expected share still to
come over the share done. Every step's time is kept (``timings``):
``bench/export_cost.py`` reports them. With no stream, nothing is shown.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

BAR_WIDTH = 20


@dataclass(frozen=True)
class Step:
    """One step of the plan: its stage ("export", "validate", ...), what it works on
    (a graph file, or a word for the rest) and its expected share of the whole's time
    (relative to the other steps')."""

    stage: str
    name: str
    share: float = 1.0


@dataclass(frozen=True)
class Timing:
    """A step run: its wall-clock seconds, and the CPU seconds of this process's threads
    (less swayed by other processes on a shared machine)."""

    step: Step
    seconds: float
    cpu_seconds: float


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: "8 s", "2 min 05 s"."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60:02d} s"


class Progress:
    """The steps of one export, shown on ``stream`` (none: not shown) and timed."""

    def __init__(
        self,
        title: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.title = title
        self._stream = stream
        self._tty = stream is not None and stream.isatty()
        self._clock = clock
        self._steps: list[Step] = []
        self._start = clock()
        self._done = 0.0  # the shares of the steps finished
        self.timings: list[Timing] = []  # each step run

    def plan(self, steps: Iterable[Step]) -> None:
        """The steps to come, in order; the clock of the estimate starts now."""
        self._steps = list(steps)
        self._start, self._done = self._clock(), 0.0

    @contextmanager
    def step(self, stage: str, name: str) -> Iterator[None]:
        """Run one planned step (one not planned is added to the plan's end)."""
        step = next((s for s in self._steps if (s.stage, s.name) == (stage, name)), None)
        if step is None:
            step = Step(stage, name)
            self._steps.append(step)
        self._show(step)
        begun, cpu = self._clock(), time.process_time()
        yield
        self.timings.append(Timing(step, self._clock() - begun, time.process_time() - cpu))
        self._done += step.share

    def close(self) -> None:
        """Ends the rewritten line (a terminal's): what follows starts on its own."""
        if self._tty and self._stream is not None and self.timings:
            self._stream.write("\n")
            self._stream.flush()

    def _show(self, step: Step) -> None:
        if self._stream is None:
            return
        same = [s for s in self._steps if s.stage == step.stage]
        where = f"{step.stage} {same.index(step) + 1}/{len(same)} {step.name}"
        elapsed = self._clock() - self._start
        total = sum(s.share for s in self._steps) or 1.0
        left = (
            f"about {duration(elapsed * (total - self._done) / self._done)} left"
            if self._done > 0
            else "time left: after the first step"
        )
        if self._tty:
            filled = round(BAR_WIDTH * self._done / total)
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            line = f"{self.title} [{bar}] {where} ({duration(elapsed)}, {left})"
            width = shutil.get_terminal_size().columns - 1
            self._stream.write("\r" + line[:width].ljust(width))
        else:
            self._stream.write(f"{self.title}: {where} ({duration(elapsed)}, {left})\n")
        self._stream.flush()


def timings_table(timings: list[Timing], *, cpu: bool = False) -> str:
    """Seconds per step (wall clock, or ``cpu``): a row per graph (or other thing worked
    on), a column per stage, in the order they ran, with each row's and column's total."""
    stages = list(dict.fromkeys(t.step.stage for t in timings))
    rows: dict[str, dict[str, float]] = {}
    for t in timings:
        row = rows.setdefault(t.step.name, {})
        row[t.step.stage] = row.get(t.step.stage, 0.0) + (t.cpu_seconds if cpu else t.seconds)
    width = max([len("total"), *(len(name) for name in rows)])
    title = "CPU seconds" if cpu else "seconds"
    header = f"{title:<{width}} " + " ".join(f"{s:>9}" for s in [*stages, "total"])
    lines = [header, "-" * len(header)]
    for name, row in [*rows.items()]:
        cells = [f"{row[s]:9.2f}" if s in row else f"{'':>9}" for s in stages]
        lines.append(f"{name:<{width}} " + " ".join([*cells, f"{sum(row.values()):9.2f}"]))
    totals = [sum(row.get(s, 0.0) for row in rows.values()) for s in stages]
    lines.append(f"{'total':<{width}} " + " ".join(f"{t:9.2f}" for t in [*totals, sum(totals)]))
    return "\n".join(lines)
