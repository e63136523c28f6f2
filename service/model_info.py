"""What the service knows of a model directory, read through its manifest (no onnxruntime).

Kept apart from ``runtime`` so the engine's and protocols' model types never pull
in the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_export.manifest import EncoderConfig, Manifest, ManifestError, graph_io
from service.errors import ModelLoadError
from service.settings import Settings


@dataclass(frozen=True)
class ModelInfo:
    """What the service knows of a model: its manifest, where it lives, its served length."""

    manifest: Manifest
    path: Path
    max_seq_len: int  # the model's own length, capped by the server's setting
    created: int  # Unix time its manifest was written (OpenAI's model "created")
    version: str = "1"  # its version in the repository (<name>/<version>/, or "1")

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def config(self) -> EncoderConfig:
        return self.manifest.architecture

    @property
    def has_tokenizer(self) -> bool:
        return self.manifest.has_tokenizer


def read_model_info(model_dir: Path, settings: Settings, version: str = "1") -> ModelInfo:
    """Read the manifest and check every file's SHA-256 against it."""
    try:
        manifest = Manifest.read(model_dir)
        manifest.verify(model_dir)
    except ManifestError as exc:
        raise ModelLoadError(f"model {model_dir.name!r}: {exc}") from exc
    return ModelInfo(
        manifest=manifest,
        path=model_dir,
        max_seq_len=min(manifest.architecture.max_seq_len, settings.max_seq_len),
        created=int((model_dir / graph_io.CONFIG_FILE).stat().st_mtime),
        version=version,
    )
