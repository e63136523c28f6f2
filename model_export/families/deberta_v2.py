"""DeBERTa-v2 (and v3, the same ``model_type``): BERT's post-LN layers with disentangled
attention. Content-to-content, content-to-position and position-to-content scores
(``pos_att_type``) over one table of relative position embeddings shared by every
layer (LayerNorm'd with ``norm_rel_ebd``), read at each offset's log bucket
(``position_buckets``, ``max_relative_positions``) and projected by each layer's own
query and key projections (``share_att_key``) or by separate ones; every term over
√(d_k · (1 + number of position terms)). No absolute positions unless
``position_biased_input``; no token types when ``type_vocab_size`` is 0 (v3's).

Sequence classification: the ContextPooler (``pooler.dense``, ``pooler_hidden_act``,
on the first token) then ``classifier``. Refused by name: the convolution after layer 0
(``conv_kernel_size``, v2-xlarge's), narrower embeddings (``embedding_size``) and a
head size other than hidden / heads. DeBERTa v1 (``model_type`` "deberta": fused
in_proj, separate q/v biases, talking heads) is another family, not imported.

Tokenizer: SentencePiece Unigram (v3's spm.model; export with the tokenizer.json a
folder holds), [CLS] text [SEP], pairs [CLS] a [SEP] b [SEP] with types 0 then 1;
the tests train a small Unigram one.
"""

from __future__ import annotations

from typing import Any

from model_export.families.base import (
    BERT_EMBEDDING_KEYS,
    BERT_LAYER_KEYS,
    CheckpointError,
    ClassifyKeys,
    Family,
    same_width_embeddings,
)

# DebertaV2Config's defaults, for config.json files that leave them out.
DEFAULTS: dict[str, Any] = {
    "layer_norm_eps": 1e-7,
    "max_position_embeddings": 512,
    "relative_attention": False,
    "max_relative_positions": -1,
    "position_buckets": -1,
    "share_att_key": False,
    "norm_rel_ebd": "none",
    "pos_att_type": None,
    "conv_kernel_size": 0,
}


def position_terms(value: object) -> list[str]:
    """``pos_att_type`` as transformers reads it: "p2c|c2p" or a list; None: none."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.lower().split("|")]
    if isinstance(value, list):
        return [str(part) for part in value]
    raise CheckpointError(f"pos_att_type must be a string or a list, got {value!r}")


def math(hf: dict[str, Any]) -> dict[str, Any]:
    """Disentangled attention's switches; the rest is BERT's post-LN."""
    same_width_embeddings("deberta-v2", hf)
    hf = DEFAULTS | hf
    if int(hf["conv_kernel_size"]) > 0:
        raise CheckpointError(
            f"DeBERTa-v2 with a convolution after layer 0 (conv_kernel_size "
            f"{hf['conv_kernel_size']}) is not supported"
        )
    width = int(hf["hidden_size"]) // int(hf["num_attention_heads"])
    if int(hf.get("attention_head_size", width)) != width:
        raise CheckpointError(
            f"DeBERTa-v2 with attention_head_size {hf['attention_head_size']} (not "
            f"hidden_size / num_attention_heads = {width}) is not supported"
        )
    # transformers counts c2p and p2c in the scale with or without relative attention.
    terms = position_terms(hf["pos_att_type"])
    c2p, p2c = "c2p" in terms, "p2c" in terms
    switches: dict[str, Any] = {
        "layer_norm_eps": float(hf["layer_norm_eps"]),
        "score_scale_factor": 1 + int(c2p) + int(p2c),
    }
    if not hf["relative_attention"]:
        return switches
    max_relative = int(hf["max_relative_positions"])
    if max_relative < 1:
        max_relative = int(hf["max_position_embeddings"])
    buckets = int(hf["position_buckets"])
    norms = [part.strip() for part in str(hf["norm_rel_ebd"]).lower().split("|")]
    switches |= {
        "relative_embeddings": buckets if buckets > 0 else max_relative,
        "content_to_position": c2p,
        "position_to_content": p2c,
        "share_position_projections": bool(hf["share_att_key"]),
        "relative_norm": "layer_norm" in norms,
    }
    if buckets > 0:
        if max_relative - 1 <= buckets // 2:
            raise CheckpointError(
                f"DeBERTa-v2 with max_relative_positions {max_relative} and position_buckets "
                f"{buckets} (log buckets need max_relative_positions - 1 > "
                "position_buckets / 2) is not supported"
            )
        switches |= {"position_buckets": buckets, "relative_max_distance": max_relative}
    return switches


FAMILY = Family(
    model_types=("deberta-v2",),
    prefixes=("deberta.",),
    layers="encoder.layer",
    layer_keys=BERT_LAYER_KEYS
    | {
        "attn.q_proj": "attention.self.query_proj",
        "attn.k_proj": "attention.self.key_proj",
        "attn.v_proj": "attention.self.value_proj",
        "attn.disentangled.key_proj": "attention.self.pos_key_proj",
        "attn.disentangled.query_proj": "attention.self.pos_query_proj",
    },
    embedding_keys=BERT_EMBEDDING_KEYS,
    math=math,
    extra_keys={
        "relative_embeddings.table.weight": "encoder.rel_embeddings.weight",
        "relative_embeddings.norm.weight": "encoder.LayerNorm.weight",
        "relative_embeddings.norm.bias": "encoder.LayerNorm.bias",
    },
    classify=ClassifyKeys(
        ("pooler.dense",), "classifier", "config", activation_key="pooler_hidden_act"
    ),
    tokenizer="SentencePiece Unigram, [CLS] text [SEP], pairs [CLS] a [SEP] b [SEP] (types 0, 1)",
    positions_key="position_biased_input",
    default_type_vocab=0,
    zero_type_rows=2,
)
