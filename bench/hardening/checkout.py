"""The side of a before/after figure: a checkout whose exporter and server are measured.

An older version's server cannot read what a newer exporter writes (format versions), so
each side exports its own models with its own ``python -m model_export`` (run in that
checkout, with this interpreter) and is served by its own ``python -m service``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def export(service_root: Path, out: Path, *args: str) -> Path:
    """``python -m model_export ARGS --out OUT`` as the checkout ``service_root`` has it."""
    subprocess.run(
        [sys.executable, "-m", "model_export", *args, "--out", str(out)],
        cwd=service_root,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def minilm(service_root: Path, into: Path) -> Path:
    """all-MiniLM-L6-v2 exported by ``service_root`` into ``into/minilm-l6`` (about a
    minute; the compact attention graph left out, as no figure here needs it)."""
    return export(
        service_root, into / "minilm-l6", "--preset", "minilm-l6", "--no-compact-attention"
    )
