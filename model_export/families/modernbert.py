"""ModernBERT: pre-LN, bias-free by default, GeGLU, one fused ``Wqkv`` split into q, k
and v, rotary halves with a global and a local base, and local layers that see
|i - j| <= local_attention // 2 (every n-th layer global, starting at layer 0).

Tokenizer: byte-level BPE (OLMo's), [CLS] text [SEP]; the tests train a small one.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import CheckpointError, ClassifyKeys, Family, MlmKeys

# ModernBertConfig's defaults, for config.json files that leave them out.
DEFAULTS: dict[str, Any] = {
    "norm_eps": 1e-5,
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160_000.0,
    "local_rope_theta": 10_000.0,
    "max_position_embeddings": 8192,
}


def global_every(layer_types: list[str], n_layers: int) -> int:
    """The n of "every n-th layer global" in ``layer_types``."""
    for n in range(1, n_layers + 1):
        pattern = ["full_attention" if i % n == 0 else "sliding_attention" for i in range(n_layers)]
        if layer_types == pattern:
            return n
    raise CheckpointError(
        f"layer_types {layer_types} is not supported: only every n-th layer global, "
        "starting at layer 0, the others sliding"
    )


def rope_theta(hf: dict[str, Any], layer_type: str, legacy: str) -> float:
    """One layer type's rotary base from ``rope_parameters`` (or the older flat key)."""
    params = (hf.get("rope_parameters") or {}).get(layer_type) or {}
    if params.get("rope_type", "default") != "default":
        raise CheckpointError(
            f"rope_type {params['rope_type']!r} ({layer_type}) is not supported, only default"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial_rotary_factor is not supported")
    return float(params.get("rope_theta", hf.get(legacy, DEFAULTS[legacy])))


def math(hf: dict[str, Any]) -> dict[str, Any]:
    """Pre-LN, layer 0 without its attention norm, GeGLU, rotary halves, every n-th layer
    global and the others windowed."""
    hf = DEFAULTS | hf
    n_layers = int(hf["num_hidden_layers"])
    n = int(hf["global_attn_every_n_layers"])  # older config.json files: no layer_types
    layer_types = hf.get("layer_types") or [
        "sliding_attention" if i % n else "full_attention" for i in range(n_layers)
    ]
    if len(layer_types) != n_layers:
        raise CheckpointError(f"layer_types has {len(layer_types)} entries for {n_layers} layers")
    if set(layer_types) - {"full_attention", "sliding_attention"}:
        raise CheckpointError(f"layer_types {layer_types} is not supported")
    local = "sliding_attention" in layer_types
    window = int(hf["local_attention"]) // 2 if local else None  # transformers' sliding_window
    mixed = local and "full_attention" in layer_types
    return {
        "norm_placement": "pre",
        "first_attn_norm": False,
        "glu": True,
        "attention_bias": bool(hf["attention_bias"]),
        "mlp_bias": bool(hf["mlp_bias"]),
        "norm_bias": bool(hf["norm_bias"]),
        "layer_norm_eps": float(hf["norm_eps"]),
        "rotary": "half",
        "rotary_theta": rope_theta(hf, "full_attention", "global_rope_theta"),
        "local_rotary_theta": (
            rope_theta(hf, "sliding_attention", "local_rope_theta") if local else None
        ),
        "window": window,
        "global_every": global_every(layer_types, n_layers) if mixed else None,
    }


FAMILY = Family(
    model_types=("modernbert",),
    prefixes=("model.",),
    layers="layers",
    layer_keys={
        "attn.out_proj": "attn.Wo",
        "attn_norm": "attn_norm",
        "ffn.up": "mlp.Wi",
        "ffn.down": "mlp.Wo",
        "ffn_norm": "mlp_norm",
    },
    embedding_keys={"word": "embeddings.tok_embeddings", "norm": "embeddings.norm"},
    math=math,
    hf_names={"hidden_act": "hidden_activation", "layer_norm_eps": "norm_eps"},
    extra_keys={"final_norm.weight": "final_norm.weight", "final_norm.bias": "final_norm.bias"},
    positions=False,
    default_positions=8192,
    fused_qkv="attn.Wqkv",
    classify=ClassifyKeys(("head.dense",), "classifier", "config", "head.norm", configurable=True),
    mlm=MlmKeys(
        "head.dense",
        "head.norm",
        "decoder",
        ("decoder.bias",),
        ("model.embeddings.tok_embeddings.weight",),
    ),
    tokenizer="byte-level BPE, [CLS] text [SEP]",
)
