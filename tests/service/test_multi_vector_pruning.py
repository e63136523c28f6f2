"""Pruning a document's multi-vectors by attention received (issue 48, item 6).

A random tiny sentence-transformers MultiVectorEncoder (tests/support/late_interaction.py)
is exported once. Its multi-vector graph's ``attention_received`` equals
``pruning.received_attention(layers="mean")`` of transformers' eager attentions of the
same tokens; served ``/v1/multi-vector`` with ``prune`` answers the unpruned rows at the
positions ``keep_by_attention`` picks from it, [CLS], [SEP] and the [D] marker never;
what cannot be pruned is refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from model_export import graph_io
from model_export.manifest import Manifest
from model_export.model_files import sha256_file
from service.engine import pruning
from tests.conftest import running_server
from tests.support.late_interaction import DOCUMENTS, QUERIES, multi_vector_encoder

ATOL = 1e-5
MODEL, OLD = "mve", "mve-old"
DOCS = [*DOCUMENTS, "a short one."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prune-checkpoint")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        multi_vector_encoder(root)
    return root


@pytest.fixture(scope="module")
def repository(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint exported (``mve``), and a copy as exported before the graph gave
    attention received (``mve-old``: the output cut from its graph and manifest)."""
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("prune-models")
    command = ["--checkpoint", str(checkpoint / "mve"), "--out", str(repo / MODEL)]
    assert main([*command, "--no-compact-attention"]) == 0
    old = repo / OLD
    old.mkdir()
    for file in (repo / MODEL).iterdir():
        (old / file.name).write_bytes(file.read_bytes())
    graph = old / graph_io.GRAPH_MULTI_VECTOR
    proto = onnx.load(str(graph), load_external_data=False)
    kept = [o for o in proto.graph.output if o.name != graph_io.OUTPUT_ATTENTION_RECEIVED]
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
    onnx.save(proto, str(graph))
    manifest = Manifest.read(old)
    late = manifest.late_interaction
    assert late is not None and late.attention_received
    late = dataclasses.replace(late, outputs=late.outputs[:2], sha256=sha256_file(graph))
    dataclasses.replace(manifest, name=OLD, late_interaction=late).write(old)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[str]:
    with running_server(repository) as url:
        yield url


def served_tokens(model_dir: Path, texts: list[str]) -> tuple[list[list[int]], set[int]]:
    """Each document's ids as the service reads it ("[D] " prompted; short enough that
    nothing is cut), and the tokenizer's special ids."""
    tokenizer = Tokenizer.from_file(str(model_dir / graph_io.TOKENIZER_FILE))
    tokenizer.no_padding()
    ids = [e.ids for e in tokenizer.encode_batch(["[D] " + t for t in texts])]
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    return ids, special


def graph_received(model_dir: Path, ids: list[list[int]]) -> list[np.ndarray]:
    """The multi-vector graph's attention_received of the ids, one padded batch."""
    width = max(map(len, ids))
    batch = np.zeros((len(ids), width), dtype=np.int64)
    mask = np.zeros_like(batch)
    for i, row in enumerate(ids):
        batch[i, : len(row)], mask[i, : len(row)] = row, 1
    session = ort.InferenceSession(
        str(model_dir / graph_io.GRAPH_MULTI_VECTOR), providers=["CPUExecutionProvider"]
    )
    feeds = {
        graph_io.INPUT_IDS: batch,
        graph_io.INPUT_TOKEN_TYPES: np.zeros_like(batch),
        graph_io.INPUT_MASK: mask,
    }
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, feeds), strict=True))
    received = got[graph_io.OUTPUT_ATTENTION_RECEIVED]
    assert (received[mask == 0] == 0).all()
    return [received[i, : len(row)] for i, row in enumerate(ids)]


def eager_received(checkpoint: Path, ids: list[list[int]], layers: str = "mean") -> list[Any]:
    """transformers' eager attentions of the same ids, one padded batch, each sequence's
    real rows and keys -> ``pruning.received_attention``."""
    from transformers import BertModel

    model = BertModel.from_pretrained(checkpoint / "hf", attn_implementation="eager").eval()
    width = max(map(len, ids))
    batch = torch.zeros(len(ids), width, dtype=torch.int64)
    mask = torch.zeros_like(batch)
    for i, row in enumerate(ids):
        batch[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        out = model(input_ids=batch, attention_mask=mask, output_attentions=True)
    maps = torch.stack(out.attentions, dim=1).numpy()  # (B, L, H, T, T)
    return [
        pruning.received_attention(maps[i, :, :, : len(r), : len(r)], layers=layers)  # type: ignore[arg-type]
        for i, r in enumerate(ids)
    ]


def test_graph_attention_received_equals_eager_attentions(
    repository: Path, checkpoint: Path
) -> None:
    ids, _ = served_tokens(repository / MODEL, DOCS)
    got = graph_received(repository / MODEL, ids)
    want = eager_received(checkpoint, ids)
    worst = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    assert worst <= ATOL, worst
    # Positive control: the last layer alone (the study's other aggregation) differs.
    last = eager_received(checkpoint, ids, layers="last")
    apart = max(float(np.abs(g - w).max()) for g, w in zip(got, last, strict=True))
    assert apart > 100 * ATOL, apart


def vectors(url: str, texts: list[str], **extra: Any) -> list[np.ndarray]:
    body = {"model": MODEL, "input": texts, "embedding_type": "float", **extra}
    answer = httpx.post(f"{url}/v1/multi-vector", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return [np.array(item["embeddings"], dtype=np.float32) for item in answer.json()["data"]]


@pytest.mark.parametrize("prune", [{"k": 4}, {"fraction": 0.25}, {"k": 100}])
def test_served_prune_keeps_the_rows_receiving_most_attention(
    server: str, repository: Path, checkpoint: Path, prune: dict[str, Any]
) -> None:
    model_dir = repository / MODEL
    late = Manifest.read(model_dir).late_interaction
    assert late is not None
    ids, special = served_tokens(model_dir, DOCS)
    received = graph_received(model_dir, ids)
    eager = eager_received(checkpoint, ids)
    full = vectors(server, DOCS)
    pruned = vectors(server, DOCS, prune=prune)
    for i, row in enumerate(ids):
        kept = ~np.isin(row, late.skiplist_ids)
        allowed = kept & ~np.isin(row, list(special))
        n = int(allowed.sum())
        k = prune.get("k") or int(np.ceil(prune["fraction"] * n))
        positions = pruning.keep_by_attention(received[i], min(k, n), allowed)
        assert (positions == pruning.keep_by_attention(eager[i], min(k, n), allowed)).all()
        assert len(full[i]) == int(kept.sum())
        at = np.cumsum(kept)[positions] - 1  # each position's row in the unpruned answer
        assert pruned[i].shape == (min(k, n), late.dim)
        np.testing.assert_allclose(pruned[i], full[i][at], atol=1e-6)
        assert not np.isin(np.asarray(row)[positions], list(special)).any()


def test_sdk_prunes(server: str) -> None:
    from attnserve_client import Client

    with Client(server) as client:
        result = client.multi_vector(DOCS, model=MODEL, prune={"k": 3})
    assert [None if x.vectors is None else x.vectors.shape for x in result.items] == [(3, 128)] * 3


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"input": QUERIES, "input_type": "query", "prune": {"k": 4}}, 422, "prune"),
        ({"input": DOCS, "prune": {}}, 422, "prune"),
        ({"input": DOCS, "prune": {"k": 4, "fraction": 0.5}}, 422, "prune"),
        ({"input": DOCS, "prune": {"k": 0}}, 422, "prune.k"),
        ({"input": DOCS, "prune": {"k": 1 << 20}}, 422, "prune.k"),
        ({"input": DOCS, "prune": {"fraction": 1.5}}, 422, "prune.fraction"),
        ({"input": DOCS, "prune": {"method": "norm", "k": 4}}, 422, "prune"),
        ({"model": OLD, "input": DOCS, "prune": {"k": 4}}, 422, "prune"),
    ],
)
def test_what_cannot_be_pruned_is_refused(
    server: str, body: dict[str, Any], status: int, field: str
) -> None:
    answer = httpx.post(f"{server}/v1/multi-vector", json={"model": MODEL, **body}, timeout=60)
    assert answer.status_code == status, answer.text
    assert field in answer.text, answer.text
    if body.get("model") == OLD:
        assert OLD in answer.json()["error"]


def test_old_export_still_serves_unpruned(server: str) -> None:
    body = {"model": OLD, "input": DOCS, "embedding_type": "float"}
    answer = httpx.post(f"{server}/v1/multi-vector", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
