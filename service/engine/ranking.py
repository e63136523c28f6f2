"""The rerank kind: by the model the request names, a cross-encoder's (or an LLM
reranker's) head (``rerank.py``), or a late-interaction model's MaxSim
(``multi_vector.py``). Every rerank route serves both."""

from __future__ import annotations

from typing import Any

from service.engine.kind import RequestKind, Serving, either
from service.engine.multi_vector import MAXSIM_RERANK
from service.engine.rerank import CROSS_ENCODER, RerankRequest, RerankResult


def _by_model(
    request: RerankRequest, serving: Serving
) -> RequestKind[RerankRequest, Any, RerankResult]:
    info = serving.registry.runtime(request.model).info
    return MAXSIM_RERANK if info.manifest.late_interaction is not None else CROSS_ENCODER


# Documents scored against a query, best first.
RERANK = either("rerank", _by_model)
