"""/viewer over plain HTTP: where it lives, what it may load, and that it stays public."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from service.viewer import STATIC

ASSETS = ("viewer.js", "api.js", "heatmap.js", "npy.js", "viewer.css")
JS = "text/javascript"
IGNORED = shutil.ignore_patterns("__pycache__")


def test_root_redirects_to_the_viewer_with_a_relative_location(http_client: httpx.Client) -> None:
    for method in ("GET", "HEAD"):
        answer = http_client.request(method, "/", headers={"Host": "evil.example"})
        assert answer.status_code == 307
        assert answer.headers["location"] == "/viewer"  # nothing taken from the Host header


def test_root_redirect_keeps_the_deep_link_query(http_client: httpx.Client) -> None:
    """``/?text=…`` is a shared deep link: the redirect must carry its query along."""
    query = "text=The%20cat%20sat.&layer=2&head=-1&view=grid"
    answer = http_client.get(f"/?{query}", headers={"Host": "evil.example"})
    assert answer.status_code == 307
    assert answer.headers["location"] == f"/viewer?{query}"


def test_root_redirect_cannot_be_turned_into_an_open_redirect(http_client: httpx.Client) -> None:
    # The query is appended after "/viewer?", so no client input can change the path or host.
    answer = http_client.get("/?//evil.example/%0d%0aSet-Cookie:x=1")
    assert answer.status_code == 307
    location = answer.headers["location"]
    assert location.startswith("/viewer?")
    assert "\r" not in location and "\n" not in location
    assert "set-cookie" not in {name.lower() for name in answer.headers if name != "location"}


def test_viewer_page_is_locked_to_this_origin(http_client: httpx.Client) -> None:
    answer = http_client.get("/viewer")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    policy = answer.headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "connect-src 'self'"):
        assert directive in policy
    assert "unsafe-inline" not in policy and "*" not in policy
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert http_client.head("/viewer").status_code == 200


@pytest.mark.parametrize("asset", ASSETS)
def test_assets_are_served_with_their_types(http_client: httpx.Client, asset: str) -> None:
    answer = http_client.get(f"/viewer/static/{asset}")
    assert answer.status_code == 200
    # A module script with another type is refused by the browser.
    assert answer.headers["content-type"].startswith(JS if asset.endswith(".js") else "text/css")
    assert answer.content == (STATIC / asset).read_bytes()


def test_page_and_scripts_name_no_other_host() -> None:
    # Every URL in the page and its modules is relative, so the page also works behind
    # a path prefix, and nothing points at another host.
    for path in STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"""["'`(]\s*(?:https?:)?//""", text), path.name
    html = (STATIC / "index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == [
        "data:,",
        "viewer/static/viewer.css",
        "viewer/static/viewer.js",
        "docs",
    ]


def test_no_static_file_escapes_its_folder(http_client: httpx.Client) -> None:
    assert http_client.get("/viewer/static/../__init__.py").status_code == 404
    assert http_client.get("/viewer/static/%2e%2e/__init__.py").status_code == 404


def test_viewer_is_not_in_the_api_schema(http_client: httpx.Client) -> None:
    paths = http_client.get("/openapi.json").json()["paths"]
    assert not any(p == "/" or p.startswith("/viewer") for p in paths)


def test_static_files_ship_in_the_wheel(tmp_path: Path) -> None:
    # Built from a copy of the sources, so the checkout gets no build/ folder.
    repo = Path(__file__).parents[2]
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, source / name)
    for package in ("service", "model_export", "attnserve_client"):
        shutil.copytree(repo / package, source / package, ignore=IGNORED)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in STATIC.iterdir():
        assert f"service/viewer/static/{path.name}" in names
