"""``--checkpoint ORG/NAME[@REV]``: a model brought by its Hub id, read from a Hugging
Face cache populated here in huggingface_hub's own layout (tests/support/hub_cache.py)
with ``HF_HUB_OFFLINE=1``: nothing reaches the Hub. The export runs as a user runs it
(``python -m model_export`` in a subprocess, the environment deciding the cache), the
server answers as transformers does, and the manifest records the commit the revision
resolved to and the SHA-256 of every file read.

A gated repository cannot be made offline: hub.py maps huggingface_hub's
GatedRepoError to its one line, untested here.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from model_export import graph_io
from model_export.hf_import import minilm_l6_dir
from model_export.hub import resolve_checkpoint
from model_export.model_files import sha256_file
from tests.conftest import running_server
from tests.pretrained.reference import SENTENCE_ATOL, SENTENCES, Reference
from tests.support.hub_cache import add_commit, offline_env

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TINY = "org/tiny-bert"
# The files of MiniLM's folder the export reads (not its README.md, data_config.json...).
MINILM_READ = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
}


def commit_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()  # 40 hex, as a git commit


def _tiny_bert(directory: Path, *, safetensors: bool, pickled: bool) -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_attention_heads=2,
        num_hidden_layers=1,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    model = BertModel(config)
    model.config.save_pretrained(directory)
    if safetensors:
        model.save_pretrained(directory)
    if pickled:
        torch.save(model.state_dict(), directory / "pytorch_model.bin")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache: MiniLM at main; a tiny BERT with both weight files at main and with
    pickled weights only at tag v1.0; one without weights."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    add_commit(cache, MINILM, commit_of("minilm"), minilm_l6_dir())
    both, pickled, none = root / "both", root / "pickled", root / "none"
    for folder in (both, pickled, none):
        folder.mkdir()
    _tiny_bert(both, safetensors=True, pickled=True)
    _tiny_bert(pickled, safetensors=False, pickled=True)
    _tiny_bert(none, safetensors=False, pickled=False)
    add_commit(cache, TINY, commit_of("both"), both)
    add_commit(cache, TINY, commit_of("pickled"), pickled, refs=["v1.0"])
    add_commit(cache, "org/no-weights", commit_of("none"), none)
    return cache


def export(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "model_export", *args],
        env=offline_env(cache),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def hub_repository(hub: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("hub-models")
    done = export(
        hub, "--checkpoint", MINILM, "--out", str(repo / "minilm"),
        "--exporter", "torchscript", "--no-compact-attention",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return repo


def test_an_export_by_hub_id_serves_the_model(hub_repository: Path, reference: Reference) -> None:
    with running_server(hub_repository) as url:
        r = httpx.post(
            f"{url}/v1/embeddings", json={"model": "minilm", "input": SENTENCES}, timeout=60
        )
    assert r.status_code == 200, r.text
    served = np.array([item["embedding"] for item in r.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(served, reference.sentence, atol=SENTENCE_ATOL, rtol=0)


def test_the_manifest_records_the_commit_and_each_file_read(hub_repository: Path) -> None:
    raw = json.loads((hub_repository / "minilm" / graph_io.CONFIG_FILE).read_text())
    source = minilm_l6_dir()
    assert raw["checkpoint"] == {
        "hub": MINILM,
        "revision": None,
        "commit": commit_of("minilm"),
        "files": {name: sha256_file(source / name) for name in sorted(MINILM_READ)},
    }
    assert sorted(raw["checkpoint"]["files"]) == list(raw["checkpoint"]["files"])


def _resolve(cache: Path, spec: str) -> dict[str, object]:
    code = (
        "import json, sys; from model_export.hub import resolve_checkpoint; "
        "print(json.dumps(resolve_checkpoint(sys.argv[1]).provenance()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, spec],
        env=offline_env(cache),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    provenance: dict[str, object] = json.loads(done.stdout)
    return provenance


@pytest.mark.parametrize(
    ("spec", "commit", "weights"),
    [
        (TINY, "both", "model.safetensors"),  # both files cached: safetensors only is read
        (f"{TINY}@main", "both", "model.safetensors"),
        (f"{TINY}@v1.0", "pickled", "pytorch_model.bin"),  # a tag: refs/v1.0
        (f"{TINY}@{commit_of('pickled')}", "pickled", "pytorch_model.bin"),  # a commit
    ],
)
def test_a_revision_resolves_by_ref_or_commit(
    hub: Path, spec: str, commit: str, weights: str
) -> None:
    provenance = _resolve(hub, spec)
    assert provenance["commit"] == commit_of(commit)
    assert provenance["revision"] == (spec.split("@")[1] if "@" in spec else None)
    assert set(provenance["files"]) == {"config.json", weights}  # type: ignore[arg-type]


# spec -> what its one line says
FAILURES = {
    "nobody/nothing": "nobody/nothing is neither a directory nor in the Hugging Face cache",
    f"{TINY}@v9": "HF_HUB_OFFLINE is set",
    "org/no-weights": "has neither model.safetensors nor pytorch_model.bin: no weights",
    "./no/such/dir": "checkpoint directory ./no/such/dir not found",
    # a revision is a name in the cache's refs/, never a path out of it
    f"{TINY}@../../../etc": "'../../../etc' is not a revision (a branch, tag or commit)",
}


def test_failures_are_one_line_each(hub: Path, tmp_path: Path) -> None:
    runs = {
        spec: subprocess.Popen(
            [sys.executable, "-m", "model_export", "--checkpoint", spec, "--out", str(tmp_path)],
            env=offline_env(hub),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec in FAILURES
    }
    for spec, proc in runs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (spec, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (spec, err)
        assert lines[0].startswith("attnserve-export: error: "), lines
        assert FAILURES[spec] in lines[0], lines


def test_a_directory_records_the_hashes_of_the_files_read() -> None:
    source = minilm_l6_dir()
    resolved = resolve_checkpoint(source)
    assert resolved.provenance() == {
        "directory": str(source),
        "files": {name: sha256_file(source / name) for name in sorted(MINILM_READ)},
    }
