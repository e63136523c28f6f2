"""Domain errors: what went wrong, in protocol-neutral terms.

The engine and the protocols raise these; each protocol renders them in its
own body shape (``service/protocols/<name>/errors.py``). An error carries an
HTTP-like ``status_code``, a machine ``error_type``, a message for a person
and, when one field is to blame, that field as a path in domain terms
(``("inputs", 3)``, ``("attention", "layers")``) that the protocol spells with
its own field names::

    ServiceError (500 internal_error)
    ├── InvalidJSON (400 invalid_json)
    ├── InvalidHeader (400 invalid_header)
    ├── Unauthorized (401 unauthorized)
    ├── ModelNotFound (404 model_not_found)
    ├── BodyTimeout (408 request_timeout)
    ├── PayloadTooLarge (413 payload_too_large)
    │   └── SequenceTooLong (413 payload_too_large: one sequence beyond the model's length)
    ├── UnsupportedMediaType (415 unsupported_media_type)
    ├── InvalidInput (422 invalid_input)
    │   └── UnsupportedByModel (422 unsupported_by_model)
    ├── Overloaded (429 overloaded)
    ├── ClientClosedRequest (499 client_closed_request: logged, never seen by anyone)
    ├── NotReady (503 not_ready)
    │   └── ShuttingDown (503 shutting_down)
    └── DeadlineExceeded (504 deadline_exceeded)

Messages are cut to ``MAX_MESSAGE_CHARS``: they may quote what a client sent,
and an error must never cost as much as the request.
"""

from __future__ import annotations

from typing import ClassVar

FieldPath = tuple[str | int, ...]
MAX_MESSAGE_CHARS = 1000
# A quoted client value (a model name, a media type) is cut to this many characters.
MAX_QUOTED_CHARS = 64
# Parts of a field path named in an error, at most.
MAX_FIELD_PARTS = 8


def quoted(value: object) -> str:
    """``repr(value)``, cut to ``MAX_QUOTED_CHARS``: for echoing what a client sent."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED_CHARS else text[: MAX_QUOTED_CHARS - 4] + "...'"


class ServiceError(Exception):
    """Base class: ``status_code`` and ``error_type`` travel to the client."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        field: FieldPath | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers


def field_name(field: FieldPath, renames: dict[str, str] | None = None) -> str:
    """``("inputs", 3, "shape")`` -> ``inputs[3].shape``, the first name spelled per ``renames``.

    A field can be a client's own key (an unknown one, refused): each name is cut to
    ``MAX_QUOTED_CHARS`` and at most ``MAX_FIELD_PARTS`` parts are kept, so the error
    stays small whatever key was sent.
    """
    out = ""
    for i, part in enumerate(field[:MAX_FIELD_PARTS]):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = (renames or {}).get(part, part) if i == 0 else part
            if len(name) > MAX_QUOTED_CHARS:
                name = name[: MAX_QUOTED_CHARS - 3] + "..."
            out += f".{name}" if out else name
    return out


class InvalidJSON(ServiceError):
    status_code = 400
    error_type = "invalid_json"


class InvalidHeader(ServiceError):
    status_code = 400
    error_type = "invalid_header"


class Unauthorized(ServiceError):
    status_code = 401
    error_type = "unauthorized"


class ModelNotFound(ServiceError):
    status_code = 404
    error_type = "model_not_found"


class BodyTimeout(ServiceError):
    """The body did not arrive within ATTNSERVE_BODY_TIMEOUT."""

    status_code = 408
    error_type = "request_timeout"


class PayloadTooLarge(ServiceError):
    status_code = 413
    error_type = "payload_too_large"


class SequenceTooLong(PayloadTooLarge):
    """One sequence is longer than the model accepts (protocols may answer it as 400)."""


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


class ShuttingDown(NotReady):
    """SIGTERM received: the node drains, new work goes elsewhere."""

    error_type = "shutting_down"


class DeadlineExceeded(ServiceError):
    """The request's deadline passed before its answer; queued work was dropped."""

    status_code = 504
    error_type = "deadline_exceeded"


class ModelLoadError(RuntimeError):
    """A model directory that cannot be served; the server refuses to start."""
