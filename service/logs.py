"""Logging for the service and uvicorn: readable lines or JSON lines, with request ids.

Every record carries ``request_id`` (``-`` outside a request), taken from the
context variable the request middleware sets, so the access log and our own
lines of one request can be joined.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from service.engine.scope import request_id_var

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request_id, and for
    access logs the protocol (``http``: uvicorn's; ``grpc``: ours) (+ exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        protocol = getattr(record, "protocol", "http" if record.name == "uvicorn.access" else None)
        if protocol is not None:
            entry["protocol"] = protocol
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """Route every logger (uvicorn's included) to one stderr handler in ``fmt``."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
