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
    ├── LoadFailed (400 load_failed: a repository load; the serving version is untouched)
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

    when: ClassVar[str] = (
        "a bug; the details are in the server log only (under the answer's `X-Request-Id`); "
        "the connection stays usable"
    )
    raised_on: ClassVar[frozenset[str]] = frozenset()
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
    when = "the body is not valid JSON (including NaN, Infinity and numbers beyond double range)"
    raised_on = frozenset({"work"})
    status_code = 400
    error_type = "invalid_json"


class InvalidHeader(ServiceError):
    when = "`X-Request-Timeout` on an inference route is not a number of seconds in (0, 86400]"
    raised_on = frozenset({"work"})
    status_code = 400
    error_type = "invalid_header"


class Unauthorized(ServiceError):
    when = (
        "the server has an API key and the request to `/v1/*`, `/v2/models/*` or a TEI route "
        "lacks `Authorization: Bearer <key>` or has a wrong key; on `/v2/repository/*`: no admin "
        "key of `ATTNSERVE_ADMIN_KEYS` (none is accepted when only an API key is set)"
    )
    raised_on = frozenset({"guarded", "work", "admin"})
    status_code = 401
    error_type = "unauthorized"


class ModelNotFound(ServiceError):
    when = (
        "`model` (or the `{name}` of `/v1/models/{name}`, the `{model}` or `{version}` of "
        "`/v2/models/...`) is not served here (or not loaded), or no such model directory "
        "for the repository API"
    )
    raised_on = frozenset({"guarded", "work", "admin"})
    status_code = 404
    error_type = "model_not_found"


class BodyTimeout(ServiceError):
    """The body did not arrive within ATTNSERVE_BODY_TIMEOUT."""

    when = (
        "the body did not arrive within `ATTNSERVE_BODY_TIMEOUT` seconds (the connection is closed)"
    )
    raised_on = frozenset({"work"})
    status_code = 408
    error_type = "request_timeout"


class PayloadTooLarge(ServiceError):
    when = (
        "more sequences than `ATTNSERVE_MAX_SEQUENCES` (`ATTNSERVE_MAX_POOLED_SEQUENCES` "
        "when only pooled vectors are asked for); more tokens in total than "
        "`ATTNSERVE_MAX_TOKENS` (`ATTNSERVE_MAX_POOLED_TOKENS`); a sequence longer than the "
        "model's `max_seq_len`; a body larger than `ATTNSERVE_MAX_BODY_BYTES`, or holding "
        "more JSON arrays, objects and strings than any valid request (the larger token "
        "limit + 4 × the larger sequence limit + 1024); a response that would exceed "
        "`ATTNSERVE_MAX_RESPONSE_BYTES` (the message gives the estimated size and how to "
        "shrink it: fewer `attention.layers`/`attention.heads`, a `reduce`, "
        "`encoding_format=base64`, fewer or shorter sequences); a request that alone needs "
        "more memory than `ATTNSERVE_MAX_INFLIGHT_BYTES`; a request whose estimated "
        "inference time (the message gives it) exceeds its deadline even on an idle "
        "server"
    )
    raised_on = frozenset({"work"})
    status_code = 413
    error_type = "payload_too_large"


class SequenceTooLong(PayloadTooLarge):
    """One sequence is longer than the model accepts (protocols may answer it as 400)."""

    raised_on = frozenset({"work"})


class UnsupportedMediaType(ServiceError):
    when = (
        "`Content-Type` is not `application/json` (parameters such as `charset` are fine), a "
        "`Content-Encoding` other than `identity`, or a `Transfer-Encoding` other than "
        "`chunked`"
    )
    raised_on = frozenset({"work"})
    status_code = 415
    error_type = "unsupported_media_type"


class InvalidInput(ServiceError):
    when = (
        "well-formed JSON with bad content: the body is not an object; `inputs` missing, not "
        "a list or empty; a sequence that is empty, not rank 2, not `d` wide, ragged, not "
        "numbers, or holds NaN/±Inf or values beyond float32; bad base64, a `data` length "
        "that does not match `shape`, a dtype other than float32; a layer, head or "
        "hidden-state index out of range, repeated (`[0, 0]`, or `[0, -12]` on 12 heads), or "
        "an empty list of them; an unknown `pooling`, `reduce` or `encoding_format`; an "
        "unknown field; a model name of the repository API that no model directory can have "
        "(empty, over 255 bytes, a path, or starting with `.`); text the model's tokenizer "
        "cannot encode"
    )
    raised_on = frozenset({"guarded", "work", "admin"})  # guarded: a path parameter FastAPI refuses
    status_code = 422
    error_type = "invalid_input"


class UnsupportedByModel(InvalidInput):
    """The request asks a model for something it cannot do (e.g. text without a tokenizer)."""

    when = "text sent to a model without a tokenizer"
    raised_on = frozenset({"work"})
    error_type = "unsupported_by_model"


class LoadFailed(ServiceError):
    """A repository load or unload that could not be done; what served before still does."""

    when = (
        "`POST /v2/repository/models/{name}/load` of a directory that is not a valid model "
        "(manifest, file hashes, warm-up), does not fit `ATTNSERVE_MODEL_MEMORY_BYTES`, or "
        "with `ATTNSERVE_MODEL_CONTROL=none`; the version serving before still serves"
    )
    raised_on = frozenset({"admin"})
    status_code = 400
    error_type = "load_failed"


class Overloaded(ServiceError):
    when = (
        "`ATTNSERVE_MAX_QUEUED_REQUESTS` requests are already in progress, or the memory "
        "budget `ATTNSERVE_MAX_INFLIGHT_BYTES` is spent, or the large requests running would "
        "make this one miss its deadline (the message gives the estimate); retry "
        "after `Retry-After` seconds (the measured time to drain the queued work)"
    )
    raised_on = frozenset({"work"})
    status_code = 429
    error_type = "overloaded"


class ClientClosedRequest(ServiceError):
    """The client disconnected while its request waited; 499 as nginx logs it."""

    when = (
        "the client disconnected while its request waited; nobody receives it, it shows in "
        "logs and metrics (its work is dropped)"
    )
    raised_on = frozenset()
    status_code = 499
    error_type = "client_closed_request"


class NotReady(ServiceError):
    when = (
        "models still loading or warming up (on `/health/ready` also: saturated); retry after"
        " `Retry-After` seconds. On `/health/live`: the warm-up failed and the process can "
        "never serve (restart it)"
    )
    raised_on = frozenset({"open", "guarded", "work", "admin"})
    status_code = 503
    error_type = "not_ready"


class ShuttingDown(NotReady):
    """SIGTERM received: the node drains, new work goes elsewhere."""

    when = (
        "the server received SIGTERM (or a request or model load did not finish within "
        "the shutdown's grace window): send the request to another replica (`Retry-After`)"
    )
    raised_on = frozenset({"work", "admin"})
    error_type = "shutting_down"


class DeadlineExceeded(ServiceError):
    """The request's deadline passed before its answer; queued work was dropped."""

    when = (
        "the request's deadline (`ATTNSERVE_REQUEST_TIMEOUT`, or its `X-Request-Timeout`) "
        "passed before its answer; work still queued was dropped without running "
        "(`Retry-After`)"
    )
    raised_on = frozenset({"work"})
    status_code = 504
    error_type = "deadline_exceeded"


class CannotStart(RuntimeError):
    """The server refuses to start; whoever raises it has logged why in one line
    ("attnserve cannot start: …"), so the start-up failure shows no traceback."""


class ModelLoadError(CannotStart):
    """A model directory that cannot be served; the server refuses to start."""


# Errors the HTTP layer answers itself, in the native shape (service/app.py).
HTTP_ERRORS = (
    (404, "not_found", "no such path"),
    (405, "method_not_allowed", "wrong method for the path"),
)


def catalog() -> list[type[ServiceError]]:
    """Every error class, in the order of the tree above (each before its subclasses)."""
    found: list[type[ServiceError]] = []

    def walk(cls: type[ServiceError]) -> None:
        found.append(cls)
        for sub in cls.__subclasses__():
            walk(sub)

    walk(ServiceError)
    return found


def error_rows() -> list[tuple[int, str, str]]:
    """(status, error_type, when) of every error a client can see, by status: the one
    source of the error tables in docs/api.md and the OpenAPI schema."""
    rows = [
        (cls.status_code, cls.error_type, cls.when)
        for cls in catalog()
        if "when" in vars(cls)  # a subclass that only narrows its parent adds no row
    ]
    return sorted([*rows, *HTTP_ERRORS], key=lambda row: row[0])


def markdown_table() -> str:
    """The table of docs/api.md's "Errors" section (``python -m service.errors``)."""
    lines = ["| status | `error_type` | when |", "|---|---|---|"]
    lines += [f"| {status} | `{kind}` | {when} |" for status, kind, when in error_rows()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
