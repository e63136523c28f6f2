"""The session cache: each pre-packed graph's optimised form, made once per machine.

onnxruntime can write a graph it has optimised with its *pre-packed* weights (each
MatMul's constant operand in the layout its kernels want) in the graph's external
data file. A session opened from that file maps the pre-packed weights instead of
packing a private copy, so every session of the graph, in this process or another,
shares one copy through the page cache. The file is specific to the machine's CPU
and to the onnxruntime that wrote it, so it is made at load into a cache directory
(``ATTNSERVE_SESSION_CACHE_DIR``), never shipped in a model directory.

An entry is two files named by its key, the SHA-256 over everything that changes the
optimised graph (:func:`entry_key`): ``<key>.onnx``, the graph, and ``<key>.json``, its
record (the key, the graph's SHA-256 and the blobs it names). The graph's weights and
their pre-packed forms are not in a data file of its own but in ``blobs/``, one file per
initializer named by the SHA-256 of its bytes (service/prepacked_blobs.py): the graphs
of one model (``model.onnx``, ``model_attn.onnx``) and models with the same weights name
the same blobs, so every session of any of them maps one copy. A blob is written under a
temporary name and renamed into place, the graph next and the record last, so a reader
sees a whole entry or none; on reuse the graph and every blob it names are checked (a
blob against its name), and an entry that fails is made again. After an entry is made,
the least recently used others are removed until the cache fits
``ATTNSERVE_SESSION_CACHE_BYTES`` (each blob counted once), then every blob no entry
names. A directory that cannot be written, or that is not this server's user's alone,
falls back to packing in memory (today's behaviour), with one log line per server.

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
from service.prepacked_blobs import BLOBS, rewrite

log = logging.getLogger(__name__)

# The names onnxruntime writes an entry's graph and data file under, in staging.
GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
GRAPH_SUFFIX = ".onnx"
RECORD_SUFFIX = ".json"
ENTRY_FORMAT = 2  # 2: weights in shared blobs/; 1: a folder per entry with its data file
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
        self.blobs = root / BLOBS
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
        try:
            self._check_private()
            if self._verified(key):
                self.reused += 1
                with contextlib.suppress(OSError):  # its last use, for eviction
                    os.utime(self._record(key))
                log.info("session cache: reused the optimised %s (%s)", name, key[:12])
                return self._graph(key)
            made = self._make(key, write)
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

    def _graph(self, key: str) -> Path:
        return self.root / f"{key}{GRAPH_SUFFIX}"

    def _record(self, key: str) -> Path:
        return self.root / f"{key}{RECORD_SUFFIX}"

    def _check_private(self) -> None:
        """The directory is made ours alone (0700) and checked to be: a graph another
        user could write would be run by this server (the record proves a file whole,
        not who wrote it). OSError if it is not."""
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
        self.blobs.mkdir(mode=0o700, exist_ok=True)
        self._private = True

    def _blob_whole(self, name: str) -> bool:
        """Whether blob ``name`` is there with the bytes its name says; one that is not
        is removed (made again by the next entry that needs it)."""
        if len(name) != 64 or name.strip("0123456789abcdef"):
            return False  # no blob's name: never a path to open or remove
        path = self.blobs / name
        try:
            if sha256_file(path) == name:
                return True
        except OSError:
            return False
        log.warning("session cache: blob %s is corrupt; removed", name[:12])
        with contextlib.suppress(OSError):
            path.unlink()
        return False

    def _verified(self, key: str) -> bool:
        """Whether entry ``key`` is whole: its record names ``key``, its graph's SHA-256
        and blobs that are whole."""
        if not self._record(key).exists():
            return False
        try:
            saved = json.loads(self._record(key).read_text())
            whole = saved["key"] == key and sha256_file(self._graph(key)) == saved["graph"]
            # Every blob checked (no short cut), so each corrupt one is removed.
            whole = all([whole, *(self._blob_whole(str(n)) for n in saved["blobs"])])
        except (OSError, ValueError, KeyError, TypeError):
            whole = False
        if not whole:
            log.warning("session cache: entry %s is stale or corrupt; making it again", key[:12])
            self._remove(key)
        return whole

    def _remove(self, key: str) -> None:
        for path in (self._record(key), self._graph(key)):  # the record first: no entry
            with contextlib.suppress(OSError):
                path.unlink()

    def _store(self, content: bytes) -> str:
        """Blob ``content`` in ``blobs/``, written unless a whole one is there: its name."""
        name = hashlib.sha256(content).hexdigest()
        if not self._blob_whole(name):
            temporary = self.blobs / f".{name[:12]}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
            try:
                temporary.write_bytes(content)
                temporary.rename(self.blobs / name)  # atomic: whole or absent
            finally:
                with contextlib.suppress(OSError):
                    temporary.unlink()
        return name

    def _make(self, key: str, write: Writer) -> Path | None:
        staging = self.root / f".{key[:12]}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        staging.mkdir()
        try:
            try:
                write(staging / GRAPH_FILE)
            except Exception as exc:  # onnxruntime's own untyped error: pack in memory
                log.warning("session cache: onnxruntime could not write %s: %s", key[:12], exc)
                return None
            data = staging / DATA_FILE
            if not data.exists():
                data.touch()  # no weight large enough to be external
            size = data.stat().st_size + (staging / GRAPH_FILE).stat().st_size
            if size > self.max_bytes:
                log.warning(
                    "session cache: entry %s takes %d bytes, more than "
                    "ATTNSERVE_SESSION_CACHE_BYTES (%d): not kept",
                    key[:12],
                    size,
                    self.max_bytes,
                )
                return None
            names: list[str] = []

            def store(content: bytes) -> str:
                names.append(self._store(content))
                return names[-1]

            try:
                graph = rewrite(staging / GRAPH_FILE, data, store)
            except ValueError as exc:  # not a graph we can rewrite: pack in memory
                log.warning("session cache: cannot share %s's weights: %s", key[:12], exc)
                return None
            record = {"format": ENTRY_FORMAT, "key": key, "blobs": sorted(set(names))}
            record["graph"] = hashlib.sha256(graph).hexdigest()
            (staging / "graph").write_bytes(graph)
            (staging / "record").write_text(json.dumps(record, indent=1))
            (staging / "graph").rename(self._graph(key))
            (staging / "record").rename(self._record(key))  # the entry, whole
            # Another server evicting meanwhile removes blobs no record names yet: the
            # ones it took are written again.
            if not all((self.blobs / n).exists() for n in names):
                rewrite(staging / GRAPH_FILE, data, self._store)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._evict(keep=key)
        return self._graph(key)

    def _evict(self, keep: str) -> None:
        """Remove the least recently used entries until the cache fits ``max_bytes``
        (``keep`` stays), then every blob no entry names, staging a killed writer left
        behind, and entries of the old layout (a folder each)."""
        now = time.time()
        for folder in (self.root, self.blobs):
            for path in folder.iterdir():
                stale = path.name.endswith(".tmp") and path.name.startswith(".")
                # A graph with no record: its writer died before the record went in.
                key = path.name.removesuffix(GRAPH_SUFFIX)
                stale = stale or (key != path.name and not self._record(key).exists())
                old_layout = path.is_dir() and path != self.blobs and not stale
                with contextlib.suppress(OSError):  # another server's, just removed
                    if old_layout or (stale and now - path.stat().st_mtime > STAGING_SECONDS):
                        if path.is_dir():
                            shutil.rmtree(path, ignore_errors=True)
                        else:
                            path.unlink()
        blobs: dict[str, int] = {}
        for path in self.blobs.iterdir():
            with contextlib.suppress(OSError):
                if not path.name.startswith("."):
                    blobs[path.name] = path.stat().st_size
        entries: list[tuple[float, str, int, set[str]]] = []
        for record in self.root.glob(f"*{RECORD_SUFFIX}"):
            key = record.name.removesuffix(RECORD_SUFFIX)
            try:
                used = record.stat().st_mtime
                named = {str(n) for n in json.loads(record.read_text())["blobs"]}
                size = self._graph(key).stat().st_size
            except (OSError, ValueError, KeyError, TypeError):
                used, named, size = 0.0, set(), 0  # half removed: the first to go
            entries.append((used, key, size, named))
        entries.sort(key=lambda e: e[0])

        def total() -> int:
            named = set().union(*(e[3] for e in entries))
            return sum(e[2] for e in entries) + sum(blobs.get(n, 0) for n in named)

        for entry in list(entries):
            if total() <= self.max_bytes:
                break
            if entry[1] == keep:
                continue
            self._remove(entry[1])
            entries.remove(entry)
            log.info("session cache: removed %s (least recently used) to fit", entry[1][:12])
        named = set().union(*(e[3] for e in entries))
        for name in blobs.keys() - named:
            with contextlib.suppress(OSError):
                (self.blobs / name).unlink()


_caches: dict[tuple[Path, int], SessionCache] = {}


def session_cache(root: Path | None, max_bytes: int) -> SessionCache | None:
    """The server's one cache of ``root`` (None: off), shared by every model it loads, so
    an unwritable directory is said once."""
    if root is None:
        return None
    return _caches.setdefault((root, max_bytes), SessionCache(root, max_bytes))
