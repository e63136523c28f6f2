"""DeBERTa-v2 served, against transformers' eager DebertaV2Model and sentence-transformers.

No package here ships DeBERTa weights, so two small random-initialised checkpoints are
built by ``transformers`` and saved as their users save them, with a small Unigram
tokenizer of DeBERTa-v3's kind ([CLS] a [SEP] b [SEP], types 0 then 1):

- an encoder as DeBERTa-v3 is configured: relative attention with c2p and p2c, log
  buckets (8 buckets, max distance 24: the test texts reach past ±4 into the log
  buckets and past the last one), shared keys, the relative embeddings' LayerNorm, no
  absolute positions, no token types;
- a one-logit ``DebertaV2ForSequenceClassification`` reranker saved as a
  sentence-transformers CrossEncoder folder, configured the other way: its own position
  projections, plain offsets clipped at ±6, absolute positions, two token types, a relu
  ContextPooler.

Each is exported by the CLI and served. ``/v1/encode`` (the texts padded together in
one batch) and ``/v2`` must equal eager on each text alone: last hidden state, every
hidden state and every attention map within 1e-4; ``/v1/rerank`` must equal
``CrossEncoder.predict`` within 1e-5 with the same order. The positive controls drop
each position term, or the log buckets, and show the same comparison fails.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from model_export.hf_import import CheckpointError, config_from_hf, load_checkpoint
from tests.conftest import running_server

ATOL = 1e-4
SCORE_ATOL = 1e-5
SIZES = {"hidden": 32, "heads": 4, "layers": 2, "ff": 64, "positions": 64}
TEXTS = [
    "Disentangled attention reads every offset between two tokens.",
    "Short one.",
    "the quick brown fox jumps over the lazy dog and the relative positions fall in buckets",
]
QUERY = "what is attention in a transformer"
DOCUMENTS = [
    "attention weighs every token by its relevance to the query",
    "the quick brown fox jumps over the lazy dog",
    "rerankers read the query and the document together",
    "sparse vectors keep a weight per vocabulary word " * 10,  # cut to fit the window
    "a",
]
CORPUS = [*TEXTS, QUERY, *DOCUMENTS[:3], "sparse vectors keep a weight per vocabulary word"] * 20
BUCKETS, MAX_RELATIVE = 8, 24  # the encoder's: |i - j| > 4 falls in log buckets
CROSS_SPAN = 6  # the reranker's: plain offsets, clipped at ±6


def _tokenizer(directory: Path) -> None:
    """DeBERTa-v3's own tokenizer class on a small trained Unigram vocabulary: ▁ word
    starts, [CLS] a [SEP] b [SEP] with types 0 then 1 (its tokenizer.json says so)."""
    from transformers import DebertaV2Tokenizer

    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="[UNK]")
    unigram.train_from_iterator(CORPUS, trainer)
    vocab = [
        (piece, float(score)) for piece, score in json.loads(unigram.to_str())["model"]["vocab"]
    ]
    DebertaV2Tokenizer(vocab=vocab).save_pretrained(directory)


def _config(**extra: Any) -> Any:
    from transformers import DebertaV2Config

    return DebertaV2Config(
        vocab_size=200,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        pad_token_id=0,
        **extra,
    )


def _randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Norms far from their init, queries and keys scaled up (a random init leaves the
    maps near-uniform) and the relative embeddings large (std 1), so dropping a position
    term or a mapping slip cannot pass unseen."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name:
                param.normal_(1.0, 0.1)
            elif name.endswith(("query_proj.weight", "key_proj.weight")):
                param.mul_(5.0)  # pos_query_proj and pos_key_proj too
            elif name.endswith("rel_embeddings.weight"):
                param.normal_(0.0, 1.0)
            elif name.startswith("classifier") and name.endswith("bias"):
                param.normal_(0.0, 0.5)
    return model


def _encoder(directory: Path) -> None:
    from transformers import DebertaV2Model

    config = _config(
        position_buckets=BUCKETS,
        max_relative_positions=MAX_RELATIVE,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        type_vocab_size=0,
    )
    torch.manual_seed(0)
    _randomised(DebertaV2Model(config), 0).save_pretrained(directory)
    _tokenizer(directory)


def _cross_encoder(directory: Path) -> None:
    from sentence_transformers import CrossEncoder
    from transformers import DebertaV2ForSequenceClassification

    config = _config(
        max_relative_positions=CROSS_SPAN,
        share_att_key=False,
        position_biased_input=True,
        type_vocab_size=2,
        pooler_hidden_act="relu",
        num_labels=1,
        initializer_range=0.2,  # wider weights: a random head scores pairs apart
    )
    raw = directory.with_name(directory.name + "-hf")
    torch.manual_seed(1)
    _randomised(DebertaV2ForSequenceClassification(config), 1).save_pretrained(raw)
    _tokenizer(raw)
    CrossEncoder(str(raw), max_length=SIZES["positions"]).save(str(directory))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each checkpoint and its export, in one model repository."""
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("deberta")
    folders = {"repository": repo}
    for name, build in (("deberta", _encoder), ("deberta-reranker", _cross_encoder)):
        source = tmp_path_factory.mktemp(f"ckpt-{name}")
        build(source)
        command = ["--checkpoint", str(source), "--name", name, "--out", str(repo / name)]
        # No compact graph (CI time): compact attention is tested in test_compact_attention.
        assert main([*command, "--no-compact-attention"]) == 0
        folders[name] = source
    return folders


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path]) -> Iterator[str]:
    with running_server(checkpoints["repository"], intra_op_threads="2") as url:
        yield url


def _decode(array: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype="<f4").reshape(array["shape"])


def _ids(source: Path, text: str) -> list[int]:
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    ids: list[int] = tokenizer.encode(text).ids
    return ids


def _eager(source: Path, ids: list[int]) -> Any:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True
        )


def _assert_equal_to_eager(
    want: Any, hidden: np.ndarray, states: np.ndarray, attention: np.ndarray
) -> None:
    n = want.last_hidden_state.shape[1]
    np.testing.assert_allclose(hidden, want.last_hidden_state[0].numpy(), rtol=0, atol=ATOL)
    assert states.shape == (SIZES["layers"] + 1, n, SIZES["hidden"])
    for layer, state in enumerate(want.hidden_states):
        np.testing.assert_allclose(states[layer], state[0].numpy(), rtol=0, atol=ATOL)
    assert attention.shape == (SIZES["layers"], SIZES["heads"], n, n)
    for layer, maps in enumerate(want.attentions):
        np.testing.assert_allclose(attention[layer], maps[0].numpy(), rtol=0, atol=ATOL)


def test_texts_reach_the_log_buckets(checkpoints: dict[str, Path]) -> None:
    """The longest text spans offsets past ±4 (log buckets) and past the last bucket."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    n = max(len(_ids(checkpoints["deberta"], text)) for text in TEXTS)
    offsets = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    buckets = make_log_bucket_position(offsets, BUCKETS, MAX_RELATIVE)
    assert n > BUCKETS and buckets.abs().max() >= BUCKETS  # clamped at the table's ends


def test_served_deberta_equals_transformers_eager(
    checkpoints: dict[str, Path], server: str
) -> None:
    body = {
        "model": "deberta",
        "inputs": TEXTS,
        "return_attention": True,
        "return_hidden_states": True,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    source = checkpoints["deberta"]
    lengths = {len(_ids(source, text)) for text in TEXTS}
    assert len(lengths) == len(TEXTS)  # ragged: each padded differently in the batch
    for text, item in zip(TEXTS, r.json()["data"], strict=True):
        ids = _ids(source, text)
        want = _eager(source, ids)
        hidden, states = _decode(item["embeddings"]), _decode(item["hidden_states"])
        _assert_equal_to_eager(want, hidden, states, _decode(item["attention"]))


def test_open_inference_protocol_serves_deberta_as_eager(
    checkpoints: dict[str, Path], server: str
) -> None:
    """/v2 (text as BYTES, two texts padded together): the same states and maps."""
    texts = [TEXTS[2], TEXTS[1]]
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": texts}],
        "outputs": [
            {"name": "last_hidden_state"},
            {"name": "hidden_states"},
            {"name": "attentions"},
        ],
    }
    r = httpx.post(f"{server}/v2/models/deberta/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}

    def array(name: str) -> np.ndarray:
        return np.asarray(outputs[name]["data"], np.float32).reshape(outputs[name]["shape"])

    hidden, states, attention = (
        array(name) for name in ("last_hidden_state", "hidden_states", "attentions")
    )
    for row, text in enumerate(texts):
        ids = _ids(checkpoints["deberta"], text)
        n = len(ids)
        want = _eager(checkpoints["deberta"], ids)
        _assert_equal_to_eager(
            want, hidden[row, :n], states[row, :, :n], attention[row, :, :, :n, :n]
        )


@pytest.mark.parametrize(
    "change",
    [
        {"content_to_position": False, "position_to_content": False},
        {"content_to_position": False},
        {"position_to_content": False},
        {"position_buckets": None},
    ],
    ids=["no-position-terms", "no-c2p", "no-p2c", "no-log-buckets"],
)
def test_positive_control_each_position_mechanism_is_needed(
    checkpoints: dict[str, Path], change: dict[str, Any]
) -> None:
    """The imported encoder equals eager within ATOL on the longest text; the same
    weights with a position term or the log buckets dropped miss it by far."""
    from model_export.model import Encoder

    source = checkpoints["deberta"]
    ids = _ids(source, TEXTS[2])
    want = _eager(source, ids)
    loaded = load_checkpoint(source)
    broken = Encoder(dataclasses.replace(loaded.encoder.config, **change))
    broken.load_state_dict(loaded.encoder.state_dict(), strict=True)
    with torch.no_grad():
        embeds = loaded.embeddings(torch.tensor([ids]), torch.zeros(1, len(ids), dtype=torch.long))
        mask = torch.ones(1, len(ids), dtype=torch.long)
        right = loaded.encoder(embeds, mask).attention
        wrong = broken(embeds, mask).attention
    assert right is not None and wrong is not None
    maps = torch.stack(want.attentions, dim=1)  # (1, L, h, T, T)
    assert float((right - maps).abs().max()) <= ATOL
    assert float((wrong - maps).abs().max()) > 100 * ATOL


def test_log_buckets_equal_transformers_at_every_offset() -> None:
    """Every offset i - j in ±600 for v3's 256 buckets (max distance 512) and the test's
    8 (max 24): our rows are transformers' clamp(bucket + k, 0, 2k - 1)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from model_export.config import EncoderConfig
    from model_export.model import RelativeEmbeddings

    seq = 601
    for buckets, distance in ((256, 512), (BUCKETS, MAX_RELATIVE)):
        config = EncoderConfig(
            d_model=32,
            n_heads=4,
            max_seq_len=seq,
            relative_embeddings=buckets,
            position_buckets=buckets,
            relative_max_distance=distance,
            content_to_position=True,
        )
        _, rows = RelativeEmbeddings(config)(seq)
        positions = torch.arange(seq)
        offsets = positions[:, None] - positions[None, :]  # i - j, as transformers builds it
        want = make_log_bucket_position(offsets, buckets, distance).long()
        assert torch.equal(rows, (want + buckets).clamp(0, 2 * buckets - 1))


def test_rerank_equals_cross_encoder(checkpoints: dict[str, Path], server: str) -> None:
    from sentence_transformers import CrossEncoder

    body = {"model": "deberta-reranker", "query": QUERY, "documents": DOCUMENTS}
    answer = httpx.post(f"{server}/v1/rerank", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    model = CrossEncoder(str(checkpoints["deberta-reranker"]), max_length=SIZES["positions"])
    want = model.predict([(QUERY, d) for d in DOCUMENTS])
    got = np.array([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
    np.testing.assert_allclose(got, want, atol=SCORE_ATOL, rtol=0)
    assert np.ptp(want) > 100 * SCORE_ATOL  # scores far enough apart to order
    assert [r["index"] for r in results] == sorted(range(len(want)), key=lambda i: -want[i])


def test_rerank_attention_equals_eager_on_the_pair(
    checkpoints: dict[str, Path], server: str
) -> None:
    """The pair's query-to-document attention, types 0 then 1, positions past ±6."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = checkpoints["deberta-reranker"]
    document = DOCUMENTS[2]
    body = {
        "model": "deberta-reranker",
        "query": QUERY,
        "documents": [document],
        "return_attention": True,
    }
    answer = httpx.post(f"{server}/v1/rerank", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    explanation = answer.json()["results"][0]["explanation"]
    inputs = AutoTokenizer.from_pretrained(str(folder))(QUERY, document, return_tensors="pt")
    assert inputs["token_type_ids"].max() == 1
    q, d = len(explanation["query_tokens"]), len(explanation["document_tokens"])
    assert q + d + 3 == inputs["input_ids"].shape[1] > 2 * CROSS_SPAN
    model = AutoModelForSequenceClassification.from_pretrained(
        str(folder), attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        maps = torch.cat(model(**inputs, output_attentions=True).attentions).numpy()
    want = maps[:, :, 1 : 1 + q, q + 2 : q + 2 + d]  # [CLS] query [SEP] document [SEP]
    got = np.asarray(explanation["attention"], dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


HF = {
    "model_type": "deberta-v2",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 100,
    "relative_attention": True,
    "pos_att_type": "p2c|c2p",
}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"conv_kernel_size": 3}, "conv_kernel_size 3"),
        ({"embedding_size": 16}, "embedding_size 16"),
        ({"attention_head_size": 4}, "attention_head_size 4"),
        ({"position_buckets": 8, "max_relative_positions": 5}, "max_relative_positions 5"),
        ({"pos_att_type": 3}, "pos_att_type"),
    ],
)
def test_deberta_refuses_what_it_cannot_express(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(CheckpointError, match=named):
        config_from_hf(HF | overrides)


def test_deberta_config_reads_as_transformers_does() -> None:
    """v3's config: 256 buckets, max_relative_positions -1 (max_position_embeddings),
    the scale 1/√(3 d_k); without relative attention the scale still counts the terms."""
    v3 = config_from_hf(
        HF
        | {
            "position_buckets": 256,
            "max_relative_positions": -1,
            "norm_rel_ebd": "layer_norm",
            "share_att_key": True,
        }
    )
    assert (v3.relative_embeddings, v3.position_buckets, v3.relative_max_distance) == (
        256,
        256,
        512,
    )
    assert v3.content_to_position and v3.position_to_content and v3.relative_norm
    assert v3.score_scale_factor == 3 and v3.layer_norm_eps == 1e-7
    plain = config_from_hf(HF | {"relative_attention": False, "pos_att_type": ["c2p"]})
    assert plain.relative_embeddings is None and plain.score_scale_factor == 2


def test_deberta_v1_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "deberta", "architectures": ["DebertaModel"]}'
    )
    with pytest.raises(CheckpointError, match="'deberta' \\(DebertaModel\\) is not supported"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("shared", [True, False])
def test_parameters_count_the_disentangled_weights(shared: bool) -> None:
    """EncoderConfig.parameters() counts the relative table, its norm and any separate
    position projections: it equals the encoder's parameters."""
    from model_export.config import EncoderConfig
    from model_export.model import Encoder

    config = EncoderConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        relative_embeddings=8,
        position_buckets=8,
        relative_max_distance=24,
        content_to_position=True,
        position_to_content=True,
        share_position_projections=shared,
        relative_norm=True,
        score_scale_factor=3,
    )
    encoder = Encoder(config)
    assert config.parameters() == sum(p.numel() for p in encoder.parameters())


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"content_to_position": True}, "content_to_position need relative_embeddings"),
        ({"position_buckets": 8}, "position_buckets need relative_embeddings"),
        ({"relative_embeddings": 8, "scoring": "additive"}, "needs dot scoring"),
        ({"relative_embeddings": 8, "position_buckets": 8, "relative_max_distance": 5}, "> "),
        ({"score_scale_factor": 0}, "score_scale_factor"),
        ({"relative_norm": 1}, "relative_norm must be true or false"),
    ],
)
def test_disentangled_switches_are_validated(fields: dict[str, Any], named: str) -> None:
    from model_export.config import ConfigError, EncoderConfig

    with pytest.raises(ConfigError, match=named):
        EncoderConfig(d_model=32, n_heads=4, **fields)


def test_hand_run_graphs_add_the_position_terms() -> None:
    """The graphs that run the layers themselves (BM42's [CLS] row, compact and selected
    attention) pass DeBERTa's relative rows on: the same maps as the encoder's forward."""
    from model_export.compact_attention import CompactAttentionGraph
    from model_export.config import EncoderConfig
    from model_export.graph_modules import SparseGraph
    from model_export.model import Encoder, TokenEmbeddings

    config = EncoderConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        max_seq_len=64,
        relative_embeddings=8,
        position_buckets=8,
        relative_max_distance=24,
        content_to_position=True,
        position_to_content=True,
        relative_norm=True,
        score_scale_factor=3,
    )
    encoder = Encoder(config, seed=1)
    with torch.no_grad():
        for name, param in encoder.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(5.0)
            elif name.endswith("table.weight"):
                param.mul_(50.0)  # std 1
    embeddings = TokenEmbeddings(100, 64, 1, 32, 1e-7)
    ids = torch.randint(5, 100, (2, 30))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, 20:] = 0
    types = torch.zeros_like(ids)
    with torch.no_grad():
        embeds = embeddings(ids, types)
        full = encoder(embeds, mask).attention  # (B, L, h, T, T)
        assert full is not None
        cls = SparseGraph(embeddings, encoder)(ids, types, mask)
        compact = CompactAttentionGraph(encoder)(embeds, mask, torch.zeros(30))
        encoder.relative = lambda seq_len: None  # type: ignore[method-assign]
        without = SparseGraph(embeddings, encoder)(ids, types, mask)  # the control
    want_cls = full[:, -1, :, 0].mean(dim=1) * mask
    torch.testing.assert_close(cls, want_cls, rtol=0, atol=1e-6)
    assert float((without - want_cls).abs().max()) > 100 * 1e-6  # seen: 2.3e-3
    top = full.sort(dim=-1, descending=True).values  # (B, L, h, T, T)
    torch.testing.assert_close(compact[1], top, rtol=0, atol=1e-6)
