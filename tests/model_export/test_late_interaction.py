"""Late-interaction checkpoints exported: the multi-vector graph equals the reference.

Four random tiny checkpoints, one per layout model_export.late_interaction reads: a
sentence-transformers MultiVectorEncoder built and saved by sentence-transformers
([Q]/[D] prompts, [MASK] expansion to 32 not attended, a 128-d Dense, a punctuation
skiplist, Normalize), a PyLate v3 folder and a Stanford HF_ColBERT folder written by
hand (sentence-transformers loads both, registering their markers), and a bge-m3
layout (XLM-RoBERTa + colbert_linear.pt + sparse_linear.pt). Each is exported, and
multi_vector_model.onnx is run by onnxruntime on the reference's own token ids (its
expansion positions, where not attended, typed TYPE_SCORED_ONLY); the rows the
reference keeps (MultiVectorEncoder.encode_query / encode_document, for bge-m3
FlagEmbedding's BGEM3FlagModel math written out here) are compared at ATOL.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from sentence_transformers import MultiVectorEncoder
from tokenizers import Tokenizer
from transformers import BertTokenizerFast

from model_export import graph_io
from model_export.manifest import Manifest
from tests.support.heads import SIZES, _bert_tokenizer, _randomised
from tests.support.late_interaction import (
    DOCUMENTS,
    HIDDEN,
    LAYOUTS,
    QUERIES,
)

ATOL = 1e-5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("late-interaction")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        return {name: build(root / name) for name, build in LAYOUTS.items()}


@pytest.fixture(scope="module")
def exported(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from model_export.cli import main

    out = tmp_path_factory.mktemp("late-interaction-models")
    for name, folder in checkpoints.items():
        command = ["--checkpoint", str(folder), "--out", str(out / name)]
        assert main([*command, "--no-compact-attention"]) == 0
    return {name: out / name for name in checkpoints}


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, Path]) -> dict[str, MultiVectorEncoder]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        return {
            name: MultiVectorEncoder(str(checkpoints[name]), device="cpu")
            for name in ("multi_vector_encoder", "pylate", "stanford")
        }


def run_graph(model_dir: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(
        str(model_dir / graph_io.GRAPH_MULTI_VECTOR), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def reference_feeds(
    model: MultiVectorEncoder, texts: list[str], task: str, *, scored_only: bool = True
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The reference's own token ids for ``texts`` on side ``task``, as graph feeds (its
    unattended expansion positions typed TYPE_SCORED_ONLY, unless not ``scored_only``),
    and the rows it scores before its skiplist (mask or expansion)."""
    features = model.preprocess(texts, prompt=model.prompts[task], task=task)
    ids = features["input_ids"].numpy()
    mask = features["attention_mask"].numpy()
    types = features.get("token_type_ids", torch.zeros_like(features["input_ids"])).numpy()
    expansion = features.get("query_expansion_positions")
    expanded = np.zeros_like(mask, dtype=bool) if expansion is None else expansion.numpy()
    types = types.copy()
    if scored_only:
        types[expanded & (mask == 0)] = graph_io.TYPE_SCORED_ONLY
    feeds = {
        graph_io.INPUT_IDS: ids,
        graph_io.INPUT_TOKEN_TYPES: types,
        graph_io.INPUT_MASK: (mask.astype(bool) | expanded).astype(np.int64),
    }
    return feeds, mask.astype(bool) | expanded


def kept_rows(
    manifest: Manifest, feeds: dict[str, np.ndarray], scored: np.ndarray, task: str
) -> np.ndarray:
    """The rows a side keeps: scored, less the manifest's skiplist on its sides."""
    late = manifest.late_interaction
    assert late is not None
    if task in late.skiplist_sides:
        scored = scored & ~np.isin(feeds[graph_io.INPUT_IDS], list(late.skiplist_ids))
    return scored


@pytest.mark.parametrize("name", ["multi_vector_encoder", "pylate", "stanford"])
@pytest.mark.parametrize("task", ["query", "document"])
def test_multi_vectors_equal_sentence_transformers(
    name: str,
    task: str,
    exported: dict[str, Path],
    references: dict[str, MultiVectorEncoder],
) -> None:
    model, manifest = references[name], Manifest.read(exported[name])
    texts = QUERIES if task == "query" else DOCUMENTS
    encode = model.encode_query if task == "query" else model.encode_document
    want = [np.asarray(v) for v in encode(texts, convert_to_numpy=True)]
    feeds, scored = reference_feeds(model, texts, task)
    got = run_graph(exported[name], feeds)[graph_io.OUTPUT_MULTI_VECTORS]
    rows = kept_rows(manifest, feeds, scored, task)
    worst = 0.0
    for i, expected in enumerate(want):
        mine = got[i][rows[i]]
        assert mine.shape == expected.shape
        worst = max(worst, float(np.abs(mine - expected).max()))
    assert worst <= ATOL, worst


def test_scored_only_masking_matters(
    exported: dict[str, Path], references: dict[str, MultiVectorEncoder]
) -> None:
    """Positive control: the expansion tokens attended (type 0) give other vectors."""
    model = references["multi_vector_encoder"]
    want = [np.asarray(v) for v in model.encode_query(QUERIES, convert_to_numpy=True)]
    feeds, scored = reference_feeds(model, QUERIES, "query", scored_only=False)
    got = run_graph(exported["multi_vector_encoder"], feeds)[graph_io.OUTPUT_MULTI_VECTORS]
    worst = max(float(np.abs(got[i][scored[i]] - w).max()) for i, w in enumerate(want))
    assert worst > 100 * ATOL, worst  # observed 1.7e-3


def _section(model_dir: Path) -> Any:
    late = Manifest.read(model_dir).late_interaction
    assert late is not None
    return late


@pytest.mark.parametrize("name", ["multi_vector_encoder", "pylate", "stanford"])
def test_manifest_is_the_references_settings(
    name: str, exported: dict[str, Path], references: dict[str, MultiVectorEncoder]
) -> None:
    model, manifest = references[name], Manifest.read(exported[name])
    late = _section(exported[name])
    transformer, mask = model[0], model[-2]
    assert late.graph == graph_io.GRAPH_MULTI_VECTOR and late.normalize
    io = graph_io
    assert late.outputs == (*io.MULTI_VECTOR_OUTPUTS[:2], io.OUTPUT_ATTENTION_RECEIVED)
    assert late.dim == model.get_embedding_dimension()
    assert late.similarity == model.similarity_fn_name
    assert set(late.skiplist_ids) == set(mask._skiplist_ids.tolist())
    assert late.skiplist_sides == tuple(mask.skiplist_tasks)
    assert late.document_length == transformer.document_length
    assert late.query_length == transformer.query_length
    expansion = transformer.query_expansion
    assert late.expansion is not None and expansion is not None
    token = model.tokenizer.mask_token_id
    got = (late.expansion.strategy, late.expansion.length, late.expansion.token_id)
    assert got == (expansion["strategy"], expansion["length"], token)
    assert late.expansion.attend == expansion["attend"]
    assert {k: manifest.prompts[k] for k in ("query", "document")} == {
        k: model.prompts[k] for k in ("query", "document")
    }


@pytest.mark.parametrize("name", ["multi_vector_encoder", "pylate", "stanford"])
def test_exported_tokenizer_keeps_each_marker_one_token(
    name: str, exported: dict[str, Path], references: dict[str, MultiVectorEncoder]
) -> None:
    model, manifest = references[name], Manifest.read(exported[name])
    tokenizer = Tokenizer.from_file(str(exported[name] / graph_io.TOKENIZER_FILE))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    for side in ("query", "document"):
        text = manifest.prompts[side] + "hello"
        ids = tokenizer.encode(text).ids
        assert ids == model.tokenizer(text)["input_ids"]
        marker = manifest.prompts[side].split()[0]
        assert ids[1] in {tokenizer.token_to_id(marker), tokenizer.token_to_id(marker + " ")}
        assert len(ids) == 4  # [CLS] marker hello [SEP]


def test_bge_m3_equals_flagembeddings_math(
    checkpoints: dict[str, Path], exported: dict[str, Path]
) -> None:
    """dense = normalize(h[:, 0]); colbert = normalize(colbert_linear(h[:, 1:])) at real
    tokens; sparse = relu(sparse_linear(h)), per token id its largest weight, the special
    tokens left out (BGEM3FlagModel)."""
    from transformers import XLMRobertaModel

    folder, model_dir = checkpoints["bge_m3"], exported["bge_m3"]
    manifest = Manifest.read(model_dir)
    late = _section(model_dir)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    unused = {tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>", "<unk>")}
    assert (manifest.pooling, manifest.normalize) == ("cls", True)
    assert late.outputs == graph_io.MULTI_VECTOR_OUTPUTS and late.sparse
    assert late.attention_received
    assert (late.skip_first, late.similarity, late.dim) == (True, "meanmaxsim", HIDDEN)
    assert set(late.unused_ids) == unused and late.expansion is None
    encodings = tokenizer.encode_batch(DOCUMENTS)
    width = max(len(e.ids) for e in encodings)
    ids = np.ones((len(DOCUMENTS), width), dtype=np.int64)  # <pad>
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
    feeds = {
        graph_io.INPUT_IDS: ids,
        graph_io.INPUT_TOKEN_TYPES: np.zeros_like(ids),
        graph_io.INPUT_MASK: mask,
    }
    got = run_graph(model_dir, feeds)
    model = XLMRobertaModel.from_pretrained(folder, attn_implementation="eager").eval()
    colbert_linear, sparse_linear = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, 1)
    colbert_linear.load_state_dict(torch.load(folder / "colbert_linear.pt"))
    sparse_linear.load_state_dict(torch.load(folder / "sparse_linear.pt"))
    with torch.no_grad():
        m = torch.from_numpy(mask)
        h = model(input_ids=torch.from_numpy(ids), attention_mask=m).last_hidden_state
        dense = torch.nn.functional.normalize(h[:, 0], dim=-1)
        colbert = colbert_linear(h[:, 1:]) * m[:, 1:, None]
        colbert = torch.nn.functional.normalize(colbert, dim=-1)
        weights = torch.relu(sparse_linear(h)).squeeze(-1)
    hidden = got[graph_io.OUTPUT_HIDDEN]
    pooled = hidden[:, 0] / np.linalg.norm(hidden[:, 0], axis=-1, keepdims=True)
    diffs = [float(np.abs(pooled - dense.numpy()).max())]
    vectors, token_weights = got[graph_io.OUTPUT_MULTI_VECTORS], got[graph_io.OUTPUT_TOKEN_WEIGHTS]
    for i in range(len(DOCUMENTS)):
        real = mask[i].astype(bool)
        diffs.append(float(np.abs(vectors[i, 1:][real[1:]] - colbert[i][real[1:]].numpy()).max()))
        want: dict[int, float] = {}
        mine: dict[int, float] = {}
        for t in range(int(real.sum())):
            token = int(ids[i, t])
            if token in unused:
                continue
            want[token] = max(want.get(token, 0.0), float(weights[i, t]))
            mine[token] = max(mine.get(token, 0.0), float(token_weights[i, t]))
        assert want.keys() == mine.keys()
        diffs += [abs(want[k] - mine[k]) for k in want]
    assert max(diffs) <= ATOL, max(diffs)


def test_what_cannot_be_expressed_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    from model_export.hf_import import CheckpointError, load_checkpoint

    folder = tmp_path / "stanford-l2"
    shutil.copytree(checkpoints["stanford"], folder)
    metadata = json.loads((folder / "artifact.metadata").read_text())
    (folder / "artifact.metadata").write_text(json.dumps({**metadata, "similarity": "l2"}))
    with pytest.raises(CheckpointError, match="similarity 'l2'"):
        load_checkpoint(folder)
    folder = tmp_path / "pooled"
    shutil.copytree(checkpoints["multi_vector_encoder"], folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(
        1, {"idx": 9, "name": "9", "path": "9_Pool", "type": "sentence_transformers.models.Pooling"}
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="MultiVectorEncoder model is applied as"):
        load_checkpoint(folder)
    folder = tmp_path / "long-skiplist"
    shutil.copytree(checkpoints["pylate"], folder)
    top = json.loads((folder / "config_sentence_transformers.json").read_text())
    top["skiplist_words"] = [f"w{i}" for i in range(5000)]
    (folder / "config_sentence_transformers.json").write_text(json.dumps(top))
    with pytest.raises(CheckpointError, match="at most 4096"):
        load_checkpoint(folder)


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A MultiVectorEncoder on ModernBERT (every other layer windowed: a structured
    mask, whose diagonal the encoder keeps for padded rows), and its export."""
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import ModernBertConfig, ModernBertModel

    from model_export.cli import main

    root = tmp_path_factory.mktemp("windowed")
    _bert_tokenizer(root / "hf")
    tokenizer = BertTokenizerFast.from_pretrained(root / "hf")
    specials = {
        f"{name}_token_id": tokenizer.convert_tokens_to_ids(token)
        for name, token in (("pad", "[PAD]"), ("cls", "[CLS]"), ("sep", "[SEP]"))
    }
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=2,
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        global_attn_every_n_layers=2,
        local_attention=16,
        bos_token_id=specials["cls_token_id"],
        eos_token_id=specials["sep_token_id"],
        **specials,
    )
    torch.manual_seed(5)
    _randomised(ModernBertModel(config)).save_pretrained(root / "hf")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        expansion = {"strategy": "fixed", "length": 12, "attend": False}
        eager = {"attn_implementation": "eager"}
        modules = [
            Transformer(str(root / "hf"), query_expansion=expansion, model_kwargs=eager),
            Dense(
                HIDDEN,
                16,
                bias=False,
                activation_function=torch.nn.Identity(),
                module_input_name="token_embeddings",
            ),
            MultiVectorMask(),
        ]
        MultiVectorEncoder(modules=modules, device="cpu").save(str(root / "mve"))
    command = ["--checkpoint", str(root / "mve"), "--out", str(root / "out")]
    assert main([*command, "--no-compact-attention", "--exporter", "torchscript"]) == 0
    return root / "mve", root / "out"


def test_windowed_layers_keep_scored_only_tokens_out(
    windowed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A windowed layer's mask keeps each padded row's diagonal; a scored-only token must
    not attend to itself either (transformers masks its key for every query)."""
    from model_export import late_interaction
    from model_export.hf_import import load_checkpoint

    folder, model_dir = windowed
    with monkeypatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        model = MultiVectorEncoder(
            str(folder), device="cpu", model_kwargs={"attn_implementation": "eager"}
        )
    want = [np.asarray(v) for v in model.encode_query(QUERIES, convert_to_numpy=True)]
    feeds, scored = reference_feeds(model, QUERIES, "query")
    got = run_graph(model_dir, feeds)[graph_io.OUTPUT_MULTI_VECTORS]
    worst = max(float(np.abs(got[i][scored[i]] - w).max()) for i, w in enumerate(want))
    assert worst <= ATOL, worst  # observed 1.2e-7
    # Positive control: the diagonal left to scored-only rows (PyTorch, the same module).
    ckpt = load_checkpoint(folder)
    assert ckpt.late_interaction is not None
    late = ckpt.late_interaction
    monkeypatch.setattr(late_interaction, "_no_self", lambda s, b: torch.zeros_like(b[:, :1]))
    graph = late_interaction.MultiVectorGraph(
        ckpt.embeddings, ckpt.encoder, late.dense, late.normalize, late.sparse
    )
    with torch.no_grad():
        inputs = (torch.from_numpy(feeds[n]) for n in graph_io.TEXT_GRAPH_INPUTS)
        unmasked = graph(*inputs)[1].numpy()
    worst = max(float(np.abs(unmasked[i][scored[i]] - w).max()) for i, w in enumerate(want))
    assert worst > 100 * ATOL, worst


def test_int8_copy_lists_its_multi_vector_graph(exported: dict[str, Path], tmp_path: Path) -> None:
    """--quantize int8 copies the multi-vector graph (fp32) onto the int8 weights file:
    the copy's manifest names the copy's digest (its own would fail verify)."""
    from model_export.quantize import quantize_model_dir

    source = exported["pylate"]
    quantize_model_dir(source, tmp_path / "int8")
    manifest = Manifest.read(tmp_path / "int8")
    manifest.verify(tmp_path / "int8")
    assert manifest.late_interaction is not None
    late = manifest.late_interaction
    assert late == dataclasses.replace(_section(source), sha256=late.sha256)
