"""Open Inference Protocol error bodies: ``{"error": "<message>"}`` (all tritonclient reads).

Invalid content is 400, as Triton answers it; other statuses are the engine's.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from service.errors import InvalidInput, ServiceError, field_name

# Domain names spelled as this protocol's tensors: a request's sequences are the rows
# of its batch, its mask the attention_mask input.
RENAMES = {"inputs": "batch", "mask": "attention_mask"}


def render(exc: ServiceError) -> JSONResponse:
    status = 400 if isinstance(exc, InvalidInput) else exc.status_code
    message = (
        exc.message if exc.field is None else f"{field_name(exc.field, RENAMES)}: {exc.message}"
    )
    return JSONResponse({"error": message}, status_code=status, headers=exc.headers)
