"""/docs and /redoc work with no internet: every asset the pages load comes from us."""

from __future__ import annotations

import re

import httpx
import pytest

# src="..." and href="..." in the page, plus a bare JS/CSS URL string (Swagger's config).
REFERENCES = re.compile(r"""(?:src|href)=["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""")


def references(html: str) -> list[str]:
    return [a or b for a, b in REFERENCES.findall(html)]


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        ("/docs", ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")),
        ("/redoc", ("redoc.standalone.js", "favicon.png")),
    ],
)
def test_docs_pages_load_everything_from_this_server(
    http_client: httpx.Client, page: str, assets: tuple[str, ...]
) -> None:
    answer = http_client.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    html = answer.text
    found = references(html)
    # Nothing from another host: every reference is a path on this server.
    assert found and all(ref.startswith("/") for ref in found), found
    assert "cdn.jsdelivr.net" not in html and "fonts.googleapis.com" not in html
    for asset in assets:
        assert f"/docs-assets/{asset}" in found
        served = http_client.get(f"/docs-assets/{asset}")
        assert served.status_code == 200
        assert len(served.content) > 1000  # the real bundle, not an error page
    assert "/openapi.json" in html
    assert http_client.get("/openapi.json").json()["info"]["title"] == "attnserve"


def test_docs_assets_are_not_in_the_api_schema(http_client: httpx.Client) -> None:
    paths = http_client.get("/openapi.json").json()["paths"]
    assert not any(p.startswith(("/docs", "/redoc")) for p in paths)
