"""``/docs`` (Swagger UI) and ``/redoc`` from files installed with the service.

FastAPI's defaults load their JS and CSS from a CDN, so on a machine without
internet the pages are blank, and elsewhere they make the browser ask another
host. The PyPI package fastapi-offline ships both bundles (MIT); they are served
here under ``/docs-assets``.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).parent / "static"
ASSETS_PATH = "/docs-assets"
# Both pages start their bundle from an inline script and style themselves inline;
# everything else must come from this origin. The browser then refuses what the
# bundles would still fetch from elsewhere (ReDoc's logo from cdn.redoc.ly).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'"
)


def add_api_docs(app: FastAPI) -> None:
    """Serve the API docs pages and their assets; ``app`` must have docs_url=None."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _locked(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{app.title}: API",
                swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
                swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
                swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
                # Swagger UI's default sends the schema to validator.swagger.io for a badge
                # whenever the page's host is not localhost.
                swagger_ui_parameters={"validatorUrl": None},
            )
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _locked(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{app.title}: API",
                redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
                redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
                with_google_fonts=False,
            )
        )


def _locked(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page
