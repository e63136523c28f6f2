"""One version, pyproject.toml's, wherever the server or the SDK says one."""

from __future__ import annotations

import tomllib
from pathlib import Path

import httpx

from attnserve_client import _constants
from service.version import VERSION

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_version_is_pyprojects() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert VERSION == _constants.VERSION == declared
    assert f"attnserve-client/{declared}" == _constants.USER_AGENT


def test_the_server_reports_it_everywhere(http_client: httpx.Client) -> None:
    assert http_client.get("/v2").json()["version"] == VERSION  # Open Inference metadata
    assert http_client.get("/openapi.json").json()["info"]["version"] == VERSION
    assert http_client.get("/info").json()["version"] == f"attnserve {VERSION}"  # TEI
