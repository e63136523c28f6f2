"""The server's version, read once from the installed package's metadata (pyproject.toml's
``version``, its only source): the OpenAPI, the Open Inference Protocol's server metadata
and TEI's ``/info`` all say this."""

from __future__ import annotations

from importlib.metadata import version
from typing import Final

VERSION: Final = version("attnserve")
