"""``python -m service`` / ``attnserve-serve``: run the server, settings from the environment."""

from __future__ import annotations

import logging
import sys

import uvicorn

from service.app import create_app
from service.settings import Settings


def main() -> int:
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    server.run()
    # uvicorn returns normally when startup fails (e.g. a corrupt model): report it as failure.
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
