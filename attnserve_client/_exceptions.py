"""The SDK's exceptions. Every error it raises is an :class:`AttnserveError`::

    AttnserveError
    ├── APIConnectionError            the server could not be reached
    │   └── APITimeoutError           no answer within the timeout
    ├── APIResponseError              a success answer that breaks the contract (not JSON,
    │                                 wrong shape): a proxy in the way, or a version mismatch
    └── APIStatusError                the server answered with an error status
        ├── BadRequestError           400, 413, 415, 422: fix the request
        │   ├── PayloadTooLargeError      413
        │   ├── UnsupportedMediaTypeError 415
        │   └── UnprocessableEntityError  422
        ├── AuthenticationError       401 (missing or wrong API key)
        ├── NotFoundError             404 (e.g. unknown model)
        ├── OverloadedError           429 (retried first, honouring Retry-After)
        ├── ServiceUnavailableError   503 (e.g. not ready, shutting down; retried first)
        ├── DeadlineExceededError     504 (X-Request-Timeout passed while queued; retried first)
        └── InternalServerError       other 5xx (retried first)

Status errors carry the server's ``error`` message and ``error_type``.
"""

from __future__ import annotations

import httpx


class AttnserveError(Exception):
    """Base of every error the SDK raises."""


class APIConnectionError(AttnserveError):
    def __init__(self, message: str = "could not connect to the attnserve server") -> None:
        super().__init__(message)


class APITimeoutError(APIConnectionError):
    def __init__(self, message: str = "the request to the attnserve server timed out") -> None:
        super().__init__(message)


class APIResponseError(AttnserveError):
    """A 2xx answer the SDK cannot read."""


class APIStatusError(AttnserveError):
    """An error status; ``error`` and ``error_type`` come from the server's JSON body."""

    def __init__(self, response: httpx.Response, error: str, error_type: str) -> None:
        super().__init__(f"{response.status_code} {error_type}: {error}")
        self.response = response
        self.status_code = response.status_code
        self.error = error
        self.error_type = error_type


class BadRequestError(APIStatusError):
    pass


class PayloadTooLargeError(BadRequestError):
    pass


class UnsupportedMediaTypeError(BadRequestError):
    pass


class UnprocessableEntityError(BadRequestError):
    pass


class AuthenticationError(APIStatusError):
    pass


class NotFoundError(APIStatusError):
    pass


class OverloadedError(APIStatusError):
    pass


class ServiceUnavailableError(APIStatusError):
    pass


class DeadlineExceededError(APIStatusError):
    pass


class InternalServerError(APIStatusError):
    pass


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: UnprocessableEntityError,
    429: OverloadedError,
    503: ServiceUnavailableError,
    504: DeadlineExceededError,
}


def status_error(response: httpx.Response) -> APIStatusError:
    """The exception for an error response: the one place statuses map to classes."""
    try:
        body = response.json()
        error, error_type = str(body["error"]), str(body.get("error_type", "unknown"))
    except (ValueError, KeyError, TypeError):
        error, error_type = response.text[:500] or response.reason_phrase, "unknown"
    default = InternalServerError if response.status_code >= 500 else APIStatusError
    return _BY_STATUS.get(response.status_code, default)(response, error, error_type)
