"""Gemma3's text model (``Gemma3TextModel``, model_type ``gemma3_text``), as EmbeddingGemma
uses it: ``use_bidirectional_attention`` true.

Word vectors times √hidden_size (in the checkpoint's dtype); pre-norm layers with Gemma's
RMSNorm x̂ · (1 + w) and sandwich norms (``input_layernorm`` before attention,
``post_attention_layernorm`` on its output before the residual sum, then
``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` around the feed-forward);
per-head q/k norms before rotary; grouped-query attention with its own ``head_dim``;
scores times ``query_pre_attn_scalar``^-0.5; tanh-approximated GeGLU
(``down(gelu_tanh(gate(x)) ⊙ up(x))``); a final norm.

Layers follow ``layer_types``: "sliding_attention" layers see a window, the others every
key. transformers builds the bidirectional window from config.json's ``sliding_window`` w
as w // 2 + 1 and lets token i see j when |i - j| < w // 2 + 1 (masking_utils' sliding
causal mask or'ed with ``_bidirectional_window_overlay``), so the radius is w // 2; a
causal Gemma3 (``use_bidirectional_attention`` false) sees j ≤ i with i - j < w: causal,
radius w - 1. Sliding layers rotate with ``rope_local_base_freq`` (rope_parameters'
"sliding_attention"), the others with ``rope_theta`` and, when set, linear scaling
(rope_type "linear": positions divided by the factor); other rope types, attention logit
softcapping and partial rotary are refused by name.

Tokenizer: Gemma's SentencePiece BPE (byte fallback), <bos> text <eos> in EmbeddingGemma;
the tests train a small byte-level BPE with those specials.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import CheckpointError, Family

# Gemma3TextConfig's defaults, for config.json files that leave them out (save_pretrained
# writes only what differs from them).
DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}
LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_types(hf: dict[str, Any]) -> list[str]:
    """``layer_types``, or the older ``sliding_window_pattern`` n: every n-th layer full
    (layers n - 1, 2n - 1, …), as Gemma3TextConfig derives it."""
    n_layers = int(hf["num_hidden_layers"])
    n = int(hf["sliding_window_pattern"])
    types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % n else "full_attention" for i in range(n_layers)
    ]
    if len(types) != n_layers:
        raise CheckpointError(f"layer_types has {len(types)} entries for {n_layers} layers")
    if set(types) - set(LAYER_TYPES):
        raise CheckpointError(f"layer_types {types} is not supported: only {LAYER_TYPES}")
    return list(types)


def rope(hf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each layer type's rotary parameters, as Gemma3TextConfig.convert_rope_params_to_dict
    reads them: ``rope_parameters`` per layer type, else the older flat keys (``rope_theta``
    and ``rope_scaling`` for full attention, ``rope_local_base_freq`` for sliding)."""
    params = dict(hf.get("rope_parameters") or {})
    if set(params) - set(LAYER_TYPES):
        raise CheckpointError(
            f"rope_parameters {params} is not supported: one entry per layer type {LAYER_TYPES}"
        )
    full = dict(params.get("full_attention") or {"rope_type": "default"})
    full.update(hf.get("rope_scaling") or {})
    full.setdefault("rope_theta", hf["rope_theta"])
    sliding = dict(params.get("sliding_attention") or {"rope_type": "default"})
    sliding.setdefault("rope_theta", hf["rope_local_base_freq"])
    return {"full_attention": full, "sliding_attention": sliding}


def rope_kind(params: dict[str, Any], layer_type: str, allowed: tuple[str, ...]) -> str:
    kind = str(params.get("rope_type", params.get("type", "default")))
    if kind not in allowed:
        raise CheckpointError(
            f"rope_type {kind!r} ({layer_type}) is not supported, only {' and '.join(allowed)}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial_rotary_factor is not supported")
    return kind


def window(hf: dict[str, Any], causal: bool) -> int:
    """The radius of the sliding layers' window (see the module's docstring)."""
    w = hf["sliding_window"]
    if w is None:
        raise CheckpointError("gemma3_text with sliding_attention layers needs sliding_window")
    radius = int(w) - 1 if causal else int(w) // 2
    if radius < 1:
        raise CheckpointError(f"sliding_window {w} leaves no key beside the query's own")
    return radius


def math(hf: dict[str, Any]) -> dict[str, Any]:
    if "hidden_activation" not in hf:  # else the common fields would read BERT's gelu
        raise CheckpointError("config.json lacks 'hidden_activation'")
    hf = DEFAULTS | {k: v for k, v in hf.items() if v is not None or k not in DEFAULTS}
    if hf["attn_logit_softcapping"] is not None:
        raise CheckpointError(
            f"attn_logit_softcapping {hf['attn_logit_softcapping']} is not supported "
            "(the scores would be capped at ±it by a tanh)"
        )
    causal = not hf["use_bidirectional_attention"]
    types = layer_types(hf)
    params = rope(hf)
    full_kind = rope_kind(params["full_attention"], "full_attention", ("default", "linear"))
    rope_kind(params["sliding_attention"], "sliding_attention", ("default",))
    sliding = "sliding_attention" in types
    globals_ = [i for i, kind in enumerate(types) if kind == "full_attention"]
    heads = int(hf["num_attention_heads"])
    return {
        "norm": "rms_plus_one",
        "norm_bias": False,
        "norm_placement": "pre",
        "sandwich_norms": True,
        "layer_norm_eps": float(hf["rms_norm_eps"]),
        "causal": causal,
        "kv_heads": int(hf["num_key_value_heads"] or heads),
        "head_size": int(hf["head_dim"]),
        "qk_norm": True,
        "score_scale": float(hf["query_pre_attn_scalar"]) ** -0.5,
        "glu": True,
        "attention_bias": bool(hf["attention_bias"]),
        "mlp_bias": False,
        "rotary": "half",
        "rotary_theta": float(params["full_attention"]["rope_theta"]),
        "local_rotary_theta": (
            float(params["sliding_attention"]["rope_theta"]) if sliding else None
        ),
        "rotary_linear_factor": (
            float(params["full_attention"]["factor"]) if full_kind == "linear" else None
        ),
        "window": window(hf, causal) if sliding else None,
        "global_layers": tuple(globals_) if sliding else None,
    }


FAMILY = Family(
    model_types=("gemma3_text",),
    prefixes=("model.",),
    layers="layers",
    layer_keys={
        "attn.q_proj": "self_attn.q_proj",
        "attn.k_proj": "self_attn.k_proj",
        "attn.v_proj": "self_attn.v_proj",
        "attn.out_proj": "self_attn.o_proj",
        "attn.q_norm": "self_attn.q_norm",
        "attn.k_norm": "self_attn.k_norm",
        "attn_norm": "input_layernorm",
        "attn_out_norm": "post_attention_layernorm",
        "ffn.down": "mlp.down_proj",
        "ffn_norm": "pre_feedforward_layernorm",
        "ffn_out_norm": "post_feedforward_layernorm",
    },
    # SwiGLU/GeGLU: act(gate_proj x) ⊙ up_proj x, stacked into our ffn.up.
    glu_parts=(("mlp.gate_proj", 0, 1), ("mlp.up_proj", 0, 1)),
    embedding_keys={"word": "embed_tokens"},
    math=math,
    hf_names={"hidden_act": "hidden_activation"},
    extra_keys={"final_norm.weight": "norm.weight"},
    positions=False,
    embedding_norm=False,
    default_positions=131_072,
    known_unused=("lm_head.weight",),
    tokenizer="SentencePiece BPE with byte fallback, <bos> text <eos> (EmbeddingGemma)",
    scaled_embeddings=True,
)
