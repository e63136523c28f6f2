"""Jina embeddings v3 (transformers' ``JinaEmbeddingsV3Model``): XLM-RoBERTa's post-LN
layers with rotary positions (transformers' default RoPE: halves, base
``rope_parameters.rope_theta``, 20000 by default) in place of a position table, and
task adapters: one PEFT LoRA folder per task beside the weights
(model_export.task_adapters), chosen per request.

Task names: config.json's ``lora_adaptations`` (the original remote-code config's list),
else Jina's five (``retrieval.query``, ``retrieval.passage``, ``separation``,
``classification``, ``text-matching``), name the folders they match with ``.`` and
``-`` read as ``_`` (transformers' folders are ``retrieval_query``…), in that order;
other folders keep their own name, after them.
The default task: config.json's ``default_task``, else sentence_bert_config.json's
(or its ``model_args``'); else none, as ``JinaEmbeddingsV3Model`` without
``set_adapter``: the base model.

Tokenizer: XLM-R's SentencePiece Unigram, <s> text </s>; the tests train a small one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_export.families.base import CheckpointError, Family
from model_export.st_folder import read_json

DEFAULT_THETA = 20_000.0  # JinaEmbeddingsV3Config.default_theta
# The tasks of jina-embeddings-v3 (its remote-code config.json's lora_adaptations).
JINA_TASKS = (
    "retrieval.query",
    "retrieval.passage",
    "separation",
    "classification",
    "text-matching",
)


def math(hf: dict[str, Any]) -> dict[str, Any]:
    """Post-LN, rotary halves with the config's base (default RoPE only)."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError("rope_parameters must be an object")
    if params.get("rope_type", "default") != "default":
        raise CheckpointError(f"rope_type {params['rope_type']!r} is not supported, only default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial_rotary_factor is not supported")
    return {
        "layer_norm_eps": float(hf.get("layer_norm_eps", 1e-5)),
        "rotary": "half",
        "rotary_theta": float(params.get("rope_theta", hf.get("rope_theta", DEFAULT_THETA))),
    }


def _folder_name(task: str) -> str:
    return task.replace(".", "_").replace("-", "_")


def _default_task(root: Path, hf: dict[str, Any]) -> str | None:
    found = hf.get("default_task")
    st_path = root / "sentence_bert_config.json"
    if found is None and st_path.is_file():
        st = read_json(st_path)
        model_args = st.get("model_args") if isinstance(st.get("model_args"), dict) else {}
        found = st.get("default_task", (model_args or {}).get("default_task"))
    if found is not None and not isinstance(found, str):
        raise CheckpointError(f"default_task must be a task's name, got {found!r}")
    return found


def task_adapters(root: Path, hf: dict[str, Any]) -> Any:
    """The checkpoint's task adapters (model_export.task_adapters.TaskAdapters) or None."""
    from model_export.task_adapters import config_lists, read_task_adapters

    listed = config_lists(hf, "lora_adaptations") or JINA_TASKS
    names = {_folder_name(task): task for task in listed}
    return read_task_adapters(root, names, _default_task(root, hf))


FAMILY = Family(
    model_types=("jina_embeddings_v3",),
    prefixes=("roberta.",),
    # The keys as save_pretrained writes them (transformers converts them on load):
    # the original Jina layout, q, k and v in one Wqkv.
    layers="encoder.layers",
    layer_keys={
        "attn.out_proj": "mixer.out_proj",
        "attn_norm": "norm1",
        "ffn.up": "mlp.fc1",
        "ffn.down": "mlp.fc2",
        "ffn_norm": "norm2",
    },
    embedding_keys={
        "word": "embeddings.word_embeddings",
        "token_type": "embeddings.token_type_embeddings",
        "norm": "emb_ln",
    },
    math=math,
    positions=False,
    default_positions=8194,
    fused_qkv="mixer.Wqkv",
    task_adapters=task_adapters,
    # transformers' names of the same modules (a PEFT adapter may use either).
    adapter_aliases={
        "layers.{i}.self_attn.q_proj": "attn.q_proj",
        "layers.{i}.self_attn.k_proj": "attn.k_proj",
        "layers.{i}.self_attn.v_proj": "attn.v_proj",
        "layers.{i}.self_attn.o_proj": "attn.out_proj",
        "layers.{i}.mlp.fc1": "ffn.up",
        "layers.{i}.mlp.fc2": "ffn.down",
    },
    tokenizer="SentencePiece Unigram (XLM-R's), <s> text </s>",
)
