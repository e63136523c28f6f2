"""The families beside BERT, served and checked against transformers eager.

No package here ships RoBERTa, XLM-RoBERTa, DistilBERT, RoFormer, ModernBERT or
small MPNet weights, so each is a small random-initialised checkpoint that
``transformers`` builds and saves with ``save_pretrained``, with a tokenizer of
its family's kind (byte-level BPE for RoBERTa and ModernBERT, Unigram for
XLM-RoBERTa, the real MiniLM WordPiece for DistilBERT, MPNet and RoFormer, whose
own tokenizers are WordPiece too): the path a real checkpoint takes. Each is
exported by the CLI and served; the answers over ``/v1/encode`` (text in, the
texts padded together in one batch) must equal the model's own
``attn_implementation="eager"`` outputs on each text alone: last hidden state,
every hidden state and every attention map within 1e-4 (fp32, 2 layers, ModernBERT
3 with a local window of ±4 tokens in layer 1; observed ~1e-6).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from model_export.hf_import import CheckpointError, load_checkpoint, minilm_l6_dir
from tests.conftest import running_server

ATOL = 1e-4
SIZES = {"hidden": 32, "heads": 4, "layers": 2, "ff": 64, "positions": 64}
TEXTS = [
    "The attention maps of every family are served.",
    "Short one.",
    "Naïve café: positions start after the padding id in RoBERTa, 东京 too.",
]
CORPUS = [*TEXTS, "the quick brown fox jumps over the lazy dog " * 4, "padding and offsets"] * 20


def _bpe(directory: Path) -> Tokenizer:
    """RoBERTa's kind: byte-level BPE, <s> text </s>; <pad> is id 1."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tokenizer


def _unigram(directory: Path) -> Tokenizer:
    """XLM-RoBERTa's kind: SentencePiece-style Unigram with ▁ word starts."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=200, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tokenizer


def _wordpiece(directory: Path) -> Tokenizer:
    return Tokenizer.from_file(str(minilm_l6_dir() / "tokenizer.json"))


def _roberta(vocab: int, kind: str) -> torch.nn.Module:
    from transformers import RobertaConfig, RobertaModel, XLMRobertaConfig, XLMRobertaModel

    config_class, model_class = (
        (RobertaConfig, RobertaModel) if kind == "roberta" else (XLMRobertaConfig, XLMRobertaModel)
    )
    config = config_class(
        vocab_size=vocab,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"] + 2,  # rows 0, 1: before padding id + 1
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
    )
    model: torch.nn.Module = model_class(config, add_pooling_layer=False)
    return model


def _distilbert(vocab: int, kind: str) -> torch.nn.Module:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(
        vocab_size=vocab,
        dim=SIZES["hidden"],
        n_heads=SIZES["heads"],
        n_layers=SIZES["layers"],
        hidden_dim=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
    )
    model: torch.nn.Module = DistilBertModel(config)
    return model


def _roformer(vocab: int, kind: str) -> torch.nn.Module:
    from transformers import RoFormerConfig, RoFormerModel

    config = RoFormerConfig(
        vocab_size=vocab,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        pad_token_id=0,  # MiniLM's [PAD]
    )
    model: torch.nn.Module = RoFormerModel(config)
    return model


# ModernBERT: layers 0 and 2 global, layer 1 local, seeing |i - j| <= 8 // 2 only: the
# test texts are longer than that window (checked in the test).
MODERNBERT_LAYERS = 3
MODERNBERT_LOCAL_ATTENTION = 8


def _modernbert(vocab: int, kind: str) -> torch.nn.Module:
    from transformers import ModernBertConfig, ModernBertModel

    config = ModernBertConfig(
        vocab_size=vocab,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=MODERNBERT_LAYERS,
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        global_attn_every_n_layers=2,
        local_attention=MODERNBERT_LOCAL_ATTENTION,
        # _bpe's ids: <s> 0 (bos, cls), <pad> 1, </s> 2 (eos, sep)
        bos_token_id=0,
        cls_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        sep_token_id=2,
    )
    model: torch.nn.Module = ModernBertModel(config)
    return model


def _mpnet(vocab: int, kind: str) -> torch.nn.Module:
    from transformers import MPNetConfig, MPNetModel

    config = MPNetConfig(
        vocab_size=vocab,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"] + 2,  # rows 0, 1: before padding id + 1
        layer_norm_eps=1e-5,
    )
    model: torch.nn.Module = MPNetModel(config, add_pooling_layer=False)
    return model


FAMILIES: dict[str, tuple[Callable[[Path], Tokenizer], Callable[[int, str], torch.nn.Module]]] = {
    "roberta": (_bpe, _roberta),
    "xlm-roberta": (_unigram, _roberta),
    "distilbert": (_wordpiece, _distilbert),
    "mpnet": (_wordpiece, _mpnet),
    "roformer": (_wordpiece, _roformer),
    "modernbert": (_bpe, _modernbert),
}


def _checkpoint(directory: Path, family: str) -> None:
    """A random-initialised ``family`` checkpoint, as ``save_pretrained`` writes it."""
    make_tokenizer, make_model = FAMILIES[family]
    tokenizer = make_tokenizer(directory)
    torch.manual_seed(0)
    model = make_model(tokenizer.get_vocab_size(), family)
    # Random LayerNorm weights too, so a mapping slip between norms cannot pass; query and
    # key weights scaled up, as a random init leaves attention near-uniform (a slip in the
    # maps would hide in it); MPNet's relative position bias large (std 1), so dropping it shows.
    # (ModernBERT's fused Wqkv scales its values too: harmless.)
    queries_keys = ("query.weight", "key.weight", "q_lin.weight", "k_lin.weight", "Wqkv.weight")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower():  # LayerNorm, layer_norm, ModernBERT's attn_norm…
                param.normal_(1.0, 0.1)
            elif name.endswith((*queries_keys, "attn.q.weight", "attn.k.weight")):
                param.mul_(5.0)
            elif name.endswith("relative_attention_bias.weight"):
                param.normal_(0.0, 1.0)
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's checkpoint and its export, in one model repository."""
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("families")
    checkpoints = {}
    for family in FAMILIES:
        source = tmp_path_factory.mktemp(f"ckpt-{family}")
        _checkpoint(source, family)
        command = ["--checkpoint", str(source), "--name", family, "--out", str(repo / family)]
        # No compact graph (CI time): compact attention is tested in test_compact_attention.
        assert main([*command, "--no-compact-attention"]) == 0
        checkpoints[family] = source
    checkpoints["repository"] = repo
    return checkpoints


@pytest.fixture(scope="module")
def server(families: dict[str, Path]) -> Iterator[str]:
    with running_server(families["repository"], intra_op_threads="2") as url:
        yield url


def _decode(array: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype="<f4").reshape(array["shape"])


def _eager(source: Path, ids: list[int]) -> Any:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True
        )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_served_family_equals_transformers_eager(
    family: str, families: dict[str, Path], server: str
) -> None:
    body = {
        "model": family,
        "inputs": TEXTS,
        "return_attention": True,
        "return_hidden_states": True,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    tokenizer = Tokenizer.from_file(str(families[family] / "tokenizer.json"))
    tokenizer.no_padding()  # (MiniLM's file pads to 128, as sentence-transformers saved it)
    layers = MODERNBERT_LAYERS if family == "modernbert" else SIZES["layers"]
    cut = 0  # texts the local window cuts
    for text, item in zip(TEXTS, r.json()["data"], strict=True):
        encoding = tokenizer.encode(text)
        assert item["tokens"] == encoding.tokens
        want = _eager(families[family], encoding.ids)
        n = len(encoding.ids)
        hidden = _decode(item["embeddings"])
        np.testing.assert_allclose(hidden, want.last_hidden_state[0].numpy(), rtol=0, atol=ATOL)
        states = _decode(item["hidden_states"])
        assert states.shape == (layers + 1, n, SIZES["hidden"])
        assert len(want.hidden_states) == layers + 1
        for layer, state in enumerate(want.hidden_states):
            np.testing.assert_allclose(states[layer], state[0].numpy(), rtol=0, atol=ATOL)
        attention = _decode(item["attention"])
        assert attention.shape == (layers, SIZES["heads"], n, n)
        assert len(want.attentions) == layers
        for layer, maps in enumerate(want.attentions):
            np.testing.assert_allclose(attention[layer], maps[0].numpy(), rtol=0, atol=ATOL)
        if family == "modernbert" and n > MODERNBERT_LOCAL_ATTENTION:
            # The window cuts these texts: keys beyond ±4 get weight 0 in the local layer
            # (and not in the global ones), so a model ignoring the window answers
            # ~1/n there and fails the comparison above.
            offset = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])  # (T, T)
            outside = offset > MODERNBERT_LOCAL_ATTENTION // 2
            assert (want.attentions[1][0].numpy()[:, outside] == 0).all()
            assert (want.attentions[0][0].numpy()[:, outside] > 0).all()
            assert (attention[1][:, outside] == 0).all()
            cut += 1
    assert family != "modernbert" or cut >= 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_open_inference_protocol_serves_each_family_as_eager(
    family: str, families: dict[str, Path], server: str
) -> None:
    """/v2 (the Open Inference Protocol, text as BYTES): the same embeddings and maps."""
    text = TEXTS[2]  # the longest: past ModernBERT's local window
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
        "outputs": [{"name": "last_hidden_state"}, {"name": "attentions"}],
    }
    r = httpx.post(f"{server}/v2/models/{family}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    tokenizer = Tokenizer.from_file(str(families[family] / "tokenizer.json"))
    tokenizer.no_padding()
    want = _eager(families[family], tokenizer.encode(text).ids)

    def array(name: str) -> np.ndarray:
        return np.asarray(outputs[name]["data"], np.float32).reshape(outputs[name]["shape"])[0]

    np.testing.assert_allclose(
        array("last_hidden_state"), want.last_hidden_state[0].numpy(), rtol=0, atol=ATOL
    )
    maps = np.stack([layer[0].numpy() for layer in want.attentions])
    np.testing.assert_allclose(array("attentions"), maps, rtol=0, atol=ATOL)


def test_bm42_is_refused_for_tokenizers_it_is_not_defined_for(server: str) -> None:
    """BM42 merges WordPiece's ## pieces: a BPE model has no BM42 graph and says so (422);
    a WordPiece one (DistilBERT here) answers."""
    refused = httpx.post(
        f"{server}/v1/embed_sparse", json={"model": "roberta", "inputs": TEXTS}, timeout=60
    )
    assert refused.status_code == 422, refused.text
    assert "WordPiece" in refused.json()["error"], refused.text
    served = httpx.post(
        f"{server}/v1/embed_sparse", json={"model": "distilbert", "inputs": TEXTS}, timeout=60
    )
    assert served.status_code == 200, served.text


def test_relative_position_buckets_equal_mpnets_at_every_offset() -> None:
    """Every offset j - i in ±600, past the test models' 64 positions and MPNet's 128
    max distance, and through 64, where log(8)/log(16)·8 lands exactly on a boundary."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from model_export.config import EncoderConfig
    from model_export.model import RelativePositionBias

    seq = 601
    bias = RelativePositionBias(EncoderConfig(d_model=32, n_heads=4, relative_buckets=32))
    with torch.no_grad():
        bias.table.weight.copy_(torch.arange(32.0)[:, None].expand(32, 4))  # P = bucket
        buckets = bias(seq)[0, 0].long()  # (T, T)
    positions = torch.arange(seq)
    offsets = positions[None, :] - positions[:, None]  # j - i, as MPNetEncoder computes it
    assert torch.equal(buckets, MPNetEncoder.relative_position_bucket(offsets))


def test_an_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "t5", "architectures": ["T5EncoderModel"]}'
    )
    with pytest.raises(CheckpointError, match="'t5' \\(T5EncoderModel\\)"):
        load_checkpoint(tmp_path)


def test_modernbert_attention_norms_equal_a_direct_computation(
    families: dict[str, Path], server: str
) -> None:
    """Value norms with bias-free projections and pre-LN: α_ij · ‖v_j W_O^h‖, v_j from the
    value third of ModernBERT's Wqkv applied to the layer's normed input, from
    transformers' own modules (1e-4 of each map's largest value)."""
    from transformers import AutoModel

    text = TEXTS[2]
    body = {
        "model": "modernbert",
        "inputs": [text],
        "return_attention": True,
        "attention": {"measure": "norms"},
        "return_embeddings": False,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = _decode(r.json()["data"][0]["attention"])
    tokenizer = Tokenizer.from_file(str(families["modernbert"] / "tokenizer.json"))
    ids = tokenizer.encode(text).ids
    model = AutoModel.from_pretrained(families["modernbert"], attn_implementation="eager").eval()
    out = _eager(families["modernbert"], ids)
    heads, d = SIZES["heads"], SIZES["hidden"]
    with torch.no_grad():
        for index, layer in enumerate(model.layers):
            assert layer.attn.Wqkv.bias is None and layer.attn.Wo.bias is None
            x = layer.attn_norm(out.hidden_states[index])  # (1, T, d)
            v = layer.attn.Wqkv(x)[..., 2 * d :].view(1, -1, heads, d // heads)  # (1, T, h, d_k)
            w_o = layer.attn.Wo.weight.view(d, heads, d // heads)  # (d, h, d_k)
            norms = torch.einsum("bthk,dhk->bhtd", v, w_o).norm(dim=-1)  # (1, h, T)
            want = (out.attentions[index] * norms[:, :, None, :])[0].numpy()  # (h, T, T)
            scale = np.abs(want).max(axis=(-2, -1), keepdims=True)
            assert np.all(np.abs(got[index] - want) <= 1e-4 * scale)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"model_type": "roformer", "embedding_size": 16}, "embedding_size 16"),
        ({"model_type": "roformer", "rotary_value": True}, "rotary_value"),
        (
            {"model_type": "modernbert", "layer_types": ["sliding_attention", "full_attention"]},
            "layer_types",
        ),
        (
            {
                "model_type": "modernbert",
                "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}},
            },
            "rope_type 'linear'",
        ),
    ],
)
def test_rotary_families_refuse_what_they_cannot_express(
    overrides: dict[str, Any], named: str
) -> None:
    from model_export.hf_import import config_from_hf

    hf = {
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
    }
    with pytest.raises(CheckpointError, match=named):
        config_from_hf(hf | overrides)


def test_modernbert_keys_are_checked_both_ways(families: dict[str, Path], tmp_path: Path) -> None:
    """A missing fused Wqkv and an unexpected bias (the config says bias-free) are named."""
    from safetensors.torch import load_file, save_file

    source = families["modernbert"]
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    state = load_file(str(source / "model.safetensors"))
    del state["layers.1.attn.Wqkv.weight"]
    state["layers.2.mlp.Wo.bias"] = torch.zeros(SIZES["hidden"])
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert "missing layers.1.attn.Wqkv.weight" in str(info.value)
    assert "unexpected keys: layers.2.mlp.Wo.bias" in str(info.value)
