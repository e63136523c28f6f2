"""Python client for attnserve: sync and async, numpy in and out.

Example::

    import numpy as np
    from attnserve_client import Client

    with Client("http://127.0.0.1:8000") as client:
        result = client.encode([np.random.rand(7, 384).astype("float32")],
                               return_attention=True, reduce="mean")
        result.embeddings[0].shape   # (7, 384)
        result.attention[0].shape    # (6, 1, 7, 7)

Errors are drawn in :mod:`attnserve_client._exceptions`; every one is an
:class:`AttnserveError`.
"""

from attnserve_client._client import AsyncClient, Client
from attnserve_client._exceptions import (
    APIConnectionError,
    APIResponseError,
    APIStatusError,
    APITimeoutError,
    AttnserveError,
    AuthenticationError,
    BadRequestError,
    DeadlineExceededError,
    InternalServerError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    UnprocessableEntityError,
    UnsupportedMediaTypeError,
)
from attnserve_client._types import (
    Classified,
    ClassifyResult,
    EncodeResult,
    MaxSimExplanation,
    ModelCard,
    MultiVectorItem,
    MultiVectorResult,
    Ranked,
    RankExplanation,
    RerankResult,
    SimilarityExplanation,
    SimilarityResult,
    SparseResult,
    SparseVector,
    TokenizeResult,
    TokenPair,
    Usage,
)
from attnserve_client.plot import plot_attention

__all__ = [
    "APIConnectionError",
    "APIResponseError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AttnserveError",
    "AuthenticationError",
    "BadRequestError",
    "Classified",
    "ClassifyResult",
    "Client",
    "DeadlineExceededError",
    "EncodeResult",
    "InternalServerError",
    "MaxSimExplanation",
    "ModelCard",
    "MultiVectorItem",
    "MultiVectorResult",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "RankExplanation",
    "Ranked",
    "RerankResult",
    "ServiceUnavailableError",
    "SimilarityExplanation",
    "SimilarityResult",
    "SparseResult",
    "SparseVector",
    "TokenPair",
    "TokenizeResult",
    "UnprocessableEntityError",
    "UnsupportedMediaTypeError",
    "Usage",
    "plot_attention",
]
