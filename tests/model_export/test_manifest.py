"""The model directory's contract: config.json written and read back as a typed Manifest."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from model_export import graph_io
from model_export.config import preset
from model_export.manifest import FORMAT_VERSION, Manifest, ManifestError, TextFrontEnd

GRAPHS = {name: "0" * 64 for name in graph_io.GRAPH_OUTPUTS}


def manifest(**changes: Any) -> Manifest:
    base = Manifest(name="m", architecture=preset("tiny"), opset=18, graphs=GRAPHS)
    return dataclasses.replace(base, **changes)


def test_round_trip_keeps_every_field_and_the_record() -> None:
    text = TextFrontEnd("embeddings.onnx", "1" * 64, 100, 2, 128, "tokenizer.json", "2" * 64)
    written = manifest(
        text=text,
        pooling="mean",
        normalize=True,
        matryoshka_dimensions=(32, 16),
        record={"seed": 3, "validation": {"atol": 1e-4}},
    )
    raw = json.loads(json.dumps(written.to_dict()))  # through JSON, as on disk
    read = Manifest.from_dict(raw)
    assert read == written and read.record == written.record
    assert raw["format_version"] == FORMAT_VERSION
    assert read.files() == {**GRAPHS, "embeddings.onnx": "1" * 64, "tokenizer.json": "2" * 64}
    assert read.has_tokenizer


def test_the_first_release_format_is_still_read(tiny_model_dir: Path) -> None:
    """format_version 1 had no pooling section: read with no pooling, no normalisation."""
    raw = json.loads((tiny_model_dir / graph_io.CONFIG_FILE).read_text())
    for key in ("pooling", "normalize", "matryoshka_dimensions"):
        raw.pop(key)
    raw["format_version"] = 1
    read = Manifest.from_dict(raw)
    assert (read.pooling, read.normalize, read.matryoshka_dimensions) == (None, False, ())


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"format_version": 3}, "format_version 3 is not supported"),
        ({"format_version": None}, "format_version None"),
        ({"pooling": "sum"}, "pooling must be one of"),
        ({"matryoshka_dimensions": [33]}, "1..32"),
        ({"matryoshka_dimensions": "32"}, "must be a list"),
        ({"graphs": {}}, "graphs lacks"),
        ({"architecture": {"d_model": 30, "n_heads": 4}}, "divisible"),
        ({"text": {"embeddings_graph": "e.onnx"}}, "text:"),
        ({"opset": "eighteen"}, "eighteen"),
    ],
)
def test_invalid_manifests_are_refused(change: dict[str, Any], says: str) -> None:
    raw = {**manifest().to_dict(), **change}
    with pytest.raises(ManifestError) as caught:
        Manifest.from_dict(raw)
    assert says in str(caught.value)


def test_missing_key_is_named() -> None:
    raw = manifest().to_dict()
    del raw["architecture"]
    with pytest.raises(ManifestError, match="lacks 'architecture'"):
        Manifest.from_dict(raw)


def test_verify_names_a_missing_or_corrupt_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    read = Manifest.read(model)
    read.verify(model)  # the export's own digests match
    with (model / graph_io.GRAPH_ATTENTION).open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ManifestError, match=r"model_attn\.onnx is corrupt"):
        read.verify(model)
    (model / graph_io.GRAPH_ATTENTION).unlink()
    with pytest.raises(ManifestError, match=r"model_attn\.onnx is missing"):
        read.verify(model)


def test_read_refuses_what_is_not_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="is missing"):
        Manifest.read(tmp_path)
    (tmp_path / graph_io.CONFIG_FILE).write_text("[1, 2]")
    with pytest.raises(ManifestError, match="not a JSON object"):
        Manifest.read(tmp_path)
    (tmp_path / graph_io.CONFIG_FILE).write_text("{")
    with pytest.raises(ManifestError, match="not readable JSON"):
        Manifest.read(tmp_path)
