"""The session cache (service/prepacked_cache.py): each pre-packed graph's optimised form
made once into the cache directory and reused by a later start, the graphs' weights in
blobs both entries share, a corrupt blob made again, an unwritable directory falling back
to packing in memory, the disk bound (each blob counted once, a blob removed when no entry
names it), and answers bitwise equal with and without it. Real exports, real onnxruntime,
a real server."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest

from model_export import graph_io
from model_export.manifest import sha256_file
from service.prepacked_blobs import ALIGNMENT, BLOBS
from service.prepacked_cache import (
    DATA_FILE,
    GRAPH_SUFFIX,
    RECORD_SUFFIX,
    STAGING_SECONDS,
    SessionCache,
)
from service.runtime import ModelRuntime, load_repository, pad
from service.settings import Settings
from tests.conftest import server_process
from tests.service.helpers import as_array, b64_array

D_MODEL = 32  # tiny's width
MADE = "session cache: made the optimised tiny/"
REUSED = "session cache: reused the optimised tiny/"
# The graphs that pre-pack by default (ATTNSERVE_PREPACKED_GRAPHS), so are cached.
CACHED = (graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_ATTENTION)


def _answer(url: str) -> list[np.ndarray]:
    """Embeddings and attention of two ragged sequences, as the float32 bytes sent."""
    rng = np.random.default_rng(46)
    seqs = [rng.standard_normal((n, D_MODEL)).astype(np.float32) for n in (7, 3)]
    body: dict[str, Any] = {
        "inputs": [b64_array(s) for s in seqs],
        "return_embeddings": True,
        "return_attention": True,
        "encoding_format": "base64",
    }
    with httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/encode", json=body)
    assert r.status_code == 200, r.text
    return [as_array(item[key]) for item in r.json()["data"] for key in ("embeddings", "attention")]


def _settings(repository: Path, cache: str, **more: Any) -> Settings:
    return Settings(
        model_repository=repository, session_cache_dir=cache, intra_op_threads=1, **more
    )


def _run(runtime: ModelRuntime) -> np.ndarray:
    graph = graph_io.GRAPH_EMBEDDINGS
    batch, mask = pad([runtime.sample_sequence(graph, n) for n in (6, 2)])
    return runtime.run(batch, mask, graph)[graph_io.OUTPUT_HIDDEN]


def _entries(cache: Path) -> list[Path]:
    """Each entry's record."""
    return sorted(cache.glob(f"*{RECORD_SUFFIX}"))


def _blobs(record: Path) -> list[str]:
    return list(json.loads(record.read_text())["blobs"])


def _locations(record: Path) -> list[dict[str, str]]:
    """The external data entries of each initializer of the record's graph."""
    graph = onnx.load(str(record.with_suffix(GRAPH_SUFFIX)), load_external_data=False)
    return [{e.key: e.value for e in t.external_data} for t in graph.graph.initializer]


def test_made_once_reused_by_the_next_start_and_answers_bitwise_equal(
    model_repository: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "sessions"
    with server_process(model_repository, session_cache_dir="") as plain:
        want = _answer(plain.url)
        assert "session cache" not in plain.log()
    logs = []
    for _ in range(2):
        with server_process(
            model_repository, session_cache_dir=str(cache), log_level="info"
        ) as server:
            got = _answer(server.url)
            logs.append(server.log())
        for expected, answer in zip(want, got, strict=True):
            # Exact: the same float32 bytes as a server packing in memory.
            np.testing.assert_array_equal(answer.view("<u4"), expected.view("<u4"))
    first, second = logs
    for graph in CACHED:
        assert first.count(MADE + graph) == 1 and REUSED + graph not in first
        assert second.count(REUSED + graph) == 1 and MADE + graph not in second
    entries = _entries(cache)
    assert len(entries) == len(CACHED)
    # The two graphs' weights are the same bytes: one blob each, both entries naming it.
    named = [set(_blobs(record)) for record in entries]
    stored = {p.name for p in (cache / BLOBS).iterdir()}
    assert set.union(*named) == stored
    assert len(stored) < sum(len(n) for n in named) and set.intersection(*named)
    for name in stored:
        assert sha256_file(cache / BLOBS / name) == name
    for record in entries:
        external = [e for e in _locations(record) if e]
        assert external and all(e["location"].startswith(f"{BLOBS}/") for e in external)
        packed = [v for e in external for k, v in e.items() if k.startswith("prepacked")]
        assert packed  # pre-packed forms, each at an offset the runtime can map
        for value in packed:
            for buffer in value.split("|")[1:]:
                assert int(buffer.split(";")[0]) % ALIGNMENT == 0


def test_a_corrupt_blob_is_made_again(
    model_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "sessions"
    want = _run(load_repository(_settings(model_repository, ""))["tiny"])
    load_repository(_settings(model_repository, str(cache)))
    entries = _entries(cache)
    shared = set.intersection(*(set(_blobs(record)) for record in entries))
    blobs = sorted((cache / BLOBS).iterdir())
    for blob in blobs:  # cut each blob short: a disk filled mid-write, say
        blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    with caplog.at_level(logging.INFO, logger="service.prepacked_cache"):
        runtime = load_repository(_settings(model_repository, str(cache)))["tiny"]
    said = caplog.text
    assert said.count("is stale or corrupt; making it again") == len(CACHED)
    assert said.count("session cache: made the optimised") == len(CACHED)
    # Each corrupt blob is said once: the second entry finds the first's blobs made again.
    assert said.count("is corrupt; removed") == len(blobs)
    assert _entries(cache) == entries  # the same keys, whole again
    assert sorted((cache / BLOBS).iterdir()) == blobs and shared
    for blob in blobs:
        assert sha256_file(blob) == blob.name
    np.testing.assert_array_equal(_run(runtime).view("<u4"), want.view("<u4"))


def test_an_unwritable_directory_falls_back_with_one_line(
    model_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # mkdir under it fails, even for root
    want = _run(load_repository(_settings(model_repository, ""))["tiny"])
    with caplog.at_level(logging.INFO, logger="service.prepacked_cache"):
        runtime = load_repository(_settings(model_repository, str(blocker / "sessions")))["tiny"]
    lines = [r for r in caplog.records if r.name == "service.prepacked_cache"]
    assert len(lines) == 1, caplog.text
    assert lines[0].levelno == logging.WARNING
    assert "each session packs its own weights" in lines[0].getMessage()
    np.testing.assert_array_equal(_run(runtime).view("<u4"), want.view("<u4"))


def _writer(*contents: bytes | int) -> Any:
    """Writes a graph whose initializers hold ``contents`` (n: n zero bytes) in its data
    file, as onnxruntime writes an optimised graph."""

    def write(target: Path) -> None:
        data, tensors = bytearray(), []
        for i, content in enumerate(contents):
            raw = bytes(content) if isinstance(content, int) else content
            tensor = onnx.TensorProto(name=f"w{i}", data_type=onnx.TensorProto.UINT8)
            tensor.dims.append(len(raw))
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (
                ("location", DATA_FILE),
                ("offset", len(data)),
                ("length", len(raw)),
            ):
                tensor.external_data.add(key=key, value=str(value))
            data += raw
            tensors.append(tensor)
        graph = onnx.helper.make_graph([], "g", [], [], initializer=tensors)
        target.write_bytes(onnx.helper.make_model(graph).SerializeToString())
        (target.parent / DATA_FILE).write_bytes(data)

    return write


def test_disk_use_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    cache = SessionCache(tmp_path / "sessions", max_bytes=3000)
    first = cache.graph("a" * 64, "first", _writer(b"a" * 1000))
    # What a writer killed mid-write leaves: removed once older than any write takes.
    left = cache.root / ".aaaaaaaaaaaa-1-deadbeef.tmp"
    (left / "sub").mkdir(parents=True)
    (left / DATA_FILE).write_bytes(bytes(5000))
    os.utime(left, (time.time() - STAGING_SECONDS - 1,) * 2)
    # An entry of the old layout (a folder of its own): never used again, so removed.
    (cache.root / ("f" * 64)).mkdir()
    (cache.root / ("f" * 64) / DATA_FILE).write_bytes(bytes(10))
    second = cache.graph("b" * 64, "second", _writer(b"b" * 1000))
    assert first is not None and second is not None
    assert cache.graph("a" * 64, "first", _writer(b"a" * 1000)) == first  # reused: the newest
    third = cache.graph("c" * 64, "third", _writer(b"c" * 1000))
    assert third is not None
    assert [p.name[0] for p in _entries(cache.root)] == ["a", "c"]  # b was least recent
    assert len(list((cache.root / BLOBS).iterdir())) == 2  # b's blob went with it
    assert (cache.made, cache.reused) == (3, 1)
    # An entry larger than the bound alone is not kept: its graph packs in memory.
    assert cache.graph("d" * 64, "huge", _writer(4000)) is None
    assert [p.name[0] for p in _entries(cache.root)] == ["a", "c"]
    assert {p.name for p in cache.root.iterdir() if not p.name.endswith(RECORD_SUFFIX)} == {
        "a" * 64 + GRAPH_SUFFIX,
        "c" * 64 + GRAPH_SUFFIX,
        BLOBS,
    }  # no staging, no old folder left
    assert not [p for p in (cache.root / BLOBS).iterdir() if p.name.startswith(".")]


def test_a_blob_two_entries_share_is_counted_once_and_outlives_one(tmp_path: Path) -> None:
    shared, own = b"s" * 1000, [b"x" * 300, b"y" * 300, b"z" * 300]
    # a + b: 1000 shared + 2 x 300 own + 2 graphs of about 300 fit 2400 only if the shared
    # blob counts once; a + b + c do not.
    cache = SessionCache(tmp_path / "sessions", max_bytes=2400)
    for key, mine in zip("ab", own, strict=False):
        assert cache.graph(key * 64, key, _writer(shared, mine)) is not None
    records = _entries(cache.root)
    assert len(records) == 2 and len(list((cache.root / BLOBS).iterdir())) == 3
    (first_shared,) = set(_blobs(records[0])) & set(_blobs(records[1]))
    # c needs room: a (least recent) goes, with its own blob only; the shared one stays.
    assert cache.graph("c" * 64, "c", _writer(shared, own[2])) is not None
    records = _entries(cache.root)
    assert [p.name[0] for p in records] == ["b", "c"]
    left = {p.name for p in (cache.root / BLOBS).iterdir()}
    assert left == set(_blobs(records[0])) | set(_blobs(records[1]))
    assert first_shared in left and len(left) == 3


def test_the_directory_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Settings(session_cache_dir="auto").session_cache_path == (
        tmp_path / "attnserve" / "sessions"
    )
    assert Settings(session_cache_dir=" ").session_cache_path is None  # off
    assert Settings(session_cache_dir=str(tmp_path / "c")).session_cache_path == tmp_path / "c"


def test_a_directory_others_can_write_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # /tmp-like: another user could plant a graph with its entry.json
    cache = SessionCache(shared, max_bytes=10_000)
    with caplog.at_level(logging.INFO, logger="service.prepacked_cache"):
        assert cache.graph("a" * 64, "first", _writer(10)) is None
        assert cache.graph("b" * 64, "second", _writer(10)) is None
    (line,) = [r.getMessage() for r in caplog.records if r.name == "service.prepacked_cache"]
    assert "writable by no one else" in line and "packs its own weights" in line
    assert list(shared.iterdir()) == []
    fresh = SessionCache(tmp_path / "made" / "sessions", max_bytes=10_000)
    assert fresh.graph("a" * 64, "first", _writer(10)) is not None
    assert fresh.root.stat().st_mode & 0o777 == 0o700  # made ours alone


def test_an_entry_another_server_made_meanwhile_is_used(tmp_path: Path) -> None:
    theirs = SessionCache(tmp_path / "sessions", max_bytes=10_000)
    ours = SessionCache(tmp_path / "sessions", max_bytes=10_000)
    key = "a" * 64

    def write_while_they_finish(target: Path) -> None:
        assert theirs.graph(key, "theirs", _writer(100)) is not None  # renamed in first
        _writer(100)(target)

    made = ours.graph(key, "ours", write_while_they_finish)
    assert made == tmp_path / "sessions" / f"{key}{GRAPH_SUFFIX}"
    assert (theirs.made, ours.made) == (1, 1)
    assert {p.name for p in (tmp_path / "sessions").iterdir()} == {
        BLOBS,
        f"{key}{RECORD_SUFFIX}",
        f"{key}{GRAPH_SUFFIX}",
    }  # no staging left
    assert len(list((tmp_path / "sessions" / BLOBS).iterdir())) == 1


def test_a_record_naming_no_blob_is_made_again_and_removes_nothing(tmp_path: Path) -> None:
    cache = SessionCache(tmp_path / "sessions", max_bytes=10_000)
    key = "a" * 64
    assert cache.graph(key, "first", _writer(b"w" * 100)) is not None
    outside = tmp_path / "outside"
    outside.write_text("not the cache's")
    (record,) = _entries(cache.root)
    saved = json.loads(record.read_text())
    record.write_text(json.dumps(saved | {"blobs": [*saved["blobs"], "../../outside"]}))
    assert cache.graph(key, "first", _writer(b"w" * 100)) is not None  # made again
    assert outside.read_text() == "not the cache's"
    assert (cache.made, cache.reused) == (2, 0)
    assert json.loads(record.read_text()) == saved
