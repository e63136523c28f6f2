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

import os
import stat
from pathlib import Path
from typing import BinaryIO

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
