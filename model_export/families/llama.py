"""Decoder-style embedders of the Llama lineage: Llama, Mistral, Qwen2 and Qwen3
(Qwen3-Embedding, gte-Qwen2, e5-mistral).

Pre-norm RMSNorm layers with a final norm, causal attention, grouped-query attention
(``num_key_value_heads``), rotary halves with ``rope_parameters``' θ, SwiGLU
(``down(silu(gate(x)) ⊙ up(x))``: gate and up stacked into our GLU's ``up``), no
biases except Qwen2's q/k/v (``attention_bias``); Qwen3 adds per-head q/k RMSNorms
and its own ``head_dim``. No position table, no token types, no norm after the
embedding lookup. A sliding window (Mistral's ``sliding_window``, on every layer;
Qwen2's and Qwen3's with ``use_sliding_window`` when every layer slides) keeps key j
for query i when i - W < j <= i (transformers' ``sliding_window_overlay`` on the causal
mask): our causal ``window`` of radius W - 1. Qwen's mix of full and sliding layers
(``max_window_layers``) is refused by name.

Rerankers (Qwen3-Reranker): the causal LM's head, two rows of it (yes, no) at the last
token (``heads.YesNoHead``); the prompt from the folder's chat template
(``model_export.llm_rerank``).

Tokenizer: byte-level BPE; embedders append an end-of-text token that last-token
pooling reads (the folder's tokenizer.json post-processor says so).
"""

from __future__ import annotations

from typing import Any

from model_export.config import SIZE_BOUNDS
from model_export.families.base import CheckpointError, Family, LmHeadKeys


def rope_theta(hf: dict[str, Any]) -> float:
    """The rotary base of ``rope_parameters`` (or the older flat ``rope_theta``); scaled
    kinds are refused by name."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise CheckpointError(f"rope_type {kind!r} is not supported, only default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial_rotary_factor is not supported")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


LAYER_TYPES = ("full_attention", "sliding_attention")


def window(kind: str, hf: dict[str, Any]) -> int | None:
    """The radius of the causal window every layer slides in (None: full causal attention).
    Transformers keeps key j for query i when i - W < j <= i: radius W - 1."""
    size = hf.get("sliding_window")
    if kind == "llama":  # LlamaModel has no sliding window: a config naming one is refused
        if "sliding_attention" in (hf.get("layer_types") or []):
            raise CheckpointError("llama with sliding-window layer_types is not supported")
        return None
    if kind == "mistral":  # MistralModel slides every layer when sliding_window is set
        layers = [size is not None] * int(hf["num_hidden_layers"])
    else:
        if not hf.get("use_sliding_window"):
            size = None  # as Qwen2Config and Qwen3Config read it
        full = hf.get("max_window_layers", 28)  # layers below it are full, as Qwen2Config
        if isinstance(full, bool) or not isinstance(full, int):
            raise CheckpointError(f"{kind} max_window_layers must be an integer, got {full!r}")
        types = hf.get("layer_types") or [
            "sliding_attention" if size is not None and i >= full else "full_attention"
            for i in range(int(hf["num_hidden_layers"]))
        ]
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            raise CheckpointError(f"{kind} layer_types {', '.join(unknown)} are not supported")
        layers = [t == "sliding_attention" for t in types]
        if any(layers) and size is None:
            raise CheckpointError(
                f"{kind} layer_types name sliding layers without a sliding_window "
                "(use_sliding_window false)"
            )
    if not any(layers):
        return None
    if not all(layers):
        raise CheckpointError(
            f"{kind} mixing full and sliding-window layers (layer_types, max_window_layers "
            f"{hf.get('max_window_layers')}) is not supported"
        )
    bound = SIZE_BOUNDS["window"] + 1
    if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= bound:
        raise CheckpointError(
            f"{kind} sliding_window must be an integer in 2..{bound}, got {size!r}"
        )
    return size - 1


def math(hf: dict[str, Any]) -> dict[str, Any]:
    kind = hf.get("model_type", "llama")
    heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // heads
    return {
        "norm": "rms",
        "norm_bias": False,
        "norm_placement": "pre",
        "layer_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "causal": True,
        "window": window(kind, hf),
        "kv_heads": int(hf.get("num_key_value_heads") or heads),
        "head_size": int(head_dim),
        "qk_norm": kind == "qwen3",
        "glu": True,
        "rotary": "half",
        "rotary_theta": rope_theta(hf),
        "attention_bias": bool(hf.get("attention_bias", kind == "qwen2")),
        "out_bias": False if kind == "qwen2" else None,  # Qwen2: q, k, v biased, o not
        "mlp_bias": bool(hf.get("mlp_bias", False)),
    }


FAMILY = Family(
    model_types=("llama", "mistral", "qwen2", "qwen3"),
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
        "ffn.down": "mlp.down_proj",
        "ffn_norm": "post_attention_layernorm",
    },
    # SwiGLU/GeGLU: act(gate_proj x) ⊙ up_proj x, stacked into our ffn.up.
    glu_parts=(("mlp.gate_proj", 0, 1), ("mlp.up_proj", 0, 1)),
    embedding_keys={"word": "embed_tokens"},
    math=math,
    extra_keys={"final_norm.weight": "norm.weight"},
    positions=False,
    embedding_norm=False,
    default_positions=32768,
    known_unused=("lm_head.weight",),
    # Rerankers (Qwen3-Reranker) read two of its rows: model_export.heads.YesNoHead.
    lm_head=LmHeadKeys("lm_head.weight", "model.embed_tokens.weight"),
    tokenizer="byte-level BPE; an end-of-text token appended for last-token pooling",
)
