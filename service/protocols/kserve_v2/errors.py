"""Open Inference Protocol error bodies: ``{"error": "<message>", "error_type": "<kind>"}``.

tritonclient reads only ``error`` (and fails on a body without it); ``error_type``
and the engine's own statuses (422 for invalid content, 413 for limits) are kept
so that attnserve's SDK raises the same exceptions whichever transport it uses.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from service.errors import ServiceError, field_name

# Domain names spelled as this protocol's tensors: a request's sequences are the rows
# of its batch, its mask the attention_mask input.
RENAMES = {"inputs": "batch", "mask": "attention_mask"}


def render(exc: ServiceError) -> JSONResponse:
    where = None if exc.field is None else field_name(exc.field, RENAMES)
    message = exc.message if where is None else f"{where}: {exc.message}"
    return JSONResponse(
        {"error": message, "error_type": exc.error_type},
        status_code=exc.status_code,
        headers=exc.headers,
    )
