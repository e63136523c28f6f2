"""RoFormer: BERT's post-LN layers and keys, no position table: every query and key
rotated by position, in RoFormer's interleaved pairs. Its stored sinusoidal table is
checked against ours, not loaded.

Tokenizer: WordPiece (the Chinese checkpoints' own is jieba + WordPiece, not supported
by ``tokenizers``: export with a tokenizer.json the folder holds).
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import (
    BERT_EMBEDDING_KEYS,
    BERT_LAYER_KEYS,
    CheckpointError,
    Family,
    same_width_embeddings,
)

# transformers' RoFormer rotates with this base, whatever the config says.
ROFORMER_THETA = 10000.0


def math(hf: dict[str, Any]) -> dict[str, Any]:
    same_width_embeddings("roformer", hf)
    if hf.get("rotary_value"):
        raise CheckpointError(
            "RoFormer with rotary_value true (values rotated too) is not supported"
        )
    return {"rotary": "interleaved", "rotary_theta": ROFORMER_THETA}


FAMILY = Family(
    model_types=("roformer",),
    prefixes=("roformer.", "model."),
    layers="encoder.layer",
    layer_keys=BERT_LAYER_KEYS,
    embedding_keys={k: v for k, v in BERT_EMBEDDING_KEYS.items() if k != "position"},
    math=math,
    positions=False,
    rotary_table="encoder.embed_positions.weight",
    tokenizer="WordPiece, [CLS] text [SEP]",
)
