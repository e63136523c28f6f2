"""Readiness means a request can be served: a server whose every model was unloaded
(explicit or poll mode) is not ready, on every protocol's readiness route, until a
model is loaded again (issue 37)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import server_process
from tests.support.tiny import MODEL

READY_ROUTES = ("/health/ready", "/v2/health/ready", "/health")  # native, KServe V2, TEI


def test_not_ready_while_no_model_is_loaded(model_repository: Path) -> None:
    with server_process(model_repository, model_control="explicit") as server:
        url = server.url
        for route in READY_ROUTES:
            assert httpx.get(f"{url}{route}", timeout=5).status_code == 200, route

        unloaded = httpx.post(f"{url}/v2/repository/models/{MODEL}/unload", timeout=30)
        assert unloaded.status_code == 200, unloaded.text
        work = httpx.post(f"{url}/v1/encode", json={"inputs": [[[0.5] * 32]]}, timeout=30)
        assert work.status_code == 404, work.text  # what readiness must not hide
        for route in READY_ROUTES:
            r = httpx.get(f"{url}{route}", timeout=5)
            assert r.status_code == 503, (route, r.text)
            assert "no model is loaded" in r.text, (route, r.text)
            assert float(r.headers["retry-after"]) > 0
        assert httpx.get(f"{url}/health/live", timeout=5).status_code == 200  # not dead

        loaded = httpx.post(f"{url}/v2/repository/models/{MODEL}/load", timeout=30)
        assert loaded.status_code == 200, loaded.text
        for route in READY_ROUTES:
            assert httpx.get(f"{url}{route}", timeout=5).status_code == 200, route
