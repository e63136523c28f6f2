"""NomicBERT (nomic-embed-text v1/v1.5, transformers' ``NomicBertModel``): BERT's post-LN
order without a position table, SwiGLU (silu(fc12 x) ⊙ fc11 x), one fused ``Wqkv``
split into q, k and v, linears bias-free unless the config says otherwise
(``qkv_proj_bias`` for the attention, ``mlp_fc1_bias``/``mlp_fc2_bias`` for the
feed-forward), and rotary positions with base ``rotary_emb_base`` on the first
``rotary_emb_fraction`` of each head's dims, in halves or interleaved pairs
(``rotary_emb_interleaved``).

config.json comes in two spellings: the original's GPT-2 names (``n_embd``, ``n_head``,
``n_layer``, ``n_inner``, ``n_positions``, ``layer_norm_epsilon``, ``activation_function``
"swiglu") and transformers' (``hidden_size``… , ``rope_parameters``); both are read.
transformers' NomicBertModel rotates every dim whatever ``rotary_emb_fraction`` says
(every published checkpoint has 1.0); the exporter follows the original model and
rotates the fraction.

Weights as ``save_pretrained`` writes them (the original layout): ``emb_ln``,
``encoder.layers.{i}.attn.Wqkv``, ``attn.out_proj``, ``mlp.fc11``/``fc12``/``fc2``,
``norm1``/``norm2``; task heads under ``nomic_bert.``.

Tokenizer: BERT's uncased WordPiece (bert-base-uncased's), [CLS] text [SEP]; the
tests use MiniLM's, the same kind.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import (
    HF_ACTIVATIONS,
    CheckpointError,
    ClassifyKeys,
    Family,
    MlmKeys,
)

# NomicBertConfig's defaults, for config.json files that leave them out.
NOMIC_THETA = 1000.0
NOMIC_POSITIONS = 2048

# Original-config switches the exporter cannot express: refused when set.
UNSUPPORTED = {
    "prenorm": "pre-LN NomicBERT (prenorm true)",
    "parallel_block": "parallel attention and feed-forward (parallel_block true)",
    "use_rms_norm": "RMSNorm (use_rms_norm true)",
    "causal": "causal attention (causal true)",
    "rotary_emb_scale_base": "xPos rotary (rotary_emb_scale_base set)",
    "rotary_scaling_factor": "dynamic NTK rotary scaling (rotary_scaling_factor set)",
}


def math(hf: dict[str, Any]) -> dict[str, Any]:
    """Post-LN, SwiGLU, rotary on the configured fraction, biases as configured."""
    for key, what in UNSUPPORTED.items():
        if hf.get(key):
            raise CheckpointError(f"NomicBERT with {what} is not supported")
    gating = hf.get("activation_function", "swiglu")
    if gating != "swiglu":
        raise CheckpointError(f"NomicBERT with activation_function {gating!r} is not supported")
    params = hf.get("rope_parameters") or {}
    if params.get("rope_type", "default") != "default":
        raise CheckpointError(f"rope_type {params['rope_type']!r} is not supported, only default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(
            "rope_parameters' partial_rotary_factor is not supported (transformers' "
            "NomicBertModel ignores it): use rotary_emb_fraction"
        )
    theta = params.get("rope_theta", hf.get("rotary_emb_base", NOMIC_THETA))
    fraction = hf.get("rotary_emb_fraction", 1.0)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise CheckpointError(f"rotary_emb_fraction must be a number in (0, 1], got {fraction!r}")
    act = hf.get("hidden_act", "silu") if "activation_function" not in hf else "silu"
    return {
        "activation": HF_ACTIVATIONS.get(act, act),
        "rotary": "interleaved" if hf.get("rotary_emb_interleaved") else "half",
        "rotary_theta": float(theta),
        "rotary_fraction": float(fraction),
        "glu": True,
        "attention_bias": bool(hf.get("qkv_proj_bias", False)),
        "mlp_in_bias": bool(hf.get("mlp_fc1_bias", False)),
        "mlp_bias": bool(hf.get("mlp_fc2_bias", False)),
    }


FAMILY = Family(
    model_types=("nomic_bert",),
    prefixes=("nomic_bert.", "model."),
    layers="encoder.layers",
    layer_keys={
        "attn.out_proj": "attn.out_proj",
        "attn_norm": "norm1",
        "ffn.down": "mlp.fc2",
        "ffn_norm": "norm2",
    },
    embedding_keys={
        "word": "embeddings.word_embeddings",
        "token_type": "embeddings.token_type_embeddings",
        "norm": "emb_ln",
    },
    math=math,
    hf_names={
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "intermediate_size": "n_inner",
        "max_position_embeddings": "n_positions",
        "layer_norm_eps": "layer_norm_epsilon",
    },
    positions=False,
    default_positions=NOMIC_POSITIONS,
    fused_qkv="attn.Wqkv",
    # NomicBertMLP: silu(gate_proj x) ⊙ up_proj x, gate_proj = fc12, up_proj = fc11.
    glu_parts=(("mlp.fc12", 0, 1), ("mlp.fc11", 0, 1)),
    classify=ClassifyKeys(("nomic_bert.pooler.dense", "pooler.dense"), "classifier", "tanh"),
    mlm=MlmKeys(
        "cls.predictions.transform.dense",
        "cls.predictions.transform.layer_norm",
        "cls.predictions.decoder",
        ("cls.predictions.bias", "cls.predictions.decoder.bias"),
        ("nomic_bert.embeddings.word_embeddings.weight",),
    ),
    tokenizer="WordPiece (bert-base-uncased's), [CLS] text [SEP]",
)
