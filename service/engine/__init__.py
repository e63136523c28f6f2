"""The protocol-neutral engine: typed numpy in, typed numpy out (see ``engine.py``)."""

from service.engine.engine import OFFLOAD_BYTES, Engine, PreparedEncode
from service.engine.types import (
    AnswerShape,
    ArrayInput,
    AttentionSpec,
    EncodeRequest,
    EncodeResult,
    InputItem,
    SequenceOutput,
    TokenIds,
    TokenizedText,
    TokenizeRequest,
    TokenizeResult,
    WireCost,
)

__all__ = [
    "OFFLOAD_BYTES",
    "AnswerShape",
    "ArrayInput",
    "AttentionSpec",
    "EncodeRequest",
    "EncodeResult",
    "Engine",
    "InputItem",
    "PreparedEncode",
    "SequenceOutput",
    "TokenIds",
    "TokenizeRequest",
    "TokenizeResult",
    "TokenizedText",
    "WireCost",
]
