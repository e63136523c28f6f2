"""What the exporter knows of one architecture family, and the parts families share.

A family module (``model_export/families/<name>.py``) defines one :class:`Family`:
the ``model_type`` values it imports, how its ``config.json`` reads (``math``: the
encoder's switches it sets, refusing what it cannot express), where its weights
live (the key map, checked both ways by ``hf_import.map_state_dict``), its task
heads' keys and its tokenizer notes. ``families/__init__.py`` names each family
in one registry line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_export.st_folder import CheckpointError

if TYPE_CHECKING:
    from model_export.task_adapters import TaskAdapters

__all__ = [
    "BERT_EMBEDDING_KEYS",
    "BERT_LAYER_KEYS",
    "HF_ACTIVATIONS",
    "KNOWN_UNUSED",
    "CheckpointError",
    "ClassifyKeys",
    "Family",
    "LmHeadKeys",
    "MlmKeys",
    "same_width_embeddings",
]

# Checkpoint keys read on purpose and left out of the model.
KNOWN_UNUSED = (
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "pooler.dense.weight",
    "pooler.dense.bias",
)
# Hugging Face activation names -> ours (model.FeedForward's).
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}

# Our encoder parameter -> Hugging Face key, for layer {i} (BERT's names).
BERT_LAYER_KEYS = {
    "attn.q_proj": "attention.self.query",
    "attn.k_proj": "attention.self.key",
    "attn.v_proj": "attention.self.value",
    "attn.out_proj": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn.up": "intermediate.dense",
    "ffn.down": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
BERT_EMBEDDING_KEYS = {
    "word": "embeddings.word_embeddings",
    "position": "embeddings.position_embeddings",
    "token_type": "embeddings.token_type_embeddings",
    "norm": "embeddings.LayerNorm",
}


@dataclass(frozen=True)
class ClassifyKeys:
    """A ``*ForSequenceClassification`` head: logits = out(norm(act(dense(pooled))))."""

    dense: tuple[str, ...]  # candidates, first found wins (BERT's pooler has two names)
    out: str
    activation: str  # ours (heads.activate), or "config": the config's classifier_activation
    norm: str | None = None
    # ModernBERT's options from config.json: classifier_pooling (cls|mean), classifier_bias.
    configurable: bool = False
    activation_key: str = "classifier_activation"  # config.json's, for activation "config"


@dataclass(frozen=True)
class MlmKeys:
    """A masked-LM head (read as SPLADE): dense, act, norm, decoder over the vocabulary."""

    dense: str
    norm: str
    decoder: str
    decoder_bias: tuple[str, ...]
    tied: tuple[str, ...]  # the word embeddings the decoder is usually tied to
    activation: str | None = None  # fixed in the model's code; None: read from config.json


@dataclass(frozen=True)
class LmHeadKeys:
    """A causal LM's head over the vocabulary (read as a yes/no reranker): ``weight``
    [vocab, d], or the word embeddings it is tied to (config.json's tie_word_embeddings)."""

    weight: str
    tied: str


def no_switches(hf: dict[str, Any]) -> dict[str, Any]:
    """A post-LN BERT: nothing beyond the common fields."""
    return {}


@dataclass(frozen=True)
class Family:
    """Where one family keeps its weights, how its config reads, and its heads."""

    model_types: tuple[str, ...]  # config.json's model_type values it imports
    prefixes: tuple[str, ...]  # around the base model in task-head checkpoints
    layers: str  # the layer list's key: "encoder.layer" -> encoder.layer.{i}.<key>
    layer_keys: Mapping[str, str]  # ours -> theirs
    embedding_keys: dict[str, str]  # without "token_type": the family has none (zeros)
    # config.json -> EncoderConfig fields beyond sizes, activation and positions (the
    # math switches this family sets); raises CheckpointError for what it cannot express.
    math: Callable[[dict[str, Any]], dict[str, Any]] = no_switches
    offset_positions: bool = False  # positions start at padding id + 1 (RoBERTa)
    hf_names: dict[str, str] = dataclasses.field(default_factory=dict)  # ours -> config's
    # Encoder parameters outside the layers: ours -> theirs (MPNet's relative bias table).
    extra_keys: dict[str, str] = dataclasses.field(default_factory=dict)
    padding_id: int | None = None  # fixed in the model's code, whatever config.json says
    positions: bool = True  # a learned absolute position table (rotary families: none)
    embedding_norm: bool = True  # a norm after the lookup (LLM-style families: none)
    default_positions: int = 512  # max_position_embeddings when config.json leaves it out
    # One key per layer holding q, k and v stacked (ModernBERT's Wqkv), split on import.
    fused_qkv: str | None = None
    # A gated feed-forward kept in parts, per layer: our ffn.up's rows stacked from
    # (key, part, of parts) each, the activated half first, then the multiplied one
    # (GTE's up_gate_proj holds [up; gate], NomicBERT's fc11 and fc12 are two keys).
    glu_parts: tuple[tuple[str, int, int], ...] = ()
    # A stored sinusoidal table the model recomputes (RoFormer's): checked, not loaded.
    rotary_table: str | None = None
    classify: ClassifyKeys | None = None
    mlm: MlmKeys | None = None
    lm_head: LmHeadKeys | None = None
    known_unused: tuple[str, ...] = KNOWN_UNUSED
    tokenizer: str = ""  # notes: what its tokenizer is and what the tests use for it
    # config.json's key whose false drops the position table (DeBERTa's
    # position_biased_input; absent: true).
    positions_key: str | None = None
    # type_vocab_size when config.json leaves it out. A checkpoint with none (DeBERTa's
    # type_vocab_size 0) gets a zero table of ``zero_type_rows`` rows: its tokenizers
    # still mark a pair's second text 1, and the model ignores it.
    default_type_vocab: int = 2
    zero_type_rows: int = 1
    # The word vectors times √hidden_size, that scale rounded to the stored table's dtype
    # as transformers computes it (Gemma's scaled embeddings).
    scaled_embeddings: bool = False
    # Task adapters beside the checkpoint (Jina v3's PEFT LoRA folders): (folder,
    # config.json) -> them (model_export.task_adapters), None when it has none.
    task_adapters: Callable[[Path, dict[str, Any]], TaskAdapters | None] | None = None
    # Other names an adapter may give a layer's projection ("layers.{i}.self_attn.q_proj")
    # -> ours ("attn.q_proj"), beside the layer keys and the fused q/k/v.
    adapter_aliases: dict[str, str] = dataclasses.field(default_factory=dict)


def same_width_embeddings(kind: str, hf: dict[str, Any]) -> None:
    """ELECTRA and RoFormer may project narrower embeddings up: not supported."""
    width = hf.get("embedding_size") or hf["hidden_size"]
    if width != hf["hidden_size"]:
        raise CheckpointError(
            f"{kind} with embeddings of another width than the encoder (embedding_size "
            f"{hf['embedding_size']} != hidden_size {hf['hidden_size']}) is not supported"
        )
