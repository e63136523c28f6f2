"""What this process really holds in memory: its proportional set size (PSS).

The model memory ledger (``engine/registry.py``) counts each loaded version at what
loading it added to the process's PSS, read from ``/proc/self/smaps_rollup`` (Linux
4.14 and later). PSS, not RSS: with the session cache (``prepacked_cache.py``) a
graph's pre-packed weights are a mapped file shared by every session of that graph,
in this server and in others on the host; RSS counts such a page once per mapping,
PSS divides it between the mappings, so a second session of a graph costs what it
really adds. Where the file cannot be read (another system), :func:`pss_bytes` is
None and the ledger keeps the version's estimate from its files.
"""

from __future__ import annotations

from pathlib import Path

SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")


def pss_bytes() -> int | None:
    """This process's PSS in bytes; None where the kernel does not say."""
    try:
        text = SMAPS_ROLLUP.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024  # the kernel writes kB
    return None


def measured(before: int | None, after: int | None) -> int | None:
    """What happened between two readings added (at least 0); None if either is missing."""
    if before is None or after is None:
        return None
    return max(0, after - before)
