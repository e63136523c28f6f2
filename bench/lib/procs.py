"""Process sampling from /proc: a server's process tree, its CPU and its memory.

Read from /proc directly (psutil is not a dependency); every reader tolerates a
process that exits while it is read.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += parents.get(pid, [])
    return tree


def cpu_and_rss(pids: list[int]) -> tuple[float, float]:
    """Summed CPU seconds and RSS bytes of ``pids`` (from /proc/PID/stat)."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = rss = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12])) / tick
        rss += int(fields[21]) * page
    return cpu, rss


def vm_rss(pid: int, field: str = "VmRSS") -> int | None:
    """``field`` of /proc/PID/status in bytes (VmRSS, VmHWM…); None once the process is
    gone (a zombie has no VmRSS either)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


class Sampler:
    """Peak RSS and CPU cores of a process tree while a run goes on (a context manager:
    ``peak`` in bytes and ``cores`` are read after it exits)."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        self.pids = process_tree(root)
        self.peak = 0.0
        self.cores = 0.0
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, cpu_and_rss(self.pids)[1])

    def __enter__(self) -> Sampler:
        self.cpu0, self.peak = cpu_and_rss(self.pids)
        self.wall0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        cpu1, rss = cpu_and_rss(self.pids)
        self.peak = max(self.peak, rss)
        self.cores = (cpu1 - self.cpu0) / (time.perf_counter() - self.wall0)
