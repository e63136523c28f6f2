"""The attention viewer: ``/viewer``, a page that draws what the encoder attends to.

The page is plain HTML, CSS and JavaScript modules shipped in this package (no
build step, no third-party code) and talks to the server only through the public
API (``/v1/models``, ``/v1/encode``, ``/v1/tokenize``, ``/v1/rerank``,
``/v1/embed_sparse``, ``/v1/explain/similarity``), as any other client does. Its
Content-Security-Policy allows requests to this origin only, so the browser
itself refuses anything that would leave for another host.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
PAGE_PATH = "/viewer"
ASSETS_PATH = "/viewer/static"

# Scripts, styles and requests from this origin only; images also from the canvas's
# own data:/blob: URLs (the PNG download). No inline script, no framing.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page is small and changes with the package: always revalidate.
    "Cache-Control": "no-cache",
}


def add_viewer(app: FastAPI) -> None:
    """Serve the viewer at ``/viewer`` (``/`` redirects there), its files under /viewer/static."""
    app.mount(ASSETS_PATH, StaticFiles(directory=STATIC), name="viewer-static")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def home(request: Request) -> RedirectResponse:
        # A relative Location: nothing built from the client's Host header. A deep link
        # (/?text=...) keeps its query; the query is already percent-encoded on the wire
        # and follows "?", so it can change neither the path nor the host.
        query = request.url.query
        return RedirectResponse(f"{PAGE_PATH}?{query}" if query else PAGE_PATH, status_code=307)

    @app.api_route(PAGE_PATH, methods=["GET", "HEAD"], include_in_schema=False)
    async def viewer() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=PAGE_HEADERS)
