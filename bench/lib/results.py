"""Results JSON: what a benchmark measured, written before anything is rendered from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> Path:
    """``data`` as indented JSON at ``path`` (its folder made); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
