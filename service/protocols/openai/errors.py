"""OpenAI error bodies: ``{"error": {"message", "type", "param", "code"}}``.

Statuses follow OpenAI where its clients care: invalid content is 400 (OpenAI
never answers 422), a text beyond the model's length is 400
``context_length_exceeded``; the rest keep the engine's status, so the
``openai`` client raises BadRequestError, AuthenticationError, NotFoundError,
RateLimitError (honouring Retry-After) or InternalServerError.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from service.errors import (
    InvalidInput,
    Overloaded,
    SequenceTooLong,
    ServiceError,
    Unauthorized,
    field_name,
)

RENAMES = {"inputs": "input"}
CODES: dict[type[ServiceError], str] = {
    SequenceTooLong: "context_length_exceeded",
    Unauthorized: "invalid_api_key",
    Overloaded: "rate_limit_exceeded",
}
TRUNCATE_HINT = (
    "; texts are cut to the model's length instead when the server runs with "
    "ATTNSERVE_OPENAI_TRUNCATE=true"
)


def status_for(cls: type[ServiceError]) -> int:
    return 400 if issubclass(cls, InvalidInput | SequenceTooLong) else cls.status_code


def type_of(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def render(exc: ServiceError) -> JSONResponse:
    status = status_for(type(exc))
    param = None if exc.field is None else field_name(exc.field, RENAMES)
    message = exc.message if param is None else f"{param}: {exc.message}"
    if isinstance(exc, SequenceTooLong):
        message += TRUNCATE_HINT
    body = {
        "error": {
            "message": message,
            "type": type_of(status),
            "param": param,
            "code": CODES.get(type(exc), exc.error_type),
        }
    }
    return JSONResponse(body, status_code=status, headers=exc.headers)
