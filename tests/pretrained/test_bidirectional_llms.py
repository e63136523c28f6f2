"""Bidirectional LLM-style encoders, served and checked against transformers eager:
Gemma3's text model as EmbeddingGemma runs it (``use_bidirectional_attention``) and
EuroBERT (a bidirectional Llama).

No package here ships their weights, so each is a small random-initialised checkpoint
that ``transformers`` builds and saves (norm weights random, query and key weights
scaled up so that the maps are far from uniform), with a byte-level BPE trained here
with the family's special tokens. Gemma3: 3 layers typed [sliding, sliding, full], a
``sliding_window`` of 8 (transformers lets token i see j when |i - j| < 8 // 2 + 1: the
test texts are longer, and the test checks the window cuts them), GQA (4 query heads on
2 key/value heads of 16 dimensions, not 32 / 4), ``query_pre_attn_scalar`` 24 (not
head_dim), local rotary base 100 and linear rope scaling 4 in the full layer. EuroBERT:
2 layers with GQA.

Each is exported by the CLI (``--no-compact-attention``: CI time) and served; the
answers over ``/v1/encode`` (a ragged batch) and ``/v2`` must equal the model's own
``attn_implementation="eager"`` outputs on each text alone: last hidden state, every
hidden state and every attention map within 1e-4. Positive controls, in-process: each
Gemma3 mechanism removed (the window widened to the whole text, the score scale, the
linear rope factor, the local rotary base, the sandwich norms, the scaled lookup) makes
the comparison fail.
A causal Gemma3 and a EuroBertForMaskedLM checkpoint (EuroBERT's published kind) are
checked in PyTorch.

An EmbeddingGemma-shaped sentence-transformers folder (Transformer, mean Pooling, Dense
32 -> 64 and 64 -> 32 without bias or activation, Normalize, EmbeddingGemma's prompts),
built and saved by sentence-transformers: served ``/v1/embeddings`` with ``prompt_name``
equals ``SentenceTransformer(folder).encode(..., prompt_name=...)`` within 1e-5.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from model_export.config import ConfigError, EncoderConfig
from model_export.hf_import import CheckpointError, config_from_hf, load_checkpoint
from model_export.model import Encoder
from tests.conftest import running_server

ATOL = 1e-4
ST_ATOL = 1e-5
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FF, POSITIONS = 32, 4, 2, 16, 64, 64
GEMMA_LAYERS = 3
GEMMA_TYPES = ["sliding_attention", "sliding_attention", "full_attention"]
SLIDING_WINDOW = 8  # config.json's: token i sees j when |i - j| <= 8 // 2 in sliding layers
RADIUS = SLIDING_WINDOW // 2
EUROBERT_LAYERS = 2
TEXTS = [
    "Bidirectional decoders embed text with every token in view.",
    "Short one.",
    "Naïve café: windows of ±4 tokens in the sliding layers, 東京 too.",
]
CORPUS = [*TEXTS, "the quick brown fox jumps over the lazy dog " * 4, "task: search result"] * 20
# EmbeddingGemma's prompts (a few of its config_sentence_transformers.json's).
PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "Clustering": "task: clustering | query: ",
}
# Each family's special tokens (ids 0..3 in this order) and its template.
SPECIALS = {
    "gemma3": (["<pad>", "<eos>", "<bos>", "<unk>"], "<bos> $A <eos>"),
    "eurobert": (
        ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<unk>"],
        "<|begin_of_text|> $A <|end_of_text|>",
    ),
}


def _tokenizer(family: str) -> Tokenizer:
    """A byte-level BPE with the family's specials, wrapping each text as it does."""
    specials, template = SPECIALS[family]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    ends = (template.split()[0], template.split()[-1])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(end, specials.index(end)) for end in ends]
    )
    return tokenizer


def _gemma3(vocab: int, *, causal: bool = False) -> torch.nn.Module:
    from transformers import Gemma3TextConfig, Gemma3TextModel

    config = Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=FF,
        num_hidden_layers=GEMMA_LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        query_pre_attn_scalar=24,
        layer_types=GEMMA_TYPES,
        sliding_window=SLIDING_WINDOW,
        max_position_embeddings=POSITIONS,
        use_bidirectional_attention=not causal,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model: torch.nn.Module = Gemma3TextModel(config)
    return model


def _eurobert(vocab: int) -> torch.nn.Module:
    from transformers import EuroBertConfig, EuroBertModel

    config = EuroBertConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=FF,
        num_hidden_layers=EUROBERT_LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=POSITIONS,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        mask_token_id=2,
    )
    model: torch.nn.Module = EuroBertModel(config)
    return model


def _randomise(model: torch.nn.Module, family: str) -> torch.nn.Module:
    """Norm weights random (Gemma's around 0: its norms scale by 1 + w), queries and keys
    scaled up: a random init leaves attention near-uniform, where a slip would hide."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0 if family == "gemma3" else 1.0, 0.3)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(5.0)
    return model


def _checkpoint(directory: Path, family: str, *, causal: bool = False) -> Path:
    """A random-initialised ``family`` checkpoint and its tokenizer, as saved for
    transformers (tokenizer.json and tokenizer_config.json)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = _tokenizer(family)
    torch.manual_seed(0)
    vocab = tokenizer.get_vocab_size()
    model = _gemma3(vocab, causal=causal) if family == "gemma3" else _eurobert(vocab)
    _randomise(model, family).save_pretrained(directory)
    specials = SPECIALS[family][0]
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=specials[0] if family == "gemma3" else specials[1],
        eos_token=specials[1],
        bos_token=specials[2] if family == "gemma3" else specials[0],
        unk_token="<unk>",
    ).save_pretrained(directory)
    return directory


def _embedding_gemma(hf_dir: Path, out: Path) -> Path:
    """EmbeddingGemma's module stack, saved by sentence-transformers itself."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(1)
    model = SentenceTransformer(
        modules=[
            Transformer(str(hf_dir)),
            Pooling(HIDDEN, pooling_mode="mean"),
            Dense(HIDDEN, 2 * HIDDEN, bias=False, activation_function=torch.nn.Identity()),
            Dense(2 * HIDDEN, HIDDEN, bias=False, activation_function=torch.nn.Identity()),
            Normalize(),
        ],
        prompts=PROMPTS,
        device="cpu",
    )
    model.save(str(out))
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each model's source folder and their exports, in one model repository."""
    from model_export.cli import main

    made = {
        "gemma3": _checkpoint(tmp_path_factory.mktemp("ckpt-gemma3"), "gemma3"),
        "eurobert": _checkpoint(tmp_path_factory.mktemp("ckpt-eurobert"), "eurobert"),
    }
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        st_root = tmp_path_factory.mktemp("st-embeddinggemma")
        made["embeddinggemma"] = _embedding_gemma(made["gemma3"], st_root / "embeddinggemma")
    repo = tmp_path_factory.mktemp("bidirectional-llms")
    for name, source in made.items():
        command = ["--checkpoint", str(source), "--name", name, "--out", str(repo / name)]
        assert main([*command, "--no-compact-attention"]) == 0  # CI time; not what is tested
    made["repository"] = repo
    return made


@pytest.fixture(scope="module")
def server(sources: dict[str, Path]) -> Iterator[str]:
    with running_server(sources["repository"], intra_op_threads="2") as url:
        yield url


def _decode(array: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype="<f4").reshape(array["shape"])


def _ids(source: Path, text: str) -> list[int]:
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    return list(tokenizer.encode(text).ids)


def _eager(source: Path, ids: list[int]) -> Any:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True
        )


def _check_window(want: Any, attention: np.ndarray, n: int) -> bool:
    """In the sliding layers (0, 1) keys past ±RADIUS get weight exactly 0 from eager and
    from us, in the full layer (2) they do not: True when the window cuts this text."""
    if n <= RADIUS + 1:
        return False
    offset = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])  # (T, T)
    outside = offset > RADIUS
    for layer, kind in enumerate(GEMMA_TYPES):
        eager = want.attentions[layer][0].numpy()[:, outside]
        if kind == "sliding_attention":
            assert (eager == 0).all() and (attention[layer][:, outside] == 0).all()
        else:
            assert (eager > 0).all()
    return True


LAYERS = {"gemma3": GEMMA_LAYERS, "eurobert": EUROBERT_LAYERS}


@pytest.mark.parametrize("family", list(LAYERS))
def test_served_family_equals_transformers_eager(
    family: str, sources: dict[str, Path], server: str
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
    layers, cut = LAYERS[family], 0
    for text, item in zip(TEXTS, r.json()["data"], strict=True):
        ids = _ids(sources[family], text)
        want = _eager(sources[family], ids)
        n = len(ids)
        assert len(item["tokens"]) == n
        np.testing.assert_allclose(
            _decode(item["embeddings"]), want.last_hidden_state[0].numpy(), rtol=0, atol=ATOL
        )
        states = _decode(item["hidden_states"])
        assert states.shape == (layers + 1, n, HIDDEN) and len(want.hidden_states) == layers + 1
        for layer, state in enumerate(want.hidden_states):
            np.testing.assert_allclose(states[layer], state[0].numpy(), rtol=0, atol=ATOL)
        attention = _decode(item["attention"])
        assert attention.shape == (layers, HEADS, n, n) and len(want.attentions) == layers
        for layer, maps in enumerate(want.attentions):
            np.testing.assert_allclose(attention[layer], maps[0].numpy(), rtol=0, atol=ATOL)
        if family == "gemma3":
            cut += _check_window(want, attention, n)
    assert family != "gemma3" or cut >= 2


@pytest.mark.parametrize("family", list(LAYERS))
def test_open_inference_protocol_serves_each_family_as_eager(
    family: str, sources: dict[str, Path], server: str
) -> None:
    """/v2 (text as BYTES, the ragged texts in one request): the same last hidden state,
    hidden states and maps over each text's tokens."""
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}],
        "outputs": [
            {"name": "last_hidden_state"},
            {"name": "hidden_states"},
            {"name": "attentions"},
        ],
    }
    r = httpx.post(f"{server}/v2/models/{family}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}

    def array(name: str) -> np.ndarray:
        return np.asarray(outputs[name]["data"], np.float32).reshape(outputs[name]["shape"])

    hidden, states, maps = array("last_hidden_state"), array("hidden_states"), array("attentions")
    for b, text in enumerate(TEXTS):
        ids = _ids(sources[family], text)
        n, want = len(ids), _eager(sources[family], ids)
        np.testing.assert_allclose(
            hidden[b, :n], want.last_hidden_state[0].numpy(), rtol=0, atol=ATOL
        )
        eager_states = np.stack([s[0].numpy() for s in want.hidden_states])
        np.testing.assert_allclose(states[b, :, :n], eager_states, rtol=0, atol=ATOL)
        eager_maps = np.stack([m[0].numpy() for m in want.attentions])
        np.testing.assert_allclose(maps[b, :, :, :n, :n], eager_maps, rtol=0, atol=ATOL)


def _largest_difference(checkpoint: Any, want: Any, ids: list[int]) -> float:
    """Our encoder's largest difference from eager over hidden states and maps."""
    with torch.no_grad():
        ids_t = torch.tensor([ids])
        embeds = checkpoint.embeddings(ids_t, torch.zeros_like(ids_t))
        got = checkpoint.encoder(embeds, torch.ones_like(ids_t), hidden_states=True)
    assert got.hidden_states is not None and got.attention is not None
    states = torch.stack(want.hidden_states, dim=1)  # (1, L + 1, T, d)
    maps = torch.stack(want.attentions, dim=1)  # (1, L, h, T, T)
    return max(
        float((got.hidden_states - states).abs().max()), float((got.attention - maps).abs().max())
    )


# Each Gemma3 mechanism removed: the config's switch, or the lookup's scale.
REMOVED: dict[str, dict[str, Any]] = {
    "window widened to the whole text": {"window": POSITIONS},
    "score scale": {"score_scale": None},
    "linear rope factor": {"rotary_linear_factor": None},
    "local rotary base": {"local_rotary_theta": None},
    "sandwich norms": {"sandwich_norms": False},
    "scaled lookup": {},
}


@pytest.mark.parametrize("removed", list(REMOVED))
def test_each_gemma3_mechanism_removed_fails_the_comparison(
    removed: str, sources: dict[str, Path]
) -> None:
    """The positive controls: with each mechanism the model matches eager to 1e-4, without
    it the same weights are off by far more."""
    source = sources["gemma3"]
    ids = _ids(source, TEXTS[2])  # the longest: cut by the window
    assert len(ids) > 2 * RADIUS + 1
    want = _eager(source, ids)
    checkpoint = load_checkpoint(source)
    assert _largest_difference(checkpoint, want, ids) <= ATOL
    state = checkpoint.encoder.state_dict()
    config = dataclasses.replace(checkpoint.encoder.config, **REMOVED[removed])
    checkpoint.encoder = Encoder(config)
    checkpoint.encoder.load_state_dict(state, strict=removed != "sandwich norms")
    if removed == "scaled lookup":
        checkpoint.embeddings.scale = None
    assert _largest_difference(checkpoint, want, ids) > 100 * ATOL


def test_causal_gemma3_equals_eager(tmp_path: Path) -> None:
    """use_bidirectional_attention false: causal, each sliding layer seeing i - 7 <= j <= i
    (transformers' sliding_window 8, exclusive)."""
    source = _checkpoint(tmp_path, "gemma3", causal=True)
    checkpoint = load_checkpoint(source)
    config = checkpoint.encoder.config
    assert config.causal and config.window == SLIDING_WINDOW - 1
    ids = _ids(source, TEXTS[2])
    assert len(ids) > SLIDING_WINDOW
    want = _eager(source, ids)
    assert _largest_difference(checkpoint, want, ids) <= ATOL
    n = len(ids)
    behind = np.arange(n)[:, None] - np.arange(n)[None, :]  # i - j
    assert (want.attentions[0][0].numpy()[:, behind >= SLIDING_WINDOW] == 0).all()
    assert (want.attentions[2][0].numpy()[:, behind >= SLIDING_WINDOW] > 0).all()


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_embedding_gemma_folder_equals_sentence_transformers(
    prompt_name: str, sources: dict[str, Path], server: str
) -> None:
    """Mean pooling, two Dense layers, Normalize, the named prompt: sentence-transformers'
    own vectors."""
    from sentence_transformers import SentenceTransformer

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        st_model = SentenceTransformer(str(sources["embeddinggemma"]), device="cpu")
    want = np.asarray(st_model.encode(TEXTS, prompt_name=prompt_name))
    assert want.shape == (len(TEXTS), HIDDEN)
    body = {"model": "embeddinggemma", "input": TEXTS, "prompt_name": prompt_name}
    r = httpx.post(f"{server}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = np.array([item["embedding"] for item in r.json()["data"]])
    np.testing.assert_allclose(got, want, rtol=0, atol=ST_ATOL)
    # The control: without the prompt the vectors differ, so the prompt did apply.
    bare = np.asarray(st_model.encode(TEXTS))
    assert not np.allclose(got, bare, atol=1e-3)


def test_gemma3_config_reads_as_transformers_does() -> None:
    """EmbeddingGemma's config.json keys (the older flat rope keys): radius 512 // 2, the
    full layers every sixth, √d scale; the config's parameter count is the encoder's."""
    hf = {
        "model_type": "gemma3_text",
        "hidden_size": 48,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "num_hidden_layers": 12,
        "intermediate_size": 96,
        "hidden_activation": "gelu_pytorch_tanh",
        "vocab_size": 100,
        "max_position_embeddings": 2048,
        "use_bidirectional_attention": True,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": None,
        "query_pre_attn_scalar": 256,
    }
    config = config_from_hf(hf)
    assert (config.window, config.global_layers) == (256, (5, 11))
    assert [config.layer_rotary(i) for i in (4, 5)] == [(10_000.0, None), (1_000_000.0, None)]
    assert (config.score_scale, config.activation, config.causal) == (1 / 16, "gelu_tanh", False)
    assert config.parameters() == sum(p.numel() for p in Encoder(config).parameters())
    linear = config_from_hf(hf | {"rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert [linear.layer_rotary(i) for i in (4, 5)] == [(10_000.0, None), (1_000_000.0, 8.0)]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        (
            {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
            "rope_type 'linear' \\(sliding_attention\\)",
        ),
        ({"layer_types": ["chunked_attention", "full_attention"]}, "layer_types"),
        ({"layer_types": ["full_attention"]}, "1 entries for 2 layers"),
        ({"sliding_window": 1}, "sliding_window 1"),
        ({"hidden_activation": None}, "hidden_activation"),
        (
            {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
            "'gemma3' \\(Gemma3ForConditionalGeneration\\)",
        ),
    ],
)
def test_gemma3_refuses_what_it_cannot_express(overrides: dict[str, Any], named: str) -> None:
    hf = {
        "model_type": "gemma3_text",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
        "hidden_activation": "gelu_pytorch_tanh",
        "use_bidirectional_attention": True,
    }
    hf = {k: v for k, v in (hf | overrides).items() if v is not None}
    with pytest.raises(CheckpointError, match=named):
        config_from_hf(hf)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sandwich_norms": True}, "sandwich_norms only applies to pre-LN"),
        ({"score_scale": 0.0}, "score_scale must be a finite number > 0"),
        ({"rotary_linear_factor": 2.0}, "rotary_linear_factor scales the rotation"),
        ({"global_layers": [0]}, "global_layers sets the layers outside the window"),
        ({"global_layers": [6], "window": 4}, "global_layers must list layer indices in 0..5"),
        ({"global_layers": [2, 1], "window": 4}, "global_layers must be increasing"),
        (
            {"global_layers": [1], "window": 4, "global_every": 2},
            "global_layers and global_every",
        ),
    ],
)
def test_gemma3_config_fields_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EncoderConfig(**overrides)


def test_a_eurobert_masked_lm_checkpoint_imports_its_base_model(tmp_path: Path) -> None:
    """EuroBERT's published checkpoints are EuroBertForMaskedLM: ``model.`` prefixed keys
    beside ``lm_head``, which the encoder leaves out."""
    from transformers import EuroBertForMaskedLM

    base = _eurobert(300)
    model = EuroBertForMaskedLM(base.config)
    model.model.load_state_dict(_randomise(base, "eurobert").state_dict())
    model.save_pretrained(tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.head is None and not checkpoint.encoder.config.causal
    ids = [0, 17, 33, 250, 99, 120, 7, 8, 9, 1]
    eager = EuroBertForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        want = eager.model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True
        )
    assert _largest_difference(checkpoint, want, ids) <= ATOL


def test_gemma3_attention_norms_equal_a_direct_computation(
    sources: dict[str, Path], server: str
) -> None:
    """Value norms with grouped-query attention and sandwich norms: α_ij · ‖v_j W_O^h‖,
    v_j from transformers' own v_proj on the layer's normed input (``input_layernorm``),
    query head h reading key/value head h // 2, W_O^h head h's slice of o_proj (1e-4 of
    each map's largest value). The post-attention norm comes after, as BERT's post-LN."""
    from transformers import AutoModel

    text = TEXTS[2]
    body = {
        "model": "gemma3",
        "inputs": [text],
        "return_attention": True,
        "attention": {"measure": "norms"},
        "return_embeddings": False,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = _decode(r.json()["data"][0]["attention"])
    source = sources["gemma3"]
    model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    out = _eager(source, _ids(source, text))
    with torch.no_grad():
        for index, layer in enumerate(model.layers):
            x = layer.input_layernorm(out.hidden_states[index])  # (1, T, d)
            v = layer.self_attn.v_proj(x).view(1, -1, KV_HEADS, HEAD_DIM)  # (1, T, kv, d_k)
            v = v.repeat_interleave(HEADS // KV_HEADS, dim=2)  # (1, T, h, d_k)
            w_o = layer.self_attn.o_proj.weight.view(HIDDEN, HEADS, HEAD_DIM)  # (d, h, d_k)
            norms = torch.einsum("bthk,dhk->bhtd", v, w_o).norm(dim=-1)  # (1, h, T)
            want = (out.attentions[index] * norms[:, :, None, :])[0].numpy()  # (h, T, T)
            scale = np.abs(want).max(axis=(-2, -1), keepdims=True)
            assert np.all(np.abs(got[index] - want) <= 1e-4 * scale)


def test_the_scaled_lookup_rounds_its_scale_to_the_tables_dtype() -> None:
    """As transformers computes it: √3072 = 55.4256 in float32, 55.5 for a bfloat16 table
    (its comment's example); families without a scaled lookup have none."""
    from model_export.families import FAMILIES
    from model_export.hf_import import embedding_scale

    gemma, hf = FAMILIES["gemma3_text"], {"hidden_size": 3072}
    bf16 = {"model.embed_tokens.weight": torch.zeros(1, dtype=torch.bfloat16)}
    assert embedding_scale(hf, bf16, gemma) == 55.5
    fp32 = {"embed_tokens.weight": torch.zeros(1)}
    assert embedding_scale(hf, fp32, gemma) == float(np.float32(3072**0.5)) != 55.5
    assert embedding_scale(hf, fp32, FAMILIES["eurobert"]) is None
