"""``python -m service`` / ``attnserve-serve``: run the server, settings from the environment."""

from __future__ import annotations

import logging
import sys

from pydantic import ValidationError

from service import exports, logs
from service.app import create_app
from service.server import build_server, warn_if_exposed
from service.settings import Settings

INVALID_SETTINGS = 2  # an ATTNSERVE_* value is refused
CANNOT_START = 3  # the models cannot be served, or the address cannot be listened on


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"attnserve: invalid settings (ATTNSERVE_*):\n{exc}", file=sys.stderr)
        return INVALID_SETTINGS
    logs.configure(settings.log_level, settings.log_format)
    warn_if_exposed(settings)
    try:
        # ATTNSERVE_EXPORT_MODELS: exported before anything listens, so never ready before.
        settings = exports.prepare(settings)
    except exports.ExportRefused as exc:
        logging.getLogger("service").error("attnserve cannot start: %s", exc)
        return CANNOT_START
    app = create_app(settings)
    server = build_server(settings, app, app.state.engine)
    try:
        server.run()
    except SystemExit as exc:
        # uvicorn exits by itself when the app cannot start (sys.exit(3): a missing, corrupt
        # or refused model) or cannot listen (sys.exit(1): the port is taken).
        return CANNOT_START if exc.code else 0
    return 0 if server.started else CANNOT_START


if __name__ == "__main__":
    sys.exit(main())
