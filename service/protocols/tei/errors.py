"""TEI's error bodies: ``{"error": "<message>", "error_type": "<kind>"}``, capitalised kinds.

TEI answers 400 ``Empty`` for an empty input, 422 ``Validation`` for invalid content
and limits (a too-long input is 422 there, not 413), 413 only for a body over the
size limit, 429 ``Overloaded`` (with Retry-After here), 503 ``Unhealthy``; engine
errors TEI has no word for keep their status with the nearest kind. Messages are
the engine's and never hold a header's value (an Authorization token included).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from service.errors import (
    BodyTimeout,
    ClientClosedRequest,
    DeadlineExceeded,
    InvalidInput,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    field_name,
)

EMPTY = "is empty"  # how the engine words an empty input


def status_and_kind(exc: ServiceError) -> tuple[int, str]:
    if isinstance(exc, InvalidInput):
        return (400, "Empty") if exc.message.startswith(EMPTY) else (422, "Validation")
    if isinstance(exc, PayloadTooLarge):
        body = exc.message.startswith("request body") or "JSON arrays" in exc.message
        return (413, "Validation") if body else (422, "Validation")
    if isinstance(exc, Overloaded):
        return 429, "Overloaded"
    if isinstance(exc, NotReady):
        return 503, "Unhealthy"
    if isinstance(exc, DeadlineExceeded | BodyTimeout | ClientClosedRequest):
        return exc.status_code, "Backend"
    return exc.status_code, "Validation"


def status_for(cls: type[ServiceError]) -> int:
    """The status a class of engine error gets here (for the OpenAPI's error list)."""
    if issubclass(cls, InvalidInput | PayloadTooLarge):
        return 422
    return cls.status_code


def render(exc: ServiceError) -> JSONResponse:
    status, kind = status_and_kind(exc)
    where = None if exc.field is None else field_name(exc.field)
    message = exc.message if where is None else f"{where}: {exc.message}"
    return JSONResponse(
        {"error": message, "error_type": kind}, status_code=status, headers=exc.headers
    )
