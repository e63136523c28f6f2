"""Jina embeddings v3 with its task adapters, served and checked against transformers.

A small random ``JinaEmbeddingsV3Model`` (2 layers, 32 wide, 4 heads) saved by
``save_pretrained``, with one PEFT LoRA folder per task as transformers' Jina v3
checkpoint keeps them (``retrieval_query/adapter_config.json`` +
``adapter_model.safetensors``…), a small Unigram tokenizer and a sentence-transformers
folder (mean pooling, Normalize). The adapters' factors are random and large, their
ranks differ (padded to the largest when stacked), one adapts no embeddings, so each
task moves every output far beyond the tolerance.

The reference is ``JinaEmbeddingsV3Model`` (eager) with the task's LoRA applied as PEFT
applies it (``load_adapter`` + ``set_adapter``): each adapted Linear answers
W x + b + (α/r) B (A x), the word embeddings E[id] + (α/r) A[:, id]ᵀ Bᵀ; written here
from the adapter's own files (no PEFT in the test environment), independently of the
exporter's stacking. Served answers must equal it within 1e-4 (fp32: last hidden state,
every hidden state, every attention map, pooled and normalized vectors).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from tests.conftest import running_server
from tests.pretrained.test_families import _unigram

ATOL = 1e-4
SIZES = {"hidden": 32, "heads": 4, "layers": 2, "ff": 64, "positions": 64}
# transformers' folder names -> the task names requests use (Jina's).
TASKS = {
    "retrieval_query": "retrieval.query",
    "retrieval_passage": "retrieval.passage",
    "separation": "separation",
    "classification": "classification",
    "text_matching": "text-matching",
}
RANKS = {"retrieval_query": 4, "retrieval_passage": 2, "separation": 4, "classification": 3}
ALPHA = 8.0
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
LINEARS += ("mlp.fc1", "mlp.fc2")
WORD = "embeddings.word_embeddings"
TEXTS = [
    "The attention maps of every task are served.",
    "Short one.",
    "Naïve café: rotary positions and 东京 too.",
]
MODEL = "jina"


def _write_adapter(folder: Path, model: torch.nn.Module, rank: int, embeddings: bool) -> None:
    """A PEFT LoRA folder (as ``save_pretrained`` of a PeftModel writes it), random factors."""
    folder.mkdir()
    generator = torch.Generator().manual_seed(len(folder.name) * 7 + rank)
    state: dict[str, torch.Tensor] = {}
    targets = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith(LINEARS):
            a = torch.randn(rank, module.in_features, generator=generator) * 0.3
            b = torch.randn(module.out_features, rank, generator=generator) * 0.3
            state[f"base_model.model.{name}.lora_A.weight"] = a
            state[f"base_model.model.{name}.lora_B.weight"] = b
    targets = [t.split(".")[-1] for t in LINEARS]
    if embeddings:
        vocab, width = model.get_submodule(WORD).weight.shape
        state[f"base_model.model.{WORD}.lora_embedding_A"] = torch.randn(
            rank, vocab, generator=generator
        )
        state[f"base_model.model.{WORD}.lora_embedding_B"] = (
            torch.randn(width, rank, generator=generator) * 0.3
        )
        targets.append("word_embeddings")
    save_file(state, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "task_type": None,
        "inference_mode": True,
        "base_model_name_or_path": None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))


def _checkpoint(directory: Path) -> None:
    """The base model, its five adapters, tokenizer and sentence-transformers folder."""
    from transformers import JinaEmbeddingsV3Config, JinaEmbeddingsV3Model

    tokenizer = _unigram(directory)
    torch.manual_seed(0)
    config = JinaEmbeddingsV3Config(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        type_vocab_size=1,
        pad_token_id=1,
        rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
    )
    model = JinaEmbeddingsV3Model(config)
    with torch.no_grad():  # random norms and sharp attention, as test_families does
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                param.normal_(1.0, 0.1)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(5.0)
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    for folder in TASKS:
        rank = RANKS.get(folder, 4)
        _write_adapter(directory / folder, model, rank, embeddings=folder != "classification")
    (directory / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ]
        )
    )
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": SIZES["hidden"], "pooling_mode_mean_tokens": True})
    )
    (directory / "2_Normalize").mkdir()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the checkpoint, the model repository holding its export)."""
    from model_export.cli import main

    source = tmp_path_factory.mktemp("ckpt-jina")
    _checkpoint(source)
    repo = tmp_path_factory.mktemp("jina-repo")
    command = ["--checkpoint", str(source), "--name", MODEL, "--out", str(repo / MODEL)]
    assert main([*command, "--no-compact-attention"]) == 0
    return source, repo


@pytest.fixture(scope="module")
def server(checkpoint: tuple[Path, Path]) -> Iterator[str]:
    with running_server(checkpoint[1], intra_op_threads="2") as url:
        yield url


def _decode(array: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype="<f4").reshape(array["shape"])


def _reference(source: Path, folder: str | None) -> torch.nn.Module:
    """``JinaEmbeddingsV3Model`` (eager) with ``folder``'s LoRA as PEFT applies it."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    if folder is None:
        return model
    config = json.loads((source / folder / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    state = load_file(str(source / folder / "adapter_model.safetensors"))
    for name, module in model.named_modules():
        key = f"base_model.model.{name}"
        if f"{key}.lora_A.weight" in state:
            a, b = state[f"{key}.lora_A.weight"], state[f"{key}.lora_B.weight"]

            def linear(_: Any, args: tuple[torch.Tensor], out: torch.Tensor, a=a, b=b) -> Any:
                return out + scaling * (args[0] @ a.T) @ b.T

            module.register_forward_hook(linear)
        if f"{key}.lora_embedding_A" in state:
            a, b = state[f"{key}.lora_embedding_A"], state[f"{key}.lora_embedding_B"]

            def embedding(_: Any, args: tuple[torch.Tensor], out: torch.Tensor, a=a, b=b) -> Any:
                return out + scaling * torch.nn.functional.embedding(args[0], a.T) @ b.T

            module.register_forward_hook(embedding)
    return model


def _eager(source: Path, folder: str | None, ids: list[int]) -> Any:
    model = _reference(source, folder)
    with torch.no_grad():
        return model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True
        )


def _tokenizer(source: Path) -> Tokenizer:
    return Tokenizer.from_file(str(source / "tokenizer.json"))


def _encode(server: str, task: str | None) -> list[dict[str, Any]]:
    body: dict[str, Any] = {
        "model": MODEL,
        "inputs": TEXTS,
        "return_attention": True,
        "return_hidden_states": True,
        "encoding_format": "base64",
    }
    if task is not None:
        body["task"] = task
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def _assert_equal(item: dict[str, Any], want: Any, n: int) -> None:
    hidden = _decode(item["embeddings"])
    np.testing.assert_allclose(hidden, want.last_hidden_state[0].numpy(), rtol=0, atol=ATOL)
    states = _decode(item["hidden_states"])
    assert states.shape == (SIZES["layers"] + 1, n, SIZES["hidden"])
    for layer, state in enumerate(want.hidden_states):
        np.testing.assert_allclose(states[layer], state[0].numpy(), rtol=0, atol=ATOL)
    attention = _decode(item["attention"])
    assert attention.shape == (SIZES["layers"], SIZES["heads"], n, n)
    for layer, maps in enumerate(want.attentions):
        np.testing.assert_allclose(attention[layer], maps[0].numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("folder", [*TASKS, None])
def test_each_task_equals_jina_v3_with_that_adapter(
    folder: str | None, checkpoint: tuple[Path, Path], server: str
) -> None:
    """/v1/encode with ``task`` (None: no task, the base model, as the reference without
    set_adapter): every output equals the reference with that adapter."""
    source = checkpoint[0]
    tokenizer = _tokenizer(source)
    data = _encode(server, None if folder is None else TASKS[folder])
    for text, item in zip(TEXTS, data, strict=True):
        encoding = tokenizer.encode(text)
        assert item["tokens"] == encoding.tokens
        _assert_equal(item, _eager(source, folder, encoding.ids), len(encoding.ids))


def test_the_wrong_task_is_far_from_the_reference(
    checkpoint: tuple[Path, Path], server: str
) -> None:
    """Positive control: each task's answer differs from every other task's reference
    (and the base model's) by far more than the tolerance, so the comparisons above
    could fail."""
    source = checkpoint[0]
    ids = _tokenizer(source).encode(TEXTS[0]).ids
    wants = {
        folder: _eager(source, folder, ids).last_hidden_state[0].numpy()
        for folder in [*TASKS, None]
    }
    for folder in [*TASKS, None]:
        served = _decode(
            _encode(server, None if folder is None else TASKS[folder])[0]["embeddings"]
        )
        for other, want in wants.items():
            gap = float(np.abs(served - want).max())
            assert (gap <= ATOL) == (other == folder), (folder, other, gap)
            if other != folder:
                assert gap > 100 * ATOL, (folder, other, gap)


def _pooled(source: Path, folder: str | None, text: str) -> np.ndarray:
    """sentence-transformers' recipe on the reference: mean over tokens, normalized."""
    want = _eager(source, folder, _tokenizer(source).encode(text).ids).last_hidden_state[0]
    mean = want.mean(dim=0)
    vector: np.ndarray = (mean / mean.norm()).numpy()
    return vector


def test_openai_embeddings_take_a_task(checkpoint: tuple[Path, Path], server: str) -> None:
    """/v1/embeddings with the extra body field ``task``: the folder's pooled, normalized
    vector of the reference with that adapter."""
    source = checkpoint[0]
    body = {"model": MODEL, "input": TEXTS, "task": "retrieval.passage"}
    r = httpx.post(f"{server}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 200, r.text
    for text, item in zip(TEXTS, r.json()["data"], strict=True):
        want = _pooled(source, "retrieval_passage", text)
        np.testing.assert_allclose(item["embedding"], want, rtol=0, atol=ATOL)
        other = _pooled(source, "retrieval_query", text)
        assert float(np.abs(np.array(item["embedding"]) - other).max()) > 100 * ATOL


def test_tei_embed_takes_a_task(checkpoint: tuple[Path, Path], server: str) -> None:
    """TEI's /embed with ``task``: the same vectors."""
    source = checkpoint[0]
    body = {"inputs": TEXTS, "task": "text-matching"}
    r = httpx.post(f"{server}/embed", json=body, timeout=60)
    assert r.status_code == 200, r.text
    for text, vector in zip(TEXTS, r.json(), strict=True):
        np.testing.assert_allclose(vector, _pooled(source, "text_matching", text), atol=ATOL)


def test_requests_of_different_tasks_at_once_each_get_their_own(
    checkpoint: tuple[Path, Path], server: str
) -> None:
    """Requests of every task sent together (the batcher may run them side by side):
    none answers with another's adapter."""
    source = checkpoint[0]
    folders = [*TASKS, None] * 2

    def pooled(folder: str | None) -> list[float]:
        body: dict[str, Any] = {"model": MODEL, "input": TEXTS[1]}
        if folder is not None:
            body["task"] = TASKS[folder]
        r = httpx.post(f"{server}/v1/embeddings", json=body, timeout=60)
        assert r.status_code == 200, r.text
        vector: list[float] = r.json()["data"][0]["embedding"]
        return vector

    with ThreadPoolExecutor(len(folders)) as pool:
        got = list(pool.map(pooled, folders))
    for folder, vector in zip(folders, got, strict=True):
        np.testing.assert_allclose(vector, _pooled(source, folder, TEXTS[1]), atol=ATOL)


@pytest.mark.parametrize(
    ("route", "status"),
    # OpenAI's protocol answers every invalid request 400 (invalid_request_error).
    [("/v1/encode", 422), ("/v1/embeddings", 400), ("/embed", 422)],
)
def test_an_unknown_task_is_refused_naming_the_tasks(server: str, route: str, status: int) -> None:
    key = "input" if route == "/v1/embeddings" else "inputs"
    body = {"model": MODEL, key: TEXTS[:1], "task": "summarization"}
    r = httpx.post(f"{server}{route}", json=body, timeout=60)
    assert r.status_code == status, r.text
    for name in TASKS.values():
        assert name in r.text
    assert "summarization" in r.text


def test_the_manifest_records_the_tasks(checkpoint: tuple[Path, Path]) -> None:
    from model_export.manifest import Manifest

    manifest = Manifest.read(checkpoint[1] / MODEL)
    assert manifest.tasks == tuple(TASKS.values())
    assert manifest.default_task is None
    assert manifest.architecture.lora_tasks == len(TASKS)
    assert manifest.architecture.lora_rank == max(RANKS.values())


def test_the_model_card_lists_the_tasks(server: str) -> None:
    r = httpx.get(f"{server}/v1/models/{MODEL}", timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["tasks"] == list(TASKS.values())
    assert r.json()["default_task"] is None


def _fused_adapter(source: Path, folder: Path) -> None:
    """``folder``: the test's retrieval_query adapter with q, k, v in one ``mixer.Wqkv``
    LoRA (A shared, B's rows stacked q, k, v) and the stored names for the others."""
    state = load_file(str(source / "retrieval_query" / "adapter_model.safetensors"))
    shared = torch.Generator().manual_seed(1)
    fused: dict[str, torch.Tensor] = {}
    for i in range(SIZES["layers"]):
        old, new = f"base_model.model.layers.{i}", f"base_model.model.encoder.layers.{i}"
        a = torch.randn(RANKS["retrieval_query"], SIZES["hidden"], generator=shared) * 0.3
        rows = [state[f"{old}.self_attn.{p}_proj.lora_B.weight"] for p in "qkv"]
        fused[f"{new}.mixer.Wqkv.lora_A.weight"] = a
        fused[f"{new}.mixer.Wqkv.lora_B.weight"] = torch.cat(rows)
        for theirs, stored in (("self_attn.o_proj", "mixer.out_proj"), ("mlp.fc1", "mlp.fc1")):
            for part in ("lora_A", "lora_B"):
                fused[f"{new}.{stored}.{part}.weight"] = state[f"{old}.{theirs}.{part}.weight"]
        for part in ("lora_A", "lora_B"):
            key = f"mlp.fc2.{part}.weight"
            fused[f"{new}.{key}"] = state[f"{old}.{key}"]
    for key in (f"{WORD}.lora_embedding_A", f"{WORD}.lora_embedding_B"):
        fused[f"base_model.model.{key}"] = state[f"base_model.model.{key}"]
    folder.mkdir()
    save_file(fused, str(folder / "adapter_model.safetensors"))
    config = (source / "retrieval_query" / "adapter_config.json").read_text()
    (folder / "adapter_config.json").write_text(config)


def _import(source: Path, folders: list[str], tmp: Path) -> Path:
    """A copy of the checkpoint with only ``folders``' adapters."""
    import shutil

    copy = tmp / "ckpt"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*TASKS))
    for folder in folders:
        shutil.copytree(source / folder, copy / folder)
    return copy


def test_a_fused_qkv_adapter_in_the_stored_names_equals_the_split_one(
    checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    """An adapter of q, k, v in one fused ``mixer.Wqkv`` LoRA (the layout the weights are
    stored in), split on import: the same encoder as the equivalent per-projection
    adapter (its q, k, v LoRA each ``A`` shared, ``B`` their rows), in PyTorch."""
    from model_export.hf_import import load_checkpoint

    source = checkpoint[0]
    copy = _import(source, [], tmp_path)
    _fused_adapter(source, copy / "retrieval_query")
    fused = load_checkpoint(copy)
    # The same adapter written per projection: each q/k/v A the fused A.
    split_dir = tmp_path / "split"
    split = _import(source, [], split_dir)
    state = load_file(str(copy / "retrieval_query" / "adapter_model.safetensors"))
    per: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        key = key.replace("encoder.layers", "layers").replace("mixer.out_proj", "self_attn.o_proj")
        if "mixer.Wqkv" in key:
            for p, part in zip(
                "qkv", value.chunk(3) if "lora_B" in key else [value] * 3, strict=True
            ):
                per[key.replace("mixer.Wqkv", f"self_attn.{p}_proj")] = part.clone()
        else:
            per[key] = value
    (split / "retrieval_query").mkdir()
    save_file(per, str(split / "retrieval_query" / "adapter_model.safetensors"))
    config = (source / "retrieval_query" / "adapter_config.json").read_text()
    (split / "retrieval_query" / "adapter_config.json").write_text(config)
    per_projection = load_checkpoint(split)
    assert fused.tasks == per_projection.tasks == ("retrieval.query",)
    ids = torch.tensor([_tokenizer(source).encode(TEXTS[0]).ids])
    task, mask = torch.tensor([1]), torch.ones_like(ids)
    outs = []
    for ckpt in (fused, per_projection):
        with torch.no_grad():
            embeds = ckpt.embeddings(ids, torch.zeros_like(ids), task)
            outs.append(ckpt.encoder(embeds, mask, task=task).hidden)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-6)
    with torch.no_grad():  # and the adapter matters
        base = fused.encoder(fused.embeddings(ids, torch.zeros_like(ids)), mask).hidden
    assert float((outs[0] - base).abs().max()) > 100 * ATOL


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"peft_type": "IA3"}, "not LORA"),
        ({"rank_pattern": {"q_proj": 2}}, "ranks per module"),
    ],
)
def test_what_plain_lora_cannot_express_is_refused(
    checkpoint: tuple[Path, Path], tmp_path: Path, change: dict[str, Any], refusal: str
) -> None:
    from model_export.hf_import import CheckpointError, load_checkpoint

    copy = _import(checkpoint[0], ["separation"], tmp_path)
    path = copy / "separation" / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    with pytest.raises(CheckpointError, match=re.escape(refusal)):
        load_checkpoint(copy)


def test_lora_on_a_module_without_an_adapter_is_refused(
    checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    """LoRA on the pooler (no adapter in this encoder): refused, naming the key."""
    from model_export.hf_import import CheckpointError, load_checkpoint

    copy = _import(checkpoint[0], ["separation"], tmp_path)
    weights = copy / "separation" / "adapter_model.safetensors"
    state = load_file(str(weights))
    state["base_model.model.pooler.dense.lora_A.weight"] = torch.zeros(4, SIZES["hidden"])
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match=re.escape("pooler.dense.lora_A")):
        load_checkpoint(copy)


def test_attention_norms_use_the_tasks_projections(
    checkpoint: tuple[Path, Path], server: str
) -> None:
    """Attention norms α_ij · ‖v_j W_O^h‖ with the task's adapted value and output
    projections: v from the reference's (adapted) v_proj, W_O + (α/r) B A of its
    o_proj, per head (1e-4 of each map's largest value); the base W_O is off."""
    source, folder = checkpoint[0], "separation"
    body = {
        "model": MODEL,
        "inputs": [TEXTS[2]],
        "task": TASKS[folder],
        "return_attention": True,
        "attention": {"measure": "norms"},
        "return_embeddings": False,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = _decode(r.json()["data"][0]["attention"])
    model = _reference(source, folder)
    values: list[torch.Tensor] = []
    for layer in model.layers:  # after the LoRA hooks: the adapted values
        layer.self_attn.v_proj.register_forward_hook(lambda _m, _a, out: values.append(out))
    ids = _tokenizer(source).encode(TEXTS[2]).ids
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    config = json.loads((source / folder / "adapter_config.json").read_text())
    state = load_file(str(source / folder / "adapter_model.safetensors"))
    heads, d = SIZES["heads"], SIZES["hidden"]
    off = 0.0
    for index, layer in enumerate(model.layers):
        key = f"base_model.model.layers.{index}.self_attn.o_proj"
        delta = state[f"{key}.lora_B.weight"] @ state[f"{key}.lora_A.weight"]
        scale = config["lora_alpha"] / config["r"]
        for w, adapted in (
            (layer.self_attn.o_proj.weight + scale * delta, True),
            (layer.self_attn.o_proj.weight, False),
        ):
            v = values[index].view(1, -1, heads, d // heads)  # (1, T, h, d_k)
            w_o = w.view(d, heads, d // heads)  # (d, h, d_k)
            with torch.no_grad():
                norms = torch.einsum("bthk,dhk->bhtd", v, w_o).norm(dim=-1)  # (1, h, T)
                want = (out.attentions[index] * norms[:, :, None, :])[0].numpy()
            bound = 1e-4 * np.abs(want).max(axis=(-2, -1), keepdims=True)
            if adapted:
                assert np.all(np.abs(got[index] - want) <= bound)
            else:
                off = max(off, float((np.abs(got[index] - want) / bound).max()))
    assert off > 100  # the base W_O's norms are far off


def test_a_default_task_in_config_json_is_the_manifests(
    checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    """config.json's default_task names the adapter a request without task gets: the
    manifest maps no task to its id (the base model's 0 without one)."""
    import dataclasses

    from model_export.hf_import import CheckpointError, load_checkpoint
    from model_export.manifest import Manifest

    copy = _import(checkpoint[0], list(TASKS), tmp_path)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"default_task": "text-matching"}))
    assert load_checkpoint(copy).default_task == "text-matching"
    (copy / "config.json").write_text(json.dumps(config | {"default_task": "summarization"}))
    with pytest.raises(CheckpointError, match="summarization"):
        load_checkpoint(copy)
    manifest = Manifest.read(checkpoint[1] / MODEL)
    assert manifest.task_id(None) == 0
    assert manifest.task_id("retrieval.passage") == 2
    chosen = dataclasses.replace(manifest, default_task="text-matching")
    assert chosen.task_id(None) == len(TASKS)
    with pytest.raises(KeyError):
        manifest.task_id("summarization")
