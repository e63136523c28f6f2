"""ELECTRA's discriminator: BERT's layers and keys under ``electra.``; embeddings as
wide as the encoder only (no ``embeddings_project``).

Tokenizer: WordPiece, as BERT's.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import (
    BERT_EMBEDDING_KEYS,
    BERT_LAYER_KEYS,
    ClassifyKeys,
    Family,
    same_width_embeddings,
)


def math(hf: dict[str, Any]) -> dict[str, Any]:
    same_width_embeddings("electra", hf)
    return {}


FAMILY = Family(
    model_types=("electra",),
    prefixes=("electra.", "model."),
    layers="encoder.layer",
    layer_keys=BERT_LAYER_KEYS,
    embedding_keys=BERT_EMBEDDING_KEYS,
    math=math,
    classify=ClassifyKeys(("classifier.dense",), "classifier.out_proj", "gelu"),
    tokenizer="WordPiece, [CLS] text [SEP]",
)
