"""The model repository on disk: which directories hold models and which versions.

A model directory is either one export (its manifest at the top: version "1") or
Triton's layout, numbered versions beneath it (``<name>/<version>/``, each one
export); the highest version is the one to serve. Nothing here opens a session:
the engine decides what to load, the runtime loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_export.manifest import check_file_name, graph_io

FLAT_VERSION = "1"  # the version of a directory that is one export


@dataclass(frozen=True)
class ModelVersion:
    """One loadable export: its model directory's name, version and files."""

    name: str
    version: str
    path: Path

    def fingerprint(self) -> tuple[str, int, int]:
        """Changes when the export is replaced (poll mode reloads on a change)."""
        manifest = (self.path / graph_io.CONFIG_FILE).stat()
        return self.version, manifest.st_mtime_ns, manifest.st_size

    def estimated_bytes(self) -> int:
        """Memory it takes once loaded: its files' size (each graph's weights are held by
        its session; measured resident size stays within this for our exports)."""
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())


def model_dir(repository: Path, name: str) -> Path:
    """The directory of model ``name``: a plain name (1 to 255 bytes, no ``/``, not hidden),
    else ManifestError; a name of the repository API is a client's input."""
    return repository / check_file_name(name, "a model name")


def model_directories(repository: Path) -> list[Path]:
    return sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))


def versions(model_dir: Path) -> list[ModelVersion]:
    """Every export in ``model_dir``, lowest version first (none: not a model, or the
    directory is gone)."""
    if not model_dir.is_dir():
        return []
    if (model_dir / graph_io.CONFIG_FILE).is_file():
        return [ModelVersion(model_dir.name, FLAT_VERSION, model_dir)]
    numbered = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return [
        ModelVersion(model_dir.name, str(int(p.name)), p)
        for p in sorted(numbered, key=lambda p: int(p.name))
    ]


def latest(model_dir: Path) -> ModelVersion | None:
    """The version to serve: the highest."""
    found = versions(model_dir)
    return found[-1] if found else None
