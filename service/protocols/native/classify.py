"""``/v1/classify`` bodies <-> the engine's classification request and result.

The answer is Jina's classification shape in the native envelope: per input its best
label (``prediction``, ``score``) and its labels best first (``predictions``, at most
``top_k``), then ``usage`` as ``/v1/encode`` counts it.
"""

from __future__ import annotations

from typing import Any

from service.engine import ClassifyRequest, ClassifyResult
from service.protocols import wire
from service.protocols.native.schemas import ClassifyRequest as ClassifyBody


def classify_request(body: bytes) -> tuple[ClassifyRequest, int | None]:
    """A /v1/classify body -> the engine's request, and how many labels to list."""
    options = wire.parse_options(ClassifyBody, wire.parse_json_object(body))
    request = ClassifyRequest(
        inputs=[x if isinstance(x, str) else (x[0], x[1]) for x in options.inputs],
        model=options.model,
        raw_scores=options.raw_scores,
        truncate=options.truncate,
        truncation_direction=options.truncation_direction,
    )
    return request, options.top_k


def classify_response(result: ClassifyResult, top_k: int | None) -> bytes:
    """``{model, data: [{index, prediction, score, predictions}], usage}``."""
    data: list[dict[str, Any]] = []
    for index, row in enumerate(result.scores):
        order = sorted(range(len(row)), key=lambda k: (-row[k], k))[:top_k]
        best = order[0]
        data.append(
            {
                "index": index,
                "prediction": result.labels[best],
                "score": float(row[best]),
                "predictions": [{"label": result.labels[k], "score": float(row[k])} for k in order],
            }
        )
    usage = {"sequences": len(data), "tokens": result.tokens}
    return wire.dumps({"model": result.model, "data": data, "usage": usage})
