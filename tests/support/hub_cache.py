"""A Hugging Face cache folder written as huggingface_hub writes it, from local files.

``models--{org}--{name}/blobs/<etag>`` holds each file once (an LFS file's etag is
its SHA-256, a small file's the git blob SHA-1), ``snapshots/<commit>/<path>`` links
to the blob by a relative symbolic link, ``refs/<name>`` holds a commit. Exports from
a Hub id then read it with ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` set: the code's
real path through ``snapshot_download``, with nothing fetched from the Hub.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".model")


def etag(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix in LFS_SUFFIXES:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_commit(
    cache: Path,
    repo_id: str,
    commit: str,
    source: Path,
    *,
    refs: Iterable[str] = ("main",),
    skip: Iterable[str] = (),
) -> Path:
    """Cache ``source``'s files (except ``skip``, relative names) as ``repo_id`` at
    ``commit``, pointed to by ``refs``; returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    left_out = set(skip)
    for file in sorted(source.rglob("*")):
        relative = file.relative_to(source).as_posix()
        if not file.is_file() or relative in left_out:
            continue
        blob = repo / "blobs" / etag(file)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(file, blob)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


def offline_env(cache: Path) -> dict[str, str]:
    """The environment of a process that reads only ``cache``: offline, no token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return env | {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(cache.parent / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
