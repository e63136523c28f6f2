"""Defaults of the SDK, in one place (timeouts, retry policy, environment names)."""

from __future__ import annotations

from importlib.metadata import version
from typing import Final

# The installed distribution's version (pyproject.toml's, its one source): the SDK and the
# server ship together.
VERSION: Final = version("attnserve")
USER_AGENT: Final = f"attnserve-client/{VERSION}"

ENV_BASE_URL: Final = "ATTNSERVE_BASE_URL"
ENV_API_KEY: Final = "ATTNSERVE_API_KEY"
DEFAULT_BASE_URL: Final = "http://127.0.0.1:8000"

DEFAULT_TIMEOUT: Final = 60.0  # seconds, per request; attention maps of long inputs take a while
DEFAULT_CONNECT_TIMEOUT: Final = 5.0

DEFAULT_MAX_RETRIES: Final = 2
INITIAL_RETRY_DELAY: Final = 0.5  # seconds; doubles per attempt
MAX_RETRY_DELAY: Final = 8.0
MAX_RETRY_AFTER: Final = 60.0  # a server's Retry-After above this is not honoured as-is
# Transient statuses only: 4xx validation errors are the caller's to fix, never retried.
RETRY_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})

DEFAULT_BATCH_SIZE: Final = 32  # sequences per request in encode_many
DEFAULT_CONCURRENCY: Final = 4  # requests in flight in encode_many
