"""MPNet: BERT's post-LN layers under its own keys, RoBERTa's offset positions, no token
types, and a relative position bias by buckets shared by all layers.

Tokenizer: WordPiece (<s> text </s> as its special tokens); all-mpnet-base-v2's real one.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import BERT_EMBEDDING_KEYS, BERT_LAYER_KEYS, CheckpointError, Family
from model_export.families.roberta import CLASSIFY, lm_head

# transformers' MPNetEncoder computes buckets with these, whatever the config says.
MPNET_BUCKETS = 32
MPNET_MAX_DISTANCE = 128


def math(hf: dict[str, Any]) -> dict[str, Any]:
    table = int(hf.get("relative_attention_num_buckets", MPNET_BUCKETS))
    if table != MPNET_BUCKETS:
        raise CheckpointError(
            f"relative_attention_num_buckets {table} is not supported: transformers' "
            f"MPNet computes {MPNET_BUCKETS} buckets whatever the table holds"
        )
    return {"relative_buckets": MPNET_BUCKETS, "relative_max_distance": MPNET_MAX_DISTANCE}


FAMILY = Family(
    model_types=("mpnet",),
    prefixes=("mpnet.", "model."),
    layers="encoder.layer",
    layer_keys=BERT_LAYER_KEYS
    | {
        "attn.q_proj": "attention.attn.q",
        "attn.k_proj": "attention.attn.k",
        "attn.v_proj": "attention.attn.v",
        "attn.out_proj": "attention.attn.o",
        "attn_norm": "attention.LayerNorm",
    },
    embedding_keys={k: v for k, v in BERT_EMBEDDING_KEYS.items() if k != "token_type"},
    math=math,
    offset_positions=True,
    extra_keys={"relative_bias.table.weight": "encoder.relative_attention_bias.weight"},
    padding_id=1,  # MPNetEmbeddings.padding_idx
    classify=CLASSIFY,
    mlm=lm_head("mpnet"),
    tokenizer="WordPiece with <s> text </s>",
)
