"""int8 copies: quantised graphs, recorded agreement, served under their own name."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from model_export import graph_io
from model_export.cli import main
from model_export.int8_recipe import SMOOTH_BLOCKWISE, describe
from model_export.manifest import Manifest
from model_export.quantize import MIN_COSINE, quantize_model_dir
from tests.conftest import running_server
from tests.support.inputs import sequences


@pytest.fixture(scope="module")
def int8_repository(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A repository serving ``tiny`` and its int8 copy ``tiny-int8``."""
    repo = tmp_path_factory.mktemp("int8-models")
    shutil.copytree(tiny_model_dir, repo / "tiny")
    quantize_model_dir(repo / "tiny", repo / "tiny-int8")
    return repo


def test_the_copy_is_int8_and_records_its_agreement(int8_repository: Path) -> None:
    manifest = Manifest.read(int8_repository / "tiny-int8")
    manifest.verify(int8_repository / "tiny-int8")  # its own digests
    assert manifest.name == "tiny-int8"
    quantization = manifest.record["quantization"]
    assert quantization["source"] == "tiny"
    assert quantization["recipe"] == describe(SMOOTH_BLOCKWISE)  # the default
    assert quantization["calibrated_on"].startswith("random embeddings")  # no tokenizer
    random_set = quantization["agreement"]["random"]
    assert random_set["sequences"] > 0 and random_set["cosine_min"] >= MIN_COSINE
    assert 0 <= random_set["attention_max_abs_diff"] < 1
    for graph in graph_io.GRAPH_OUTPUTS:
        nodes = onnx.load(str(int8_repository / "tiny-int8" / graph)).graph.node
        ops, names = Counter(n.op_type for n in nodes), [n.name for n in nodes]
        assert ops["MatMulInteger"] > 0 and ops["DynamicQuantizeLinear"] > 0
        # The feed-forward outputs block-wise, one per layer; the smoothing's Muls.
        assert ops["MatMulNBits"] == manifest.architecture.n_layers, graph
        assert any(n.startswith("smooth_") for n in names), graph


def test_the_server_serves_both_and_they_agree(int8_repository: Path) -> None:
    """Mean-pooled vectors of the same inputs from fp32 and int8 point the same way."""
    inputs = [s.tolist() for s in sequences((5, 12, 3), seed=11)]
    with running_server(int8_repository, default_model="tiny") as url:
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert sorted(m["name"] for m in models) == ["tiny", "tiny-int8"]
        pooled = {}
        for model in ("tiny", "tiny-int8"):
            r = httpx.post(
                f"{url}/v1/encode",
                json={"model": model, "inputs": inputs, "pooling": "mean", "normalize": True},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            pooled[model] = np.array([item["pooled"] for item in r.json()["data"]])
    cosines = (pooled["tiny"] * pooled["tiny-int8"]).sum(axis=1)  # unit vectors
    assert cosines.min() >= MIN_COSINE, cosines


def test_cli_writes_the_int8_copy_beside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    code = main(
        ["--preset", "tiny", "--out", str(out), "--exporter", "torchscript", "--quantize", "int8"]
    )
    assert code == 0
    config = json.loads((tmp_path / "m-int8" / "config.json").read_text())
    assert config["name"] == "m-int8" and config["quantization"]["source"] == "m"
    # Its progress follows the export's: each graph quantised, then the agreement.
    steps = [
        line.split(" (")[0]
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("attnserve-export: m-int8: ")
    ]
    graphs = list(config["graphs"])
    assert steps == [
        *(
            f"attnserve-export: m-int8: quantize {k}/{len(graphs)} {g}"
            for k, g in enumerate(graphs, 1)
        ),
        "attnserve-export: m-int8: check 1/1 agreement with fp32",
    ]


def test_keep_cosine_is_recorded_and_keeps_nothing_already_within(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """tiny's int8 already agrees (cosine ~1.0), so no layer stays fp32; the choice and
    where it was made are recorded beside the agreement."""
    quantize_model_dir(tiny_model_dir, tmp_path / "tiny-int8", keep_cosine=0.99)
    keep = Manifest.read(tmp_path / "tiny-int8").record["quantization"]["keep"]
    assert keep["fp32_layers"] == [] and keep["cosine_min"] >= 0.99
    assert keep["selected_on"].startswith("random embeddings")


def test_keep_cosine_needs_quantize(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--preset", "tiny", "--out", str(tmp_path / "m"), "--int8-keep-cosine", "0.99"])
    assert exc.value.code == 2
