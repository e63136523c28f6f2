"""DistilBERT: BERT's post-LN math under its own key and config names, no token types.

Tokenizer: WordPiece, as BERT's.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import (
    BERT_EMBEDDING_KEYS,
    CheckpointError,
    ClassifyKeys,
    Family,
    MlmKeys,
)


def math(hf: dict[str, Any]) -> dict[str, Any]:
    if hf.get("sinusoidal_pos_embds"):
        raise CheckpointError("DistilBERT's sinusoidal positions are not supported")
    return {}


FAMILY = Family(
    model_types=("distilbert",),
    prefixes=("distilbert.", "model."),
    layers="transformer.layer",
    layer_keys={
        "attn.q_proj": "attention.q_lin",
        "attn.k_proj": "attention.k_lin",
        "attn.v_proj": "attention.v_lin",
        "attn.out_proj": "attention.out_lin",
        "attn_norm": "sa_layer_norm",
        "ffn.up": "ffn.lin1",
        "ffn.down": "ffn.lin2",
        "ffn_norm": "output_layer_norm",
    },
    embedding_keys={k: v for k, v in BERT_EMBEDDING_KEYS.items() if k != "token_type"},
    math=math,
    hf_names={
        "hidden_size": "dim",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_layers",
        "intermediate_size": "hidden_dim",
        "hidden_act": "activation",
    },
    classify=ClassifyKeys(("pre_classifier",), "classifier", "relu"),
    mlm=MlmKeys(
        "vocab_transform",
        "vocab_layer_norm",
        "vocab_projector",
        ("vocab_projector.bias",),
        ("distilbert.embeddings.word_embeddings.weight",),
    ),
    tokenizer="WordPiece, [CLS] text [SEP]",
)
