"""The protocol-neutral engine: typed numpy in, typed numpy out (see ``engine.py``).

Protocols import these names, never ``limits`` itself: ``check_json_items`` (a body's
JSON item bound, checked as an HTTP body arrives) and ``serving_limits`` (what TEI's
``/info`` reports) are the engine's rules, exposed here.
"""

from service.engine.encode import ENCODE
from service.engine.encode_outputs import ENCODE_OR_MULTI_VECTOR
from service.engine.engine import Engine
from service.engine.kind import RequestKind
from service.engine.limits import check_json_items, serving_limits
from service.engine.multi_vector import (
    MULTI_VECTOR,
    MultiVectorItem,
    MultiVectorRequest,
    MultiVectorResult,
    Prune,
)
from service.engine.prepare import PreparedEncode
from service.engine.rank_explain import MaxSimExplanation, RankExplanation
from service.engine.ranking import RERANK
from service.engine.rerank import (
    CLASSIFY,
    ClassifyRequest,
    ClassifyResult,
    Ranked,
    RerankRequest,
    RerankResult,
)
from service.engine.scope import Access, Caller, RequestScope
from service.engine.similarity import (
    SIMILARITY,
    SimilarityExplanation,
    SimilarityRequest,
    SimilarityResult,
    TokenPair,
)
from service.engine.sparse import SPARSE
from service.engine.tokenize import DECODE, TOKENIZE
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
    ServingLimits,
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
    "CLASSIFY",
    "DECODE",
    "ENCODE",
    "ENCODE_OR_MULTI_VECTOR",
    "MULTI_VECTOR",
    "RERANK",
    "SIMILARITY",
    "SPARSE",
    "TOKENIZE",
    "Access",
    "AnswerShape",
    "ArrayInput",
    "AttentionSpec",
    "Caller",
    "ClassifyRequest",
    "ClassifyResult",
    "DecodeRequest",
    "DecodeResult",
    "EncodeRequest",
    "EncodeResult",
    "Engine",
    "InputItem",
    "MaxSimExplanation",
    "ModelInfo",
    "MultiVectorItem",
    "MultiVectorRequest",
    "MultiVectorResult",
    "PreparedEncode",
    "Prune",
    "RankExplanation",
    "Ranked",
    "RequestKind",
    "RequestScope",
    "RerankRequest",
    "RerankResult",
    "SequenceOutput",
    "ServingLimits",
    "SimilarityExplanation",
    "SimilarityRequest",
    "SimilarityResult",
    "SpannedText",
    "SparseRequest",
    "SparseResult",
    "TokenIds",
    "TokenPair",
    "TokenizeRequest",
    "TokenizeResult",
    "TokenizedText",
    "WireCost",
    "check_json_items",
    "serving_limits",
]
