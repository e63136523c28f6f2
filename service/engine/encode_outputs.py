"""The native encode kind: an encode request (``encode.py``), or, when it names the
late-interaction outputs it wants (``output``), a multi-vector request
(``multi_vector.py``), chosen by the type the protocol parsed its body to. An encode
request keeps every step of ``ENCODE``: prepared on the loop where cheap, its answer
kept in the response cache."""

from __future__ import annotations

from typing import Any, cast

from service.engine.encode import ENCODE
from service.engine.kind import RequestKind, Serving, either
from service.engine.multi_vector import MULTI_VECTOR, MultiVectorRequest, MultiVectorResult
from service.engine.types import EncodeRequest, EncodeResult

Request = EncodeRequest | MultiVectorRequest
Result = EncodeResult | MultiVectorResult


def _by_request(request: Request, _serving: Serving) -> RequestKind[Request, Any, Result]:
    kind = MULTI_VECTOR if isinstance(request, MultiVectorRequest) else ENCODE
    return cast(RequestKind[Request, Any, Result], kind)


# /v1/encode: contextualized embeddings, or a late-interaction model's outputs of one run.
ENCODE_OR_MULTI_VECTOR = either("encode_or_multi_vector", _by_request)
