"""Writing a model directory all at once: a failed export leaves nothing behind."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_model_dir(out_dir: Path) -> Iterator[Path]:
    """A staging directory beside ``out_dir`` that replaces it only when the block succeeds,
    so a failed export leaves nothing a server could load (and the old one in place)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes it private; a model directory is not secret
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
