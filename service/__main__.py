"""``python -m service`` / ``attnserve-serve``: run the server, settings from the environment."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from service import logs
from service.app import create_app
from service.server import build_server, warn_if_exposed
from service.settings import Settings


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"attnserve: invalid settings (ATTNSERVE_*):\n{exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    warn_if_exposed(settings)
    app = create_app(settings)
    server = build_server(settings, app, app.state.engine)
    server.run()
    # uvicorn returns normally when startup fails (e.g. a corrupt model): report it as failure.
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
