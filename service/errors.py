"""The service's error hierarchy; one handler turns any of them into a JSON answer.

Every error answer has the body ``{"error": "<message>", "error_type": "<kind>"}``
and never a stack trace::

    ServiceError (500 internal_error)
    ├── InvalidJSON (400 invalid_json)
    ├── Unauthorized (401 unauthorized)
    ├── ModelNotFound (404 model_not_found)
    ├── PayloadTooLarge (413 payload_too_large)
    ├── UnsupportedMediaType (415 unsupported_media_type)
    ├── InvalidInput (422 invalid_input)
    │   └── UnsupportedByModel (422 unsupported_by_model)
    ├── Overloaded (429 overloaded)
    ├── ClientClosedRequest (499 client_closed_request: logged, never seen by anyone)
    └── NotReady (503 not_ready)
"""

from __future__ import annotations

from typing import ClassVar


class ServiceError(Exception):
    """Base class: ``status_code`` and ``error_type`` travel to the client."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


class InvalidJSON(ServiceError):
    status_code = 400
    error_type = "invalid_json"


class Unauthorized(ServiceError):
    status_code = 401
    error_type = "unauthorized"


class ModelNotFound(ServiceError):
    status_code = 404
    error_type = "model_not_found"


class PayloadTooLarge(ServiceError):
    status_code = 413
    error_type = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status_code = 415
    error_type = "unsupported_media_type"


class InvalidInput(ServiceError):
    status_code = 422
    error_type = "invalid_input"


class UnsupportedByModel(InvalidInput):
    """The request asks a model for something it cannot do (e.g. text without a tokenizer)."""

    error_type = "unsupported_by_model"


class Overloaded(ServiceError):
    status_code = 429
    error_type = "overloaded"


class ClientClosedRequest(ServiceError):
    """The client disconnected while its request waited; 499 as nginx logs it."""

    status_code = 499
    error_type = "client_closed_request"


class NotReady(ServiceError):
    status_code = 503
    error_type = "not_ready"


class ModelLoadError(RuntimeError):
    """A model directory that cannot be served; the server refuses to start."""
