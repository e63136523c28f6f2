"""The session cache: each pre-packed graph's optimised form, made once per machine.

onnxruntime can write a graph it has optimised with its *pre-packed* weights (each
MatMul's constant operand in the layout its kernels want) in the graph's external
data file. A session opened from that file maps the pre-packed weights instead of
packing a private copy, so every session of the graph, in this process or another,
shares one copy through the page cache. The file is specific to the machine's CPU
and to the onnxruntime that wrote it, so it is made at load into a cache directory
(``ATTNSERVE_SESSION_CACHE_DIR``), never shipped in a model directory.

An entry is a directory named by its key: the SHA-256 over everything that changes
the file (:func:`entry_key`). It holds ``model.onnx``, its data file and
``entry.json`` (the key and each file's SHA-256). It is written under a temporary
name and renamed into place, so a reader sees a whole entry or none; on reuse every
file is checked against ``entry.json`` and an entry that fails is made again. After
an entry is made, the least recently used others are removed until the cache fits
``ATTNSERVE_SESSION_CACHE_BYTES``. A directory that cannot be written, or that is
not this server's user's alone, falls back to packing in memory (today's behaviour),
with one log line per server.

This module knows no onnxruntime: the runtime hands it the function that writes an
entry's graph (:data:`Writer`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from model_export.manifest import sha256_file

log = logging.getLogger(__name__)

GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
ENTRY_FILE = "entry.json"
ENTRY_FORMAT = 1
_CPUINFO = Path("/proc/cpuinfo")
# A staging folder older than this was left by a writer that died (a write takes seconds).
STAGING_SECONDS = 3600

# Writes the optimised graph to the path given (its data file beside it, DATA_FILE).
Writer = Callable[[Path], None]


def cpu_features() -> str:
    """The SHA-256 of this CPU's feature flags (the first ``flags`` line of /proc/cpuinfo;
    the machine's name where there is none): what the optimiser's kernels chose by."""
    try:
        for line in _CPUINFO.read_text(errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                return hashlib.sha256(line.encode()).hexdigest()
    except OSError:
        pass
    return hashlib.sha256(os.uname().machine.encode()).hexdigest()


def entry_key(*, sources: list[str], runtime: str, options: str) -> str:
    """The SHA-256 naming one entry: the graph's and its weights' SHA-256 (``sources``),
    the onnxruntime version and execution providers (``runtime``), the session options
    that change the optimised file (``options``) and the CPU's features."""
    parts = {"format": ENTRY_FORMAT, "sources": sources, "runtime": runtime}
    parts |= {"options": options, "cpu": cpu_features()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class SessionCache:
    """One cache directory, bounded to ``max_bytes``; ``made`` and ``reused`` count entries
    made and reused by this process (the tests read them in the server's log)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.made = 0
        self.reused = 0
        self._off = False  # set when the directory cannot be used: said once
        self._private = False  # checked to be this server's alone

    def graph(self, key: str, name: str, write: Writer) -> Path | None:
        """The optimised graph of ``key`` (``name`` for log lines), reused or made by
        ``write``; None when the cache cannot hold it (open the original then)."""
        if self._off:
            return None
        entry = self.root / key
        try:
            self._check_private()
            if self._verified(entry, key):
                self.reused += 1
                with contextlib.suppress(OSError):  # its last use, for eviction
                    os.utime(entry / ENTRY_FILE)
                log.info("session cache: reused the optimised %s (%s)", name, key[:12])
                return entry / GRAPH_FILE
            made = self._make(entry, key, write)
        except OSError as exc:
            self._off = True
            log.warning(
                "session cache: cannot use %s (%s); each session packs its own weights",
                self.root,
                exc.strerror or exc,
            )
            return None
        if made is not None:
            self.made += 1
            log.info("session cache: made the optimised %s (%s)", name, key[:12])
        return made

    def _check_private(self) -> None:
        """The directory is made ours alone (0700) and checked to be: a graph another
        user could write would be run by this server (``entry.json`` proves a file
        whole, not who wrote it). OSError if it is not."""
        if self._private:
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = self.root.stat()
        if found.st_uid != os.getuid() or found.st_mode & 0o022:
            raise OSError(
                errno.EPERM,
                f"owned by uid {found.st_uid} with mode {found.st_mode & 0o777:o}: it must be "
                f"this server's (uid {os.getuid()}) and writable by no one else",
            )
        self._private = True

    def _verified(self, entry: Path, key: str) -> bool:
        """Whether ``entry`` is whole: its record names ``key`` and every file's SHA-256."""
        record = entry / ENTRY_FILE
        if not entry.exists():
            return False
        try:
            saved = json.loads(record.read_text())
            files = saved["files"]
            whole = saved["key"] == key and GRAPH_FILE in files
            whole = whole and all(sha256_file(entry / f) == want for f, want in files.items())
        except (OSError, ValueError, KeyError, TypeError):
            whole = False
        if not whole:
            log.warning("session cache: entry %s is stale or corrupt; making it again", key[:12])
            shutil.rmtree(entry, ignore_errors=True)
        return whole

    def _make(self, entry: Path, key: str, write: Writer) -> Path | None:
        staging = self.root / f".{key[:12]}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        staging.mkdir()
        try:
            try:
                write(staging / GRAPH_FILE)
            except Exception as exc:  # onnxruntime's own untyped error: pack in memory
                log.warning("session cache: onnxruntime could not write %s: %s", key[:12], exc)
                return None
            files = {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}
            size = sum((staging / name).stat().st_size for name in files)
            if size > self.max_bytes:
                log.warning(
                    "session cache: entry %s takes %d bytes, more than "
                    "ATTNSERVE_SESSION_CACHE_BYTES (%d): not kept",
                    key[:12],
                    size,
                    self.max_bytes,
                )
                return None
            record = {"format": ENTRY_FORMAT, "key": key, "files": files}
            (staging / ENTRY_FILE).write_text(json.dumps(record, indent=1))
            try:
                staging.rename(entry)  # atomic: whole or absent
            except OSError:
                # Another server made it first: use theirs if it is whole.
                if not self._verified(entry, key):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._evict(keep=entry)
        return entry / GRAPH_FILE

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used entries until the cache fits ``max_bytes``
        (``keep`` stays), and staging folders a killed writer left behind."""
        entries: list[tuple[float, int, Path]] = []
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                try:
                    if time.time() - entry.stat().st_mtime > STAGING_SECONDS:
                        shutil.rmtree(entry, ignore_errors=True)
                except OSError:
                    pass  # another server's, just removed
                continue
            if not entry.is_dir():
                continue
            try:
                used = (entry / ENTRY_FILE).stat().st_mtime
                size = sum(p.stat().st_size for p in entry.iterdir() if p.is_file())
            except OSError:
                used, size = 0.0, 0
            entries.append((used, size, entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            if entry == keep:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            total -= size
            log.info("session cache: removed %s (least recently used) to fit", entry.name[:12])


_caches: dict[tuple[Path, int], SessionCache] = {}


def session_cache(root: Path | None, max_bytes: int) -> SessionCache | None:
    """The server's one cache of ``root`` (None: off), shared by every model it loads, so
    an unwritable directory is said once."""
    if root is None:
        return None
    return _caches.setdefault((root, max_bytes), SessionCache(root, max_bytes))
