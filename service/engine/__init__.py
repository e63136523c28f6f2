"""The protocol-neutral engine: typed numpy in, typed numpy out (see ``engine.py``)."""

from service.engine.engine import Engine
from service.engine.execute import OFFLOAD_BYTES
from service.engine.prepare import PreparedEncode
from service.engine.scope import Access, Caller, RequestScope
from service.engine.types import (
    AnswerShape,
    ArrayInput,
    AttentionSpec,
    DecodeRequest,
    DecodeResult,
    EncodeRequest,
    EncodeResult,
    InputItem,
    SequenceOutput,
    SpannedText,
    SparseRequest,
    SparseResult,
    TokenIds,
    TokenizedText,
    TokenizeRequest,
    TokenizeResult,
    WireCost,
)
from service.model_info import ModelInfo

__all__ = [
    "OFFLOAD_BYTES",
    "Access",
    "AnswerShape",
    "ArrayInput",
    "AttentionSpec",
    "Caller",
    "DecodeRequest",
    "DecodeResult",
    "EncodeRequest",
    "EncodeResult",
    "Engine",
    "InputItem",
    "ModelInfo",
    "PreparedEncode",
    "RequestScope",
    "SequenceOutput",
    "SpannedText",
    "SparseRequest",
    "SparseResult",
    "TokenIds",
    "TokenizeRequest",
    "TokenizeResult",
    "TokenizedText",
    "WireCost",
]
