"""GTE's "new" architecture (transformers' ``GteModel``: gte-multilingual-base,
gte-base-en-v1.5, arctic-embed-m-v2.0): BERT's post-LN order without a position table,
every query and key rotated by position in halves (ModernBERT's convention) with the
``rope_parameters`` it states (scaled kinds: model_export.rope_scaling), one fused
``qkv_proj`` split into q, k and v, biased attention, and a gated feed-forward
act(gate) ⊙ up with bias-free input projections and a biased output one. Token types
as configured; ``type_vocab_size`` 0 (gte-base-en-v1.5) has none.

Weights as ``save_pretrained`` writes them (the original checkpoints' layout):
``encoder.layer.{i}.attention.qkv_proj``, ``mlp.up_gate_proj`` ([up; gate]), ``attn_ln``,
``mlp_ln``; task heads under ``gte.`` (``new.`` in the original repositories).

Tokenizer: the checkpoint's own (XLM-R's SentencePiece for the multilingual ones,
BERT's WordPiece for gte-base-en-v1.5); the tests use MiniLM's WordPiece.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import (
    CheckpointError,
    ClassifyKeys,
    Family,
    MlmKeys,
)

# GteConfig's defaults, for config.json files that leave them out.
GTE_THETA = 160_000.0
GTE_POSITIONS = 8192


def rope_parameters(hf: dict[str, Any]) -> dict[str, Any]:
    """``rope_parameters``, or the legacy ``rope_scaling`` (+ ``rope_theta``), as transformers
    standardises them."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", GTE_THETA))
    return params


def math(hf: dict[str, Any]) -> dict[str, Any]:
    """Post-LN, rotary halves with the stated scaling, gated feed-forward (act on the gate)."""
    if hf.get("logn_attention_scale"):
        raise CheckpointError(
            "GTE with logn_attention_scale (scores scaled by log n) is not supported"
        )
    params = rope_parameters(hf)
    if (
        params.get("partial_rotary_factor", 1.0) != 1.0
        and params.get("rope_type") != "proportional"
    ):
        raise CheckpointError(
            "partial_rotary_factor is not supported: transformers' GteModel rotates whole heads"
        )
    theta = float(params["rope_theta"])
    head_dim = int(hf["hidden_size"]) // int(hf["num_attention_heads"])
    positions = int(hf.get("max_position_embeddings", GTE_POSITIONS))
    from model_export.rope_scaling import scaled_rope  # torch: kept out of the CLI's import

    inv_freq, scale = scaled_rope(params, head_dim=head_dim, theta=theta, max_positions=positions)
    return {
        "rotary": "half",
        "rotary_theta": theta,
        "rotary_inv_freq": inv_freq,
        "rotary_scale": scale,
        "glu": True,
        "mlp_in_bias": False,  # gate_proj and up_proj: bias=False; down_proj: bias=True
    }


FAMILY = Family(
    model_types=("gte",),
    prefixes=("gte.", "new.", "model."),
    layers="encoder.layer",
    layer_keys={
        "attn.out_proj": "attention.o_proj",
        "attn_norm": "attn_ln",
        "ffn.down": "mlp.down_proj",
        "ffn_norm": "mlp_ln",
    },
    embedding_keys={
        "word": "embeddings.word_embeddings",
        "token_type": "embeddings.token_type_embeddings",
        "norm": "embeddings.LayerNorm",
    },
    math=math,
    positions=False,
    default_positions=GTE_POSITIONS,
    fused_qkv="attention.qkv_proj",
    # up_gate_proj = [up; gate] and GteMLP computes act(gate) ⊙ up: gate half first.
    glu_parts=(("mlp.up_gate_proj", 1, 2), ("mlp.up_gate_proj", 0, 2)),
    classify=ClassifyKeys(
        ("gte.pooler.dense", "new.pooler.dense", "pooler.dense"), "classifier", "tanh"
    ),
    mlm=MlmKeys(
        "lm_head.dense",
        "lm_head.norm",
        "lm_head.decoder",
        ("lm_head.decoder.bias",),
        ("gte.embeddings.word_embeddings.weight", "new.embeddings.word_embeddings.weight"),
        activation="gelu",  # fixed in GteLMHead
    ),
    tokenizer="the checkpoint's own (SentencePiece or WordPiece), [CLS]/<s> text [SEP]/</s>",
)
