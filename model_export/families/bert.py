"""BERT: post-LN layers, learned absolute positions and token types.

Tokenizer: WordPiece ([CLS] text [SEP]); all-MiniLM-L6-v2's real one in the tests.
"""

from __future__ import annotations

from model_export.families.base import (
    BERT_EMBEDDING_KEYS,
    BERT_LAYER_KEYS,
    ClassifyKeys,
    Family,
    MlmKeys,
)

FAMILY = Family(
    model_types=("bert",),
    prefixes=("bert.", "model."),
    layers="encoder.layer",
    layer_keys=BERT_LAYER_KEYS,
    embedding_keys=BERT_EMBEDDING_KEYS,
    classify=ClassifyKeys(("bert.pooler.dense", "pooler.dense"), "classifier", "tanh"),
    mlm=MlmKeys(
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.decoder",
        ("cls.predictions.bias", "cls.predictions.decoder.bias"),
        ("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ),
    tokenizer="WordPiece, [CLS] text [SEP]",
)
