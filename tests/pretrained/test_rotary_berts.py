"""The rotary BERTs: GTE's "new" architecture (transformers' ``GteModel``) and NomicBERT
(``NomicBertModel``), served and checked against transformers eager.

As in test_families.py, each is a small random-initialised checkpoint that
``transformers`` builds and saves with ``save_pretrained`` (the original checkpoints'
layout: fused qkv, [up; gate] or fc11/fc12), with MiniLM's WordPiece, exported by the
CLI and served from one repository. The answers over ``/v1/encode`` (the texts padded
together, ragged lengths) and ``/v2`` must equal the model's own
``attn_implementation="eager"`` outputs on each text alone: last hidden state, every
hidden state and every attention map within 1e-4 (fp32, 2 layers).

The rotation is made to matter (query and key weights scaled up, random norms and
biases) and each rotary switch has a positive control, the same comparison failing
without it: GTE's rope scaling (YaRN and linear here, both changing the angles at
every position of the test texts) dropped; NomicBERT's ``rotary_emb_fraction`` 0.5
(and its interleaved pairs) replaced by rotating every dim. transformers'
NomicBertModel rotates every dim whatever ``rotary_emb_fraction`` says, so the
partial checkpoints' reference is that model with its rotation restricted to the
fraction, as the original NomicBERT (flash-attn's ``apply_rotary_emb``) does it:
frequencies over the first d_r = int(d_k · fraction) dims, the rest passed through.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from model_export.hf_import import CheckpointError, config_from_hf, load_checkpoint, minilm_l6_dir
from tests.conftest import running_server

ATOL = 1e-4
SIZES = {"hidden": 32, "heads": 4, "layers": 2, "ff": 64, "positions": 64}
TEXTS = [
    "The attention maps of every family are served.",
    "Short one.",
    "Naïve café: rotary positions turn queries and keys, 东京 too, by how far apart they are.",
]
# Scaled RoPE that changes the angles at every position of the texts above.
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
}
LINEAR = {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0}
# name -> (transformers class, config overrides, config.json keys written after saving)
MODELS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # gte-multilingual-base's layout: one token type
    "gte": ("Gte", {"type_vocab_size": 1, "rope_parameters": YARN}, {}),
    # gte-base-en-v1.5's: no token types
    "gte-en": ("Gte", {"type_vocab_size": 0, "rope_parameters": LINEAR}, {}),
    "nomic": ("NomicBert", {}, {}),
    "nomic-partial": ("NomicBert", {}, {"rotary_emb_fraction": 0.5}),
    "nomic-interleaved": (
        "NomicBert",
        {},
        {"rotary_emb_fraction": 0.5, "rotary_emb_interleaved": True},
    ),
}


def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(minilm_l6_dir() / "tokenizer.json"))
    tokenizer.no_padding()  # (MiniLM's file pads to 128, as sentence-transformers saved it)
    return tokenizer


def _checkpoint(directory: Path, name: str) -> None:
    """``MODELS[name]``, random-initialised, as ``save_pretrained`` writes it."""
    _save(directory, *MODELS[name])


def _save(directory: Path, kind: str, overrides: dict[str, Any], stated: dict[str, Any]) -> None:
    import transformers

    tokenizer = _tokenizer()
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        pad_token_id=0,  # MiniLM's [PAD]
        **overrides,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{kind}Model")(config)
    # Random LayerNorm weights and biases, so a slip between norms or biases cannot pass;
    # query and key weights scaled up, as a random init leaves attention near-uniform
    # (a wrong rotation would hide in it).
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name.lower():
                param.normal_(1.0, 0.1)
            elif param_name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(5.0)
            elif param_name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    if stated:
        path = directory / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | stated))
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each checkpoint and its export, in one model repository."""
    from model_export.cli import main

    repo = tmp_path_factory.mktemp("rotary-berts")
    checkpoints = {}
    for name in MODELS:
        source = tmp_path_factory.mktemp(f"ckpt-{name}")
        _checkpoint(source, name)
        command = ["--checkpoint", str(source), "--name", name, "--out", str(repo / name)]
        assert main([*command, "--no-compact-attention"]) == 0
        checkpoints[name] = source
    checkpoints["repository"] = repo
    return checkpoints


@pytest.fixture(scope="module")
def server(models: dict[str, Path]) -> Iterator[str]:
    with running_server(models["repository"], intra_op_threads="2") as url:
        yield url


def _decode(array: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype="<f4").reshape(array["shape"])


def _original_rotation(fraction: float, interleaved: bool) -> Callable[..., Any]:
    """The original NomicBERT's rotation in transformers' ``apply_rotary_pos_emb`` slot:
    cos and sin cover the first d_r dims (halves [c, c], or interleaved pairs from the
    first half's angles); those rotate, the others pass."""

    def turn(x: torch.Tensor) -> torch.Tensor:
        if interleaved:  # (a, b) pairs of neighbours -> (-b, a)
            return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def apply(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)  # (B, 1, T, d_r)
        if interleaved:
            half = cos.shape[-1] // 2
            cos = cos[..., :half].repeat_interleave(2, dim=-1)
            sin = sin[..., :half].repeat_interleave(2, dim=-1)
        d_r = cos.shape[-1]

        def rotate(x: torch.Tensor) -> torch.Tensor:
            rotated = x[..., :d_r] * cos + turn(x[..., :d_r]) * sin
            return torch.cat((rotated, x[..., d_r:]), dim=-1)

        return rotate(q), rotate(k)

    return apply


def _eager(source: Path, ids: list[int], monkeypatch: pytest.MonkeyPatch) -> Any:
    """transformers' eager outputs for one text; NomicBERT's rotation restricted to the
    fraction its config.json states (see the module docstring)."""
    from transformers import AutoModel
    from transformers.models.nomic_bert import modeling_nomic_bert

    model = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    stated = json.loads((source / "config.json").read_text())
    fraction = stated.get("rotary_emb_fraction", 1.0)
    interleaved = bool(stated.get("rotary_emb_interleaved"))
    if fraction != 1.0 or interleaved:
        head_dim = SIZES["hidden"] // SIZES["heads"]
        d_r = int(head_dim * fraction)
        theta = model.config.rope_parameters["rope_theta"]
        model.rotary_emb.inv_freq = 1.0 / (theta ** (torch.arange(0, d_r, 2).float() / d_r))
        rotation = _original_rotation(fraction, interleaved)
        monkeypatch.setattr(modeling_nomic_bert, "apply_rotary_pos_emb", rotation)
    with torch.no_grad():
        return model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True
        )


def _assert_equal(
    want: Any, hidden: np.ndarray, states: np.ndarray | None, attention: np.ndarray
) -> None:
    """One text's last hidden state, hidden states (when given) and maps equal ``want``."""
    np.testing.assert_allclose(hidden, want.last_hidden_state[0].numpy(), rtol=0, atol=ATOL)
    if states is not None:
        assert len(states) == len(want.hidden_states) == SIZES["layers"] + 1
        for layer, state in enumerate(want.hidden_states):
            np.testing.assert_allclose(states[layer], state[0].numpy(), rtol=0, atol=ATOL)
    assert len(attention) == len(want.attentions) == SIZES["layers"]
    for layer, maps in enumerate(want.attentions):
        np.testing.assert_allclose(attention[layer], maps[0].numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", list(MODELS))
def test_served_rotary_bert_equals_transformers_eager(
    name: str, models: dict[str, Path], server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {
        "model": name,
        "inputs": TEXTS,
        "return_attention": True,
        "return_hidden_states": True,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    tokenizer = _tokenizer()
    lengths = set()
    for text, item in zip(TEXTS, r.json()["data"], strict=True):
        encoding = tokenizer.encode(text)
        assert item["tokens"] == encoding.tokens
        n = len(encoding.ids)
        lengths.add(n)
        states = _decode(item["hidden_states"])
        attention = _decode(item["attention"])
        assert states.shape == (SIZES["layers"] + 1, n, SIZES["hidden"])
        assert attention.shape == (SIZES["layers"], SIZES["heads"], n, n)
        want = _eager(models[name], encoding.ids, monkeypatch)
        _assert_equal(want, _decode(item["embeddings"]), states, attention)
    assert len(lengths) == len(TEXTS)  # ragged: padded together in the batch


@pytest.mark.parametrize("name", list(MODELS))
def test_open_inference_protocol_serves_each_rotary_bert_as_eager(
    name: str, models: dict[str, Path], server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v2 (text as BYTES, two texts of different lengths in one request): the same
    embeddings, hidden states and maps, each answer re-padded to the longer text."""
    texts = [TEXTS[2], TEXTS[0]]
    outputs = [{"name": "last_hidden_state"}, {"name": "hidden_states"}, {"name": "attentions"}]
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": texts}],
        "outputs": outputs,
    }
    r = httpx.post(f"{server}/v2/models/{name}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = {o["name"]: o for o in r.json()["outputs"]}

    def array(output: str) -> np.ndarray:
        item = answer[output]
        return np.asarray(item["data"], np.float32).reshape(item["shape"])

    hidden, states, attention = (array(o["name"]) for o in outputs)
    tokenizer = _tokenizer()
    for row, text in enumerate(texts):
        ids = tokenizer.encode(text).ids
        n = len(ids)
        want = _eager(models[name], ids, monkeypatch)
        _assert_equal(want, hidden[row, :n], states[row, :, :n], attention[row, :, :, :n, :n])
        assert not hidden[row, n:].any()  # the shorter text's padding: zeros


def _exported_as(source: Path, tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Any:
    """The encoder the exporter builds from ``source`` with its config.json changed."""
    for path in source.iterdir():
        shutil.copy(path, tmp_path / path.name)
    config = json.loads((source / "config.json").read_text())
    change(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return load_checkpoint(tmp_path)


def _encode(checkpoint: Any, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = torch.tensor([ids])
    with torch.no_grad():
        embeds = checkpoint.embeddings(x, torch.zeros_like(x))
        out = checkpoint.encoder(embeds, torch.ones_like(x), hidden_states=True)
    return out.hidden[0].numpy(), out.hidden_states[0].numpy(), out.attention[0].numpy()


def _without_rope_scaling(config: dict[str, Any]) -> None:
    theta = config["rope_parameters"]["rope_theta"]
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}


def _all_dims_rotated(config: dict[str, Any]) -> None:
    config.pop("rotary_emb_fraction")


def _half_pairs(config: dict[str, Any]) -> None:
    config.pop("rotary_emb_interleaved")


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("gte", _without_rope_scaling),
        ("gte-en", _without_rope_scaling),
        ("nomic-partial", _all_dims_rotated),
        ("nomic-interleaved", _all_dims_rotated),
        ("nomic-interleaved", _half_pairs),
    ],
)
def test_each_rotary_switch_is_needed(
    name: str,
    change: Callable[[dict[str, Any]], None],
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Positive controls: the exporter's encoder equals eager as exported (what the
    served graphs were validated against), and fails the same comparison with the
    rope scaling dropped, every dim rotated, or halves in place of interleaved pairs."""
    ids = _tokenizer().encode(TEXTS[2]).ids
    want = _eager(models[name], ids, monkeypatch)
    _assert_equal(want, *_encode(load_checkpoint(models[name]), ids))
    with pytest.raises(AssertionError):
        _assert_equal(want, *_encode(_exported_as(models[name], tmp_path, change), ids))


def test_gte_without_token_types_has_no_table_and_the_multilingual_layout_has_one(
    models: dict[str, Path],
) -> None:
    """type_vocab_size 0 (gte-base-en-v1.5): no token-type key, a zero type embedding."""
    english = load_checkpoint(models["gte-en"]).embeddings.token_type.weight
    assert english.shape[0] == 1 and not english.any()
    assert load_checkpoint(models["gte"]).embeddings.token_type.weight.any()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"model_type": "gte", "rope_parameters": {"rope_type": "ntk", "factor": 2.0}}, "'ntk'"),
        (
            {
                "model_type": "gte",
                "rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 4},
            },
            "longrope",
        ),
        ({"model_type": "gte", "logn_attention_scale": True}, "logn_attention_scale"),
        ({"model_type": "nomic_bert", "rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
        ({"model_type": "nomic_bert", "prenorm": True}, "prenorm"),
        ({"model_type": "nomic_bert", "activation_function": "gelu"}, "'gelu'"),
        ({"model_type": "nomic_bert", "rotary_emb_fraction": 0.0}, "rotary_emb_fraction"),
    ],
)
def test_rotary_berts_refuse_what_they_cannot_express(
    overrides: dict[str, Any], named: str
) -> None:
    hf = {
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
    }
    with pytest.raises(CheckpointError, match=named):
        config_from_hf(hf | overrides)


def test_nomic_reads_the_original_config_names() -> None:
    """nomic-embed-text-v1.5's config.json spelling (GPT-2 names, flash-attn switches)."""
    original = {
        "model_type": "nomic_bert",
        "n_embd": 768,
        "n_head": 12,
        "n_layer": 12,
        "n_inner": 3072,
        "n_positions": 8192,
        "layer_norm_epsilon": 1e-12,
        "activation_function": "swiglu",
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "rotary_scaling_factor": None,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "prenorm": False,
        "type_vocab_size": 2,
        "vocab_size": 30528,
    }
    config = config_from_hf(original)
    assert (config.d_model, config.n_heads, config.n_layers, config.d_ff) == (768, 12, 12, 3072)
    assert (config.max_seq_len, config.activation, config.glu) == (8192, "silu", True)
    assert (config.rotary, config.rotary_theta, config.rotary_fraction) == ("half", 1000.0, 1.0)
    assert not (config.attention_bias or config.mlp_bias or config.up_bias)


def _head_model(kind: str, task: str) -> torch.nn.Module:
    """A small ``*ForSequenceClassification`` or ``*ForMaskedLM``, norms and biases far
    from their init (as test_heads_export.py builds its families')."""
    import transformers

    from tests.pretrained.test_heads_export import VOCAB

    suffix = "ForSequenceClassification" if task == "classify" else "ForMaskedLM"
    labels = {"num_labels": 3, "id2label": {0: "a", 1: "b", 2: "c"}} if task == "classify" else {}
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=VOCAB,
        hidden_size=SIZES["hidden"],
        num_attention_heads=SIZES["heads"],
        num_hidden_layers=SIZES["layers"],
        intermediate_size=SIZES["ff"],
        max_position_embeddings=SIZES["positions"],
        pad_token_id=1,
        **({"rope_parameters": YARN} if kind == "Gte" else {}),
        **labels,
    )
    torch.manual_seed(0)
    model: torch.nn.Module = getattr(transformers, kind + suffix)(config)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name.lower():
                param.normal_(1.0, 0.1)
            elif param_name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(5.0)
            elif param_name.endswith("bias"):
                param.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("kind", ["Gte", "NomicBert"])
@pytest.mark.parametrize("task", ["classify", "splade"])
def test_rotary_bert_heads_equal_transformers(tmp_path: Path, kind: str, task: str) -> None:
    """The pooler + classifier and the masked-LM head (read as SPLADE) of each family,
    exported by the CLI: the head graph on a padded ragged batch equals eager on each
    sequence alone (logits; SPLADE: max over tokens of log(1 + relu(MLM logits)))."""
    from model_export import graph_io
    from model_export.cli import main
    from tests.pretrained.test_heads_export import _head_run, _sequences

    model = _head_model(kind, task)
    source, out = tmp_path / "checkpoint", tmp_path / "model"
    model.save_pretrained(source)
    assert main(["--checkpoint", str(source), "--out", str(out), "--exporter", "torchscript"]) == 0
    graph = graph_io.GRAPH_SCORES if task == "classify" else graph_io.GRAPH_SPLADE
    got = _head_run(out, graph, _sequences())
    wants = []
    with torch.no_grad():
        for sequence in _sequences():
            logits = model(input_ids=torch.from_numpy(sequence)[None]).logits[0]
            wants.append(logits if task == "classify" else torch.log1p(torch.relu(logits)).amax(0))
    np.testing.assert_allclose(got, torch.stack(wants).numpy(), atol=ATOL, rtol=0)


ROPE_KINDS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": LINEAR,
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": YARN,
    "yarn-mscale": YARN | {"mscale": 2.0, "mscale_all_dim": 1.0, "beta_fast": 16.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "proportional": {
        "rope_type": "proportional",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
    },
}


@pytest.mark.parametrize("kind", list(ROPE_KINDS))
def test_each_rope_kind_equals_gte_eager_in_pytorch(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kind transformers' GteModel computes and the exporter supports: the encoder
    ``load_checkpoint`` builds (what the export validates its graphs against) equals eager.
    ``dynamic`` rescales only past max_position_embeddings, never served: default there."""
    _save(tmp_path, "Gte", {"rope_parameters": ROPE_KINDS[kind]}, {})
    checkpoint = load_checkpoint(tmp_path)
    config = checkpoint.encoder.config
    assert (config.rotary_inv_freq is None) == (kind in ("default", "dynamic"))
    assert (config.rotary_scale != 1.0) == kind.startswith("yarn")
    ids = _tokenizer().encode(TEXTS[2]).ids
    _assert_equal(_eager(tmp_path, ids, monkeypatch), *_encode(checkpoint, ids))


@pytest.mark.parametrize("name", ["gte", "nomic-partial"])
def test_attention_norms_equal_a_direct_computation(
    name: str, models: dict[str, Path], server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Value norms as the model used them: α_ij · ‖v_j W_O^h‖, v_j from transformers' own
    v_proj (GTE's biased, NomicBERT's bias-free) on the layer's input (post-LN: the
    previous hidden state), W_O^h head h's columns of o_proj; values are not rotated.
    Within 1e-4 of each map's largest value."""
    from transformers import AutoModel

    text = TEXTS[2]
    body = {
        "model": name,
        "inputs": [text],
        "return_attention": True,
        "attention": {"measure": "norms"},
        "return_embeddings": False,
        "encoding_format": "base64",
    }
    r = httpx.post(f"{server}/v1/encode", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = _decode(r.json()["data"][0]["attention"])
    ids = _tokenizer().encode(text).ids
    out = _eager(models[name], ids, monkeypatch)
    model = AutoModel.from_pretrained(models[name], attn_implementation="eager").eval()
    heads, d = SIZES["heads"], SIZES["hidden"]
    with torch.no_grad():
        for index, layer in enumerate(model.layers):
            attn = layer.self_attn
            assert (attn.v_proj.bias is not None) == (name == "gte")
            v = attn.v_proj(out.hidden_states[index]).view(1, -1, heads, d // heads)
            w_o = attn.o_proj.weight.view(d, heads, d // heads)  # (d, h, d_k)
            norms = torch.einsum("bthk,dhk->bhtd", v, w_o).norm(dim=-1)  # (1, h, T)
            want = (out.attentions[index] * norms[:, :, None, :])[0].numpy()  # (h, T, T)
            scale = np.abs(want).max(axis=(-2, -1), keepdims=True)
            assert np.all(np.abs(got[index] - want) <= 1e-4 * scale)


def test_glu_parts_are_checked_both_ways(models: dict[str, Path], tmp_path: Path) -> None:
    """A missing half of NomicBERT's SwiGLU and a bias its config says it lacks are named."""
    from safetensors.torch import load_file, save_file

    source = models["nomic"]
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    state = load_file(str(source / "model.safetensors"))
    del state["encoder.layers.1.mlp.fc12.weight"]
    state["encoder.layers.0.mlp.fc11.bias"] = torch.zeros(SIZES["ff"])
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    assert "missing encoder.layers.1.mlp.fc12.weight" in str(info.value)
    assert "unexpected keys: encoder.layers.0.mlp.fc11.bias" in str(info.value)
