"""Random tiny late-interaction checkpoints, one per layout
``model_export.late_interaction`` reads: a sentence-transformers MultiVectorEncoder
built and saved by sentence-transformers ([Q]/[D] prompts, [MASK] expansion to 32 not
attended, a 128-d Dense, a punctuation skiplist, Normalize), a PyLate v3 folder and a
Stanford HF_ColBERT folder written by hand (sentence-transformers loads both,
registering their markers), and a bge-m3 layout (XLM-RoBERTa + colbert_linear.pt +
sparse_linear.pt). ``LAYOUTS`` names each builder."""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from sentence_transformers import MultiVectorEncoder
from transformers import AddedToken, BertModel, BertTokenizerFast

from tests.support.heads import (
    SIZES,
    _bert_config,
    _bert_tokenizer,
    _randomised,
    _unigram_tokenizer,
)

HIDDEN = SIZES["hidden"]
QUERIES = ["what is late interaction?", "colbert, maxsim!"]
DOCUMENTS = [
    "late interaction scores every query token against every document token.",
    "maxsim: the largest similarity, summed over the query's tokens",
]


def _bert(directory: Path, extra_tokens: list[AddedToken] | None = None) -> BertTokenizerFast:
    """A random BERT (MiniLM's WordPiece tokenizer, plus ``extra_tokens``) saved there."""
    _bert_tokenizer(directory)
    tokenizer = BertTokenizerFast.from_pretrained(directory)
    if extra_tokens:
        tokenizer.add_tokens(extra_tokens)
        tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = _bert_config()
    config.vocab_size = len(tokenizer)  # type: ignore[attr-defined]
    model = _randomised(BertModel(config))
    model.save_pretrained(directory)
    return tokenizer


def multi_vector_encoder(root: Path) -> Path:
    """(a) sentence-transformers' own MultiVectorEncoder, saved by it."""
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    markers = [AddedToken(m, normalized=False, special=True) for m in ("[Q]", "[D]")]
    _bert(root / "hf", markers)
    torch.manual_seed(1)
    expansion = {"strategy": "fixed", "length": 32, "attend": False}
    model = MultiVectorEncoder(
        modules=[
            Transformer(str(root / "hf"), query_expansion=expansion, document_length=48),
            Dense(
                HIDDEN,
                128,
                bias=False,
                activation_function=torch.nn.Identity(),
                module_input_name="token_embeddings",
            ),
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ],
        prompts={"query": "[Q] ", "document": "[D] "},
        device="cpu",
    )
    model.save(str(root / "mve"))
    return root / "mve"


def _dense_folder(folder: Path, out: int, seed: int) -> None:
    folder.mkdir()
    config = {
        "in_features": HIDDEN,
        "out_features": out,
        "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
    }
    (folder / "config.json").write_text(json.dumps(config))
    weight = torch.randn(out, HIDDEN, generator=torch.Generator().manual_seed(seed)) * 0.2
    save_file({"linear.weight": weight}, str(folder / "model.safetensors"))


def pylate(root: Path) -> Path:
    """(b) PyLate v3: [Transformer, Dense] and its knobs at the top level; its markers
    "[Q] "/"[D] " added as ordinary tokens, as PyLate adds them."""
    folder = root / "pylate"
    _bert(folder, [AddedToken("[Q] "), AddedToken("[D] ")])
    _dense_folder(folder / "1_Dense", 24, seed=2)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 60}))
    top = {
        "model_type": "ColBERT",
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": 24,
        "document_length": 60,
        "attend_to_expansion_tokens": True,
        "do_query_expansion": True,
        "skiplist_words": ["?", ",", ":", "notaword"],
        "similarity_fn_name": "MaxSim",
        "prompts": {},
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(top))
    return folder


def stanford(root: Path) -> Path:
    """(c) Stanford ColBERT's HF_ColBERT: bert.* and linear.weight in one file."""
    folder = root / "stanford"
    _bert(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"]}))
    weights = folder / "model.safetensors"
    from safetensors.torch import load_file

    state = {f"bert.{k}": v for k, v in load_file(str(weights)).items()}
    state["linear.weight"] = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(3))
    save_file(state, str(weights))
    metadata = {
        "query_maxlen": 20,
        "doc_maxlen": 40,
        "attend_to_mask_tokens": False,
        "mask_punctuation": True,
        "dim": 16,
        "similarity": "cosine",
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
    }
    (folder / "artifact.metadata").write_text(json.dumps(metadata))
    return folder


def bge_m3(root: Path) -> Path:
    """(d) bge-m3's layout: XLM-RoBERTa, colbert_linear.pt, sparse_linear.pt."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    folder = root / "bge-m3"
    config = XLMRobertaConfig(
        vocab_size=200,
        hidden_size=HIDDEN,
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"] + 2,
        type_vocab_size=1,
        pad_token_id=1,
    )
    torch.manual_seed(4)
    _randomised(XLMRobertaModel(config)).save_pretrained(folder)
    _unigram_tokenizer(folder)
    torch.save(torch.nn.Linear(HIDDEN, HIDDEN).state_dict(), folder / "colbert_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, 1).state_dict(), folder / "sparse_linear.pt")
    return folder


LAYOUTS: dict[str, Callable[[Path], Path]] = {
    "multi_vector_encoder": multi_vector_encoder,
    "pylate": pylate,
    "stanford": stanford,
    "bge_m3": bge_m3,
}


def build_all(root: Path) -> dict[str, Path]:
    """Every layout's checkpoint folder under ``root``, by name (offline)."""
    import os

    offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        return {name: build(root / name) for name, build in LAYOUTS.items()}
    finally:
        if offline is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = offline


def export_all(checkpoints: dict[str, Path], repository: Path) -> Path:
    """Each checkpoint exported by the CLI into ``repository`` as its name with dashes
    (``bge_m3`` -> ``bge-m3``), as a server serves them; ``repository`` itself."""
    from model_export.cli import main

    for name, folder in checkpoints.items():
        out = str(repository / name.replace("_", "-"))
        assert main(["--checkpoint", str(folder), "--out", out, "--no-compact-attention"]) == 0
    return repository
