"""The architecture families the exporter imports: one module each, one line each here.

``FAMILIES`` maps every ``model_type`` a family imports to it; ``family_of`` reads a
``config.json``'s and refuses any other by name.
"""

from __future__ import annotations

from typing import Any

from model_export.families import (
    bert,
    deberta_v2,
    distilbert,
    electra,
    eurobert,
    gemma3,
    gte,
    jina_v3,
    llama,
    modernbert,
    mpnet,
    nomic_bert,
    roberta,
    roformer,
)
from model_export.families.base import CheckpointError, Family

REGISTRY: tuple[Family, ...] = (
    bert.FAMILY,
    electra.FAMILY,
    roberta.FAMILY,
    distilbert.FAMILY,
    mpnet.FAMILY,
    roformer.FAMILY,
    modernbert.FAMILY,
    llama.FAMILY,
    deberta_v2.FAMILY,
    gemma3.FAMILY,
    eurobert.FAMILY,
    gte.FAMILY,
    nomic_bert.FAMILY,
    jina_v3.FAMILY,
)
FAMILIES: dict[str, Family] = {kind: family for family in REGISTRY for kind in family.model_types}


def model_type(hf: dict[str, Any]) -> str:
    """``model_type`` (BERT when absent), refused by name unless a family imports it."""
    kind = str(hf.get("model_type", "bert"))
    if kind not in FAMILIES:
        named = ", ".join(map(str, hf.get("architectures") or [])) or "no architecture named"
        raise CheckpointError(
            f"model_type {kind!r} ({named}) is not supported: this exporter imports "
            f"{', '.join(sorted(FAMILIES))}"
        )
    return kind


def family_of(hf: dict[str, Any]) -> Family:
    """The family of a Hugging Face ``config.json``."""
    return FAMILIES[model_type(hf)]
