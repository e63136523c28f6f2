"""A checkpoint without ``tokenizer.json`` (an older BERT folder: ``vocab.txt`` +
``tokenizer_config.json``; a SentencePiece ``.model``) gets one converted at export,
checked against the slow tokenizer on the probe texts; where it cannot be, the export
says so in one line and goes on without a tokenizer.

The BERT folder: a small random ``BertModel`` with MiniLM's real WordPiece files; the
server's ``/v1/tokenize`` ids must equal transformers' slow (pure-Python) BERT
tokenizer's on texts apart from the probe texts.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from model_export.cli import main
from model_export.hf_import import load_checkpoint, minilm_l6_dir
from model_export.manifest import Manifest
from tests.conftest import running_server
from tests.support.heads import _bert_config as bert_config

SLOW_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
TEXTS = [
    "Attention is all you need, said the paper.",
    "Unaffable ÉCOLE naïve Größe — 東京 café!!",
    "splitting hyphen-ated words, 12,345.67 numbers & symbols: @#$%",
]
HAS_SENTENCEPIECE = importlib.util.find_spec("sentencepiece") is not None


def _slow_bert(directory: Path) -> Any:
    """transformers' pure-Python BERT tokenizer (BertTokenizerLegacy since 5.x)."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    except ImportError:  # transformers < 5: the slow class is BertTokenizer
        from transformers import BertTokenizer as BertTokenizerLegacy
    return BertTokenizerLegacy.from_pretrained(str(directory))


@pytest.fixture(scope="module")
def old_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import BertModel

    folder = tmp_path_factory.mktemp("old-bert")
    torch.manual_seed(0)
    BertModel(bert_config()).save_pretrained(folder)  # MiniLM's vocabulary size
    for name in SLOW_FILES:
        shutil.copyfile(minilm_l6_dir() / name, folder / name)
    assert not (folder / "tokenizer.json").exists()
    return folder


@pytest.mark.usefixtures("restore_logging")
def test_an_old_bert_folder_exports_a_tokenizer_equal_to_the_slow_one(
    old_bert: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    args = ["--checkpoint", str(old_bert), "--name", "old-bert", "--out", str(repo / "old-bert")]
    assert main([*args, "--exporter", "torchscript", "--no-compact-attention"]) == 0
    assert Manifest.read(repo / "old-bert").has_tokenizer
    with running_server(repo) as url:
        r = httpx.post(f"{url}/v1/tokenize", json={"text": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    slow = _slow_bert(old_bert)
    assert [item["ids"] for item in r.json()["data"]] == [slow(t)["input_ids"] for t in TEXTS]


@pytest.fixture
def restore_logging() -> Any:
    """main() configures logging: leave the root logger as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield None
    root.handlers[:], root.level = handlers, level


def _xlmr(folder: Path, model: bytes) -> None:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    config = XLMRobertaConfig(
        vocab_size=304,
        hidden_size=16,
        num_attention_heads=2,
        num_hidden_layers=1,
        intermediate_size=32,
        max_position_embeddings=34,
    )
    XLMRobertaModel(config).save_pretrained(folder)
    (folder / "sentencepiece.bpe.model").write_bytes(model)
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "XLMRobertaTokenizer"})
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "model_export.tokenizer_convert" and r.levelno == logging.WARNING
    ]


@pytest.mark.skipif(HAS_SENTENCEPIECE, reason="the conversion itself is tested instead")
def test_without_sentencepiece_a_sentencepiece_folder_says_so_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _xlmr(tmp_path, b"not read: the package is missing")
    with caplog.at_level(logging.WARNING):
        checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.tokenizer_file is None
    [line] = _warnings(caplog)
    assert "sentencepiece.bpe.model was not converted" in line
    assert "pip install sentencepiece" in line and "\n" not in line


@pytest.mark.skipif(not HAS_SENTENCEPIECE, reason="sentencepiece is not installed")
@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_a_sentencepiece_model_converts_only_when_its_pieces_agree(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """XLM-R's own is a Unigram model: converted, its pieces equal SentencePiece's. A BPE
    SentencePiece model converts with other pieces (seen with transformers 5.24): refused
    in one line."""
    import sentencepiece

    from model_export.quantize_sentences import sentences

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences(400, 3)),
        model_writer=model,
        vocab_size=300,
        model_type=kind,
        character_coverage=1.0,
        minloglevel=2,
    )
    _xlmr(tmp_path, model.getvalue())
    with caplog.at_level(logging.WARNING):
        checkpoint = load_checkpoint(tmp_path)
    if kind == "unigram":
        assert checkpoint.tokenizer_file is not None and not _warnings(caplog)
        from tokenizers import Tokenizer

        processor = sentencepiece.SentencePieceProcessor(
            model_file=str(tmp_path / "sentencepiece.bpe.model")
        )
        converted = Tokenizer.from_file(str(checkpoint.tokenizer_file))
        for text in TEXTS:
            pieces = converted.encode(text, add_special_tokens=False).tokens
            assert pieces == processor.encode(text, out_type=str)
    else:
        assert checkpoint.tokenizer_file is None
        [line] = _warnings(caplog)
        assert "differs from the slow one" in line
