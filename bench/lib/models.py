"""Where the benchmarks find the checkout, its models and their output folder."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from model_export import graph_io

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"  # the model repository `make serve` exports into
DEFAULT_MODEL_DIR = MODELS / "minilm-l6"
OUT = ROOT / "bench" / "out"  # every benchmark's JSON (ignored by git)
TINY_SEED = 1234  # tests/conftest.py's: the tiny model the tests export


def model_config(model_dir: Path) -> dict[str, Any]:
    """The model directory's ``config.json`` (name, architecture, text, optimizations)."""
    config: dict[str, Any] = json.loads((model_dir / graph_io.CONFIG_FILE).read_text())
    return config


@contextmanager
def default_model_dir() -> Iterator[Path]:
    """models/minilm-l6 if exported, else the tiny test model exported to a temp dir."""
    if (DEFAULT_MODEL_DIR / graph_io.CONFIG_FILE).exists():
        yield DEFAULT_MODEL_DIR
        return
    from model_export.config import preset
    from model_export.export import export_model
    from model_export.model import Encoder

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        encoder = Encoder(preset("tiny"), seed=TINY_SEED)
        export_model(encoder, model_dir, name="tiny", seed=TINY_SEED)
        yield model_dir
