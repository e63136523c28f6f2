"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's layers, positions offset by the padding
id + 1, one token type.

Tokenizer: byte-level BPE (RoBERTa) or SentencePiece Unigram (XLM-R, CamemBERT),
<s> text </s>; the tests train small ones of each kind.
"""

from __future__ import annotations

from model_export.families.base import (
    BERT_EMBEDDING_KEYS,
    BERT_LAYER_KEYS,
    ClassifyKeys,
    Family,
    MlmKeys,
)

CLASSIFY = ClassifyKeys(("classifier.dense",), "classifier.out_proj", "tanh")


def lm_head(prefix: str) -> MlmKeys:
    """RoBERTa's ``lm_head``, its decoder tied to ``<prefix>``'s word embeddings."""
    return MlmKeys(
        "lm_head.dense",
        "lm_head.layer_norm",
        "lm_head.decoder",
        ("lm_head.bias", "lm_head.decoder.bias"),
        (f"{prefix}.embeddings.word_embeddings.weight",),
        activation="gelu",  # fixed in RobertaLMHead
    )


FAMILY = Family(
    model_types=("roberta", "xlm-roberta", "camembert"),
    prefixes=("roberta.", "model."),
    layers="encoder.layer",
    layer_keys=BERT_LAYER_KEYS,
    embedding_keys=BERT_EMBEDDING_KEYS,
    offset_positions=True,
    classify=CLASSIFY,
    mlm=lm_head("roberta"),
    tokenizer="byte-level BPE or SentencePiece Unigram, <s> text </s>",
)
