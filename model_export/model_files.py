"""Opening a model directory's file so that what is read is what was checked.

The manifest checks a file's path first (``manifest.resolve_file``: a plain
name whose real path, symbolic links followed, stays inside the directory or the
repository) and reads it after. A file (or a directory above it) swapped for a
symbolic link in between would be followed out of bounds. :func:`open_checked`
closes that window: it opens the checked real path, which has no link in it,
with ``O_NOFOLLOW`` (a link now in its last part is refused), then checks what
it opened by its descriptor: a regular file, whose own path
(``/proc/self/fd``, where there is one; else its device and inode against the
checked path's) is still inside the bound, so a link swapped in above it is
refused too. Everything read through the descriptor is then that file, whatever
happens to the path.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, BinaryIO, Final

FD_PATHS = Path("/proc/self/fd")
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # (POSIX; Windows has no symbolic-link race to close)


class FileChanged(OSError):
    """The checked file is not what the path opens now (a link or another file swapped
    in), or not a regular file."""


def open_checked(real: Path, root: Path) -> BinaryIO:
    """Open ``real`` (a checked real path: absolute, no symbolic link in it, inside the
    real directory ``root``) for reading, refused with FileChanged if what it opens is
    no longer that: see the module's docstring. OSError as ``os.open`` raises it
    otherwise (FileNotFoundError, PermissionError)."""
    try:
        fd = os.open(real, os.O_RDONLY | NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if os.path.islink(real):  # ELOOP (Linux), EMLINK (FreeBSD), ...: a link now
            raise FileChanged("it became a symbolic link after it was checked") from exc
        raise
    try:
        _check_opened(fd, real, root)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_opened(fd: int, real: Path, root: Path) -> None:
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        raise FileChanged("it is not a regular file")
    try:
        where = Path(os.readlink(FD_PATHS / str(fd)))
    except OSError:  # no /proc: the path must still name the file that was opened
        now = os.stat(real, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
            raise FileChanged("it changed after it was checked") from None
        return
    if not where.is_relative_to(root):
        raise FileChanged("a symbolic link took it out of bounds after it was checked")


# config.json's bounds, checked before it is parsed: ours are ~5 KiB and 5 levels deep.
MAX_CONFIG_BYTES: Final = 1 << 20
MAX_CONFIG_DEPTH: Final = 32
# Longest file name a manifest may give (a file system's NAME_MAX).
MAX_NAME_BYTES: Final = 255
# A string (its closing quote optional, so a match never backtracks: linear in the
# text, where a required one made an unterminated `"\"\"...` quadratic) or a bracket.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]')


class ManifestError(ValueError):
    """A model directory whose ``config.json`` or files do not keep the contract."""


class Cancelled(ManifestError):
    """A read given up on the way (the server is shutting down)."""


def sha256_file(path: Path, cancelled: Callable[[], bool] | None = None) -> str:
    with path.open("rb") as f:
        return sha256_stream(f, path.name, cancelled)


def sha256_stream(f: IO[bytes], name: str, cancelled: Callable[[], bool] | None = None) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        if cancelled is not None and cancelled():
            raise Cancelled(f"{name}: hashing given up")
        digest.update(chunk)
    return digest.hexdigest()


def check_file_name(name: object, what: str) -> str:
    """``name`` is a plain file name as the exporter writes them (``model.onnx``): no
    directory part, not absolute, not hidden, not ``..``; else ManifestError."""
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or any(c in name for c in "/\\\0")
        or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
    ):
        shown = repr(name) if len(repr(name)) <= 64 else repr(name)[:60] + "...'"
        raise ManifestError(
            f"{what} must be a plain file name (no directory part, not hidden, at most "
            f"{MAX_NAME_BYTES} bytes), got {shown}"
        )
    return name


def resolve_file(model_dir: Path, name: str, within: Path | None = None) -> Path:
    """The real path of ``model_dir / name``, refused if it is not a plain name or if,
    symbolic links followed, it leaves ``within`` (default: ``model_dir`` itself).
    The error names the file only, never where a link points."""
    check_file_name(name, name)
    real = (model_dir / name).resolve()
    if not real.is_relative_to(_root(model_dir, within)):
        where = "model directory" if within is None else "model repository"
        raise ManifestError(f"{name} resolves outside the {where} (a symbolic link?)")
    return real


def _root(model_dir: Path, within: Path | None) -> Path:
    return (model_dir if within is None else within).resolve()


def open_model_file(model_dir: Path, name: str, within: Path | None = None) -> IO[bytes]:
    """``model_dir / name`` opened for reading: its path checked by ``resolve_file``,
    then what was opened checked to be that file (``model_files.open_checked``: a
    symbolic link swapped in after the check is refused, never followed). The one way
    a model directory's files are read here. ManifestError if refused; OSError as
    opening raises it."""
    real = resolve_file(model_dir, name, within)
    try:
        return open_checked(real, _root(model_dir, within))
    except FileChanged as exc:
        raise ManifestError(f"{name} is refused: {exc.args[0]}") from None


def json_depth(data: bytes, limit: int = MAX_CONFIG_DEPTH) -> int:
    """How deeply arrays and objects nest in a JSON text, found without parsing it (in
    time linear in its length); the scan stops once past ``limit``."""
    depth = deepest = 0
    for token in _TOKEN.finditer(data):
        first = data[token.start()]
        if first == ord('"'):
            continue
        depth += 1 if first in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest
