"""EuroBERT (``EuroBertModel``): a bidirectional Llama.

The Llama lineage's layers (families/llama.py: pre-norm RMSNorm, a final norm,
grouped-query attention, rotary halves, SwiGLU with gate and up stacked into our GLU's
``up``, no biases unless ``attention_bias``/``mlp_bias``) with attention that sees every
real token: no causal mask, no sliding window. Its keys are Llama's; the masked-LM
checkpoints' ``lm_head`` is not part of the encoder.

Tokenizer: Llama-3's byte-level BPE, <|begin_of_text|> text <|end_of_text|>; the tests
train a small byte-level BPE with those specials.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from model_export.families import llama
from model_export.families.base import CheckpointError

# EuroBertConfig's defaults where they differ from what llama.math assumes.
DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-5}


def math(hf: dict[str, Any]) -> dict[str, Any]:
    """Llama's switches, without the causal mask."""
    if "hidden_act" not in hf:  # else the common fields would read BERT's gelu
        raise CheckpointError("config.json lacks 'hidden_act'")
    return llama.math(DEFAULTS | hf) | {"causal": False}


FAMILY = dataclasses.replace(
    llama.FAMILY,
    model_types=("eurobert",),
    math=math,
    default_positions=8192,
    known_unused=("lm_head.weight", "lm_head.bias"),
    tokenizer="byte-level BPE (Llama-3's), <|begin_of_text|> text <|end_of_text|>",
)
