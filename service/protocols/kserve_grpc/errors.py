"""Engine errors as gRPC statuses, with the HTTP ``/v2`` messages unchanged.

Invalid input (400, 413, 422) is INVALID_ARGUMENT (a request beyond the limits
is not retryable, so not RESOURCE_EXHAUSTED); an unknown model NOT_FOUND; a
missing or wrong key UNAUTHENTICATED; admission refused (429) RESOURCE_EXHAUSTED
and not ready or draining (503) UNAVAILABLE, both with ``retry-after`` (seconds)
in the trailing metadata; a passed deadline DEADLINE_EXCEEDED; a caller gone
CANCELLED.
"""

from __future__ import annotations

import grpc

from service.errors import ServiceError
from service.protocols.open_inference.errors import message

CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status(exc: ServiceError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, message, trailing metadata) of an engine error."""
    retry = (exc.headers or {}).get("Retry-After")
    trailers = (("retry-after", retry),) if retry is not None else ()
    return CODES.get(exc.status_code, grpc.StatusCode.INTERNAL), message(exc), trailers
