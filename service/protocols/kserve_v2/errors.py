"""Open Inference Protocol error bodies: ``{"error": "<message>", "error_type": "<kind>"}``.

tritonclient reads only ``error`` (and fails on a body without it); ``error_type``
and the engine's own statuses (422 for invalid content, 413 for limits) are kept
so that attnserve's SDK raises the same exceptions whichever transport it uses.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from service.errors import ServiceError
from service.protocols.open_inference.errors import message


def render(exc: ServiceError) -> JSONResponse:
    return JSONResponse(
        {"error": message(exc), "error_type": exc.error_type},
        status_code=exc.status_code,
        headers=exc.headers,
    )
