"""all-MiniLM-L6-v2 in int8: on real sentences it still agrees with fp32."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import onnx
import pytest

from model_export.int8_recipe import DYNAMIC, SMOOTH_BLOCKWISE
from model_export.manifest import Manifest
from model_export.quantize import (
    SENTENCES,
    feed_forward_outputs,
    quantize_model_dir,
)
from model_export.quantize_sentences import sentences
from tests.conftest import running_server
from tests.support.embeddings import sentence_embeddings

HELD_OUT_COSINE = 0.99  # the int8 target: least agreeing held-out sentence


@pytest.mark.slow
def test_minilm_int8_recipe_serves_held_out_sentences_within_its_cosine(
    minilm_repository: Path, tmp_path: Path
) -> None:
    """The default recipe (smooth-blockwise), stated in the manifest, served beside fp32:
    every held-out sentence (a seed its calibration never saw) at cosine >= 0.99 with
    the fp32 answer. Measured here (bench.int8, 128 held-out sentences): min 0.9977,
    mean 0.9987; plain dynamic int8 gives min 0.9876."""
    repo = tmp_path / "models"
    shutil.copytree(minilm_repository / "minilm-l6", repo / "minilm-l6")
    agreement = quantize_model_dir(repo / "minilm-l6", repo / "minilm-l6-int8")
    text = agreement["text"]
    assert text["sequences"] == len(SENTENCES)
    assert text["cosine_min"] >= HELD_OUT_COSINE, agreement
    manifest = Manifest.read(repo / "minilm-l6-int8")
    assert manifest.name == "minilm-l6-int8" and manifest.text is not None
    manifest.verify(repo / "minilm-l6-int8")  # tokenizer and token embeddings copied
    quantization = manifest.record["quantization"]
    assert quantization["recipe"]["name"] == SMOOTH_BLOCKWISE
    assert quantization["calibrated_on"].endswith("(quantize_sentences seed 1)")
    ops = Counter(
        n.op_type for n in onnx.load(str(repo / "minilm-l6-int8" / "model.onnx")).graph.node
    )
    layers = manifest.architecture.n_layers
    assert ops["MatMulNBits"] == layers and ops["QAttention"] == layers  # fused attention
    texts = sentences(64, 2)
    with running_server(repo, default_model="minilm-l6") as url:
        vectors = {m: sentence_embeddings(url, m, texts) for m in ("minilm-l6", "minilm-l6-int8")}
    cosines = (vectors["minilm-l6"] * vectors["minilm-l6-int8"]).sum(axis=1)  # unit vectors
    assert cosines.min() >= HELD_OUT_COSINE, (cosines.min(), cosines.mean())


KEEP_COSINE = 0.99  # what --int8-keep-cosine is asked for, and the served mean's bound
HELD_OUT_MIN = 0.985  # the least agreeing unseen sentence's bound


@pytest.mark.slow
def test_minilm_int8_keeping_layers_fp32_serves_within_its_cosine(
    minilm_repository: Path, tmp_path: Path
) -> None:
    """The plain dynamic recipe's copy written with ``keep_cosine`` keeps the chosen
    layers' feed-forward output fp32 in every graph and, served beside fp32, answers
    held-out sentences (a seed the choice never saw) at mean cosine >= 0.99 to the fp32
    answers. Measured here: layer 0 kept (bench.int8: held-out min 0.9915, where plain
    dynamic int8 gives 0.9876)."""
    repo = tmp_path / "models"
    shutil.copytree(minilm_repository / "minilm-l6", repo / "minilm-l6")
    quantize_model_dir(
        repo / "minilm-l6", repo / "minilm-l6-int8", keep_cosine=KEEP_COSINE, recipe=DYNAMIC
    )
    manifest = Manifest.read(repo / "minilm-l6-int8")
    keep = manifest.record["quantization"]["keep"]
    assert keep["target_cosine"] == KEEP_COSINE and keep["cosine_min"] >= KEEP_COSINE
    assert keep["fp32_layers"], keep  # plain dynamic int8 misses 0.99 on these sentences
    for graph in manifest.graphs:
        nodes = onnx.load(str(repo / "minilm-l6-int8" / graph)).graph.node
        fp32 = {n.name for n in nodes if n.op_type == "MatMul"}
        kept = [feed_forward_outputs(repo / "minilm-l6" / graph)[i] for i in keep["fp32_layers"]]
        assert set(kept) <= fp32, graph
    texts = sentences(64, 2)
    with running_server(repo, default_model="minilm-l6") as url:
        vectors = {m: sentence_embeddings(url, m, texts) for m in ("minilm-l6", "minilm-l6-int8")}
    cosines = (vectors["minilm-l6"] * vectors["minilm-l6-int8"]).sum(axis=1)  # unit vectors
    # The target holds on the sentences the choice saw; on unseen ones the least agreeing
    # may fall a little short (measured: min 0.9904-0.9915, mean 0.994), so the held-out
    # bound is the mean, with the minimum held to HELD_OUT_MIN.
    assert cosines.mean() >= KEEP_COSINE, cosines.mean()
    assert cosines.min() >= HELD_OUT_MIN, cosines.min()
