"""Native error bodies: ``{"error": "<field>: <message>", "error_type": "<kind>"}``."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from service.errors import SequenceTooLong, ServiceError, field_name

# Domain field names spelled differently in native bodies.
RENAMES = {"texts": "text"}
TRUNCATE_HINT = " (texts can be cut to that length instead: set truncate=true)"


def message(exc: ServiceError) -> str:
    text = exc.message + (TRUNCATE_HINT if isinstance(exc, SequenceTooLong) else "")
    return text if exc.field is None else f"{field_name(exc.field, RENAMES)}: {text}"


def render(exc: ServiceError) -> JSONResponse:
    return error_response(exc.status_code, message(exc), exc.error_type, exc.headers)


def error_response(
    status: int, text: str, error_type: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": text, "error_type": error_type}, status_code=status, headers=headers
    )
