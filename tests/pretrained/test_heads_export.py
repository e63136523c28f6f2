"""Heads in the export, each family against transformers eager.

Each family's ``*ForSequenceClassification`` and ``*ForMaskedLM`` is built small and
random-initialised by ``transformers``, saved with ``save_pretrained`` and exported by
the CLI. The head graph (token ids in, one run of onnxruntime) must equal the model's
own eager answer on each sequence alone, the sequences padded together in one batch:
logits within 1e-4 for classifiers, and for SPLADE the maximum over tokens of
log(1 + relu(MLM logits)) within 1e-4 (fp32, 2 layers; observed ~1e-6).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from model_export import graph_io
from model_export.cli import main
from model_export.families import FAMILIES
from model_export.heads import HeadError, load_head, splade_folder
from model_export.manifest import Manifest
from model_export.model import Encoder

ATOL = 1e-4
VOCAB = 120
SIZE = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2}
LENGTHS = (7, 3, 12)  # ragged: the shorter ones padded in the batch


def _config(family: str, **extra: Any) -> Any:
    import transformers

    if family == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_heads=4, n_layers=2, hidden_dim=64, **extra
        )
    if family == "modernbert":
        return transformers.ModernBertConfig(
            vocab_size=VOCAB,
            intermediate_size=64,
            max_position_embeddings=64,
            global_attn_every_n_layers=2,
            local_attention=8,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            cls_token_id=0,
            sep_token_id=2,
            classifier_pooling="mean",
            **SIZE,
            **extra,
        )
    if family == "deberta-v2":  # v3's: c2p + p2c, log buckets, shared keys, no types
        return transformers.DebertaV2Config(
            vocab_size=VOCAB,
            intermediate_size=64,
            max_position_embeddings=64,
            relative_attention=True,
            pos_att_type="p2c|c2p",
            position_buckets=4,
            max_relative_positions=16,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
            type_vocab_size=0,
            **SIZE,
            **extra,
        )
    config_class = {
        "bert": transformers.BertConfig,
        "roberta": transformers.RobertaConfig,
        "xlm-roberta": transformers.XLMRobertaConfig,
        "mpnet": transformers.MPNetConfig,
        "electra": transformers.ElectraConfig,
    }[family]
    offset = family in ("roberta", "xlm-roberta", "mpnet")
    return config_class(
        vocab_size=VOCAB,
        intermediate_size=64,
        max_position_embeddings=64 + (2 if offset else 0),
        pad_token_id=1 if offset else 0,
        **({"embedding_size": 32} if family == "electra" else {}),
        **SIZE,
        **extra,
    )


def _model(family: str, task: str) -> torch.nn.Module:
    import transformers

    prefix = {
        "bert": "Bert",
        "roberta": "Roberta",
        "xlm-roberta": "XLMRoberta",
        "mpnet": "MPNet",
        "electra": "Electra",
        "distilbert": "DistilBert",
        "modernbert": "ModernBert",
        "deberta-v2": "DebertaV2",
    }[family]
    suffix = "ForSequenceClassification" if task == "classify" else "ForMaskedLM"
    extra = {"num_labels": 3, "id2label": {0: "a", 1: "b", 2: "c"}} if task == "classify" else {}
    torch.manual_seed(0)
    model: torch.nn.Module = getattr(transformers, prefix + suffix)(_config(family, **extra))
    with torch.no_grad():  # far from init: a slip in a norm or a bias shows
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                param.normal_(1.0, 0.1)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.3)
    return model.eval()


CLASSIFY = (
    "bert",
    "roberta",
    "xlm-roberta",
    "mpnet",
    "electra",
    "distilbert",
    "modernbert",
    "deberta-v2",
)
SPLADE = ("bert", "roberta", "mpnet", "distilbert", "modernbert")


def _sequences() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, VOCAB, n) for n in LENGTHS]  # ids 0-2: specials, padding


def _head_run(model_dir: Path, graph: str, sequences: list[np.ndarray]) -> np.ndarray:
    longest = max(map(len, sequences))
    ids = np.ones((len(sequences), longest), dtype=np.int64)  # padded with id 1
    mask = np.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    session = ort.InferenceSession(str(model_dir / graph))
    feeds = {graph_io.INPUT_IDS: ids, graph_io.INPUT_TOKEN_TYPES: np.zeros_like(ids)}
    (out,) = session.run(None, feeds | {graph_io.INPUT_MASK: mask})
    result: np.ndarray = out
    return result


def _export(tmp_path: Path, family: str, task: str) -> tuple[torch.nn.Module, Path]:
    model = _model(family, task)
    source, out = tmp_path / "checkpoint", tmp_path / "model"
    model.save_pretrained(source)
    assert main(["--checkpoint", str(source), "--out", str(out), "--exporter", "torchscript"]) == 0
    return model, out


@pytest.mark.parametrize("family", CLASSIFY)
def test_classification_heads_equal_transformers(tmp_path: Path, family: str) -> None:
    model, out = _export(tmp_path, family, "classify")
    manifest = Manifest.read(out)
    assert manifest.head is not None and manifest.task == "classify"
    assert manifest.head.labels == ("a", "b", "c")
    assert manifest.head.activation == "softmax"  # several labels: the pipeline's default
    got = _head_run(out, graph_io.GRAPH_SCORES, _sequences())
    with torch.no_grad():
        want = np.concatenate(
            [model(input_ids=torch.from_numpy(s)[None]).logits.numpy() for s in _sequences()]
        )
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def _splade(model: torch.nn.Module, sequence: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(sequence)[None]).logits[0]  # (T, vocab)
    out: np.ndarray = torch.log1p(torch.relu(logits)).amax(dim=0).numpy()
    return out


@pytest.mark.parametrize("family", SPLADE)
def test_splade_heads_equal_transformers_masked_lm(tmp_path: Path, family: str) -> None:
    model, out = _export(tmp_path, family, "splade")
    assert Manifest.read(out).task == "splade"
    got = _head_run(out, graph_io.GRAPH_SPLADE, _sequences())
    want = np.stack([_splade(model, s) for s in _sequences()])
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def _vocabulary_matrices(graph: Path) -> set[str]:
    """Where in weights.bin each [vocab, d] matrix of ``graph`` is read from."""
    model = onnx.load(str(graph), load_external_data=False)
    return {
        next(e.value for e in tensor.external_data if e.key == "offset")
        for tensor in model.graph.initializer
        if list(tensor.dims) == [VOCAB, SIZE["hidden_size"]]
    }


def test_the_tied_decoder_is_stored_once(tmp_path: Path) -> None:
    """The MLM decoder is the word-embedding matrix: the SPLADE graph reads the very bytes
    the token-embedding graph looks words up in (a MatMul would store its transpose)."""
    _, out = _export(tmp_path, "bert", "splade")
    words = _vocabulary_matrices(out / graph_io.GRAPH_TOKEN_EMBEDDINGS)
    decoder = _vocabulary_matrices(out / graph_io.GRAPH_SPLADE)
    assert len(words) == 1 and decoder == words, (words, decoder)


def test_head_none_exports_the_encoder_alone(tmp_path: Path) -> None:
    model = _model("bert", "classify")
    model.save_pretrained(tmp_path / "checkpoint")
    args = ["--checkpoint", str(tmp_path / "checkpoint"), "--out", str(tmp_path / "m")]
    assert main([*args, "--exporter", "torchscript", "--head", "none"]) == 0
    manifest = Manifest.read(tmp_path / "m")
    assert manifest.head is None and manifest.task == "embed"
    assert not (tmp_path / "m" / graph_io.GRAPH_SCORES).exists()


def test_a_head_missing_from_the_checkpoint_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--head classify on a checkpoint without a classifier: refused, the key named."""
    _model("bert", "splade").save_pretrained(tmp_path / "checkpoint")
    args = ["--checkpoint", str(tmp_path / "checkpoint"), "--out", str(tmp_path / "m")]
    assert main([*args, "--exporter", "torchscript", "--head", "classify"]) != 0
    assert "bert.pooler.dense.weight" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_families_without_a_head_defined_are_refused() -> None:
    encoder = Encoder.__new__(Encoder)  # never reached: the family is checked first
    with pytest.raises(HeadError, match="no masked-LM \\(SPLADE\\) head is defined for 'electra'"):
        load_head(Path("."), "splade", FAMILIES["electra"], {}, {}, encoder)


def _sparse_folder(root: Path, modules: list[str], pooling: dict[str, str]) -> Path:
    base = "sentence_transformers.sparse_encoder.modules."
    types = {"MLMTransformer": "mlm_transformer.MLMTransformer"}
    types |= {"SpladePooling": "splade_pooling.SpladePooling"}
    types |= {"SparseStaticEmbedding": "sparse_static_embedding.SparseStaticEmbedding"}
    listed = [
        {"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{m}", "type": base + types[m]}
        for i, m in enumerate(modules)
    ]
    (root / "modules.json").write_text(json.dumps(listed))
    (root / "1_SpladePooling").mkdir(exist_ok=True)
    (root / "1_SpladePooling" / "config.json").write_text(json.dumps(pooling))
    return root


@pytest.mark.parametrize(
    ("modules", "pooling", "says"),
    [
        (["MLMTransformer", "SpladePooling"], {"pooling_strategy": "sum"}, "sum/relu"),
        (
            ["MLMTransformer", "SpladePooling"],
            {"activation_function": "log1p_relu"},
            "max/log1p_relu",
        ),
        (["SparseStaticEmbedding", "SpladePooling"], {}, "is not supported"),
    ],
)
def test_sparse_encoders_the_graph_does_not_compute_are_refused(
    tmp_path: Path, modules: list[str], pooling: dict[str, str], says: str
) -> None:
    with pytest.raises(HeadError, match=says):
        splade_folder(_sparse_folder(tmp_path, modules, pooling))


def test_a_sparse_encoder_folder_is_read_as_splade(tmp_path: Path) -> None:
    folder = _sparse_folder(tmp_path, ["MLMTransformer", "SpladePooling"], {})
    assert splade_folder(folder)


def test_a_masked_lm_named_checkpoint_without_its_head_exports_the_encoder(
    tmp_path: Path,
) -> None:
    """all-mpnet-base-v2 says MPNetForMaskedLM and holds no lm_head: auto exports no head
    (it failed on it, asking for lm_head.dense.weight)."""
    import transformers

    torch.manual_seed(0)
    transformers.BertModel(_config("bert")).save_pretrained(tmp_path / "checkpoint")
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps(config))
    args = ["--checkpoint", str(tmp_path / "checkpoint"), "--out", str(tmp_path / "m")]
    assert main([*args, "--exporter", "torchscript"]) == 0
    assert Manifest.read(tmp_path / "m").task == "embed"
