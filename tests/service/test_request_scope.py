"""Every route of every protocol goes through the engine's request scope.

The routes are enumerated from the app itself, so a route added without a scope
fails here. Against a real server with an API key, each route is then driven by
the rules the scope applies in one order: the key (401 on guarded and work
routes only), the client's timeout (400 when malformed, 504 when it has passed
before the work is queued) and admission; afterwards nothing is left held and
every request was counted under its route template.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from service.app import PROTOCOLS, create_app
from service.engine import Access
from service.settings import Settings
from tests.conftest import running_server
from tests.service.helpers import TIMEOUT
from tests.support.metrics import metric
from tests.support.tiny import D_MODEL, MODEL

KEY = "scope-test-key"
ADMIN_KEY = "scope-test-admin-key"  # the repository API's (ATTNSERVE_ADMIN_KEYS)
# Routes that belong to no protocol: the API docs and the attention viewer's page.
UNSCOPED = {"/openapi.json", "/docs", "/docs-assets", "/redoc", "/", "/viewer", "/viewer/static"}
ROW = [0.25] * D_MODEL
# A valid body per work route, and a concrete path per template.
# The tiny test model has no tokenizer: text and token ids are refused (after the scope's
# rules), with these statuses.
REFUSED_BY_MODEL = {"/v1/embeddings": 400, "/v1/tokenize": 422, "/v1/embed_sparse": 422}
TEI_TEXT_ROUTES = (
    "/", "/embed", "/embed/", "//embed", "/invocations", "/embed_all", "/embed_sparse", "/tokenize"
)  # fmt: skip
REFUSED_BY_MODEL |= dict.fromkeys((*TEI_TEXT_ROUTES, "/similarity", "/decode"), 422)
# The server's models are fixed (ATTNSERVE_MODEL_CONTROL=none): loads are refused.
REFUSED_BY_MODEL |= dict.fromkeys(
    ("/v2/repository/models/{model}/load", "/v2/repository/models/{model}/unload"), 400
)
BODIES = {
    "/v1/encode": {"inputs": [[ROW, ROW]]},
    "/v1/embeddings": {"input": [[1, 2, 3]], "model": MODEL},
    "/v1/tokenize": {"inputs": ["a few words"]},
    "/v1/embed_sparse": {"inputs": ["a few words"]},
    "/v2/models/{model}/infer": {
        "inputs": [{"name": "inputs_embeds", "datatype": "FP32", "shape": [1, 2, D_MODEL],
                    "data": ROW + ROW}],
    },
}  # fmt: skip
BODIES["/v2/models/{model}/versions/{version}/infer"] = BODIES["/v2/models/{model}/infer"]
BODIES |= {route: {"inputs": "a few words"} for route in TEI_TEXT_ROUTES}
BODIES["/similarity"] = {"inputs": {"source_sentence": "a", "sentences": ["b"]}}
BODIES["/decode"] = {"ids": [101, 102]}
# Rerank and classify: the tiny model has no head (refused, after the scope's rules).
BODIES["/v1/rerank"] = BODIES["/v2/rerank"] = {"query": "a", "documents": ["b"]}
BODIES["/rerank"] = {"query": "a", "texts": ["b"]}
BODIES["/predict"] = {"inputs": "a"}
BODIES["/v1/classify"] = {"inputs": ["a"]}
REFUSED_BY_MODEL |= dict.fromkeys(
    ("/v1/rerank", "/v2/rerank", "/rerank", "/predict", "/v1/classify"), 422
)
# Why two texts match: the tiny model has no tokenizer (refused, after the scope's rules).
BODIES["/v1/explain/similarity"] = {"query": "a", "documents": ["b"]}
REFUSED_BY_MODEL["/v1/explain/similarity"] = 422
# Late interaction: the tiny model keeps no vector per token (refused, after the rules).
BODIES["/v1/multi-vector"] = {"input": ["a"]}
REFUSED_BY_MODEL["/v1/multi-vector"] = 422
PATH_PARAMS = {"{name}": MODEL, "{model}": MODEL, "{version}": "1"}


def scoped_routes() -> list[tuple[str, str, Access]]:
    """(method, path template, access) of every route the protocols mount."""
    routes = []
    for protocol in PROTOCOLS:
        for router in protocol.routers:
            for route in router.routes:
                assert isinstance(route, APIRoute)
                access = getattr(route, "route_access", None)
                assert isinstance(access, Access), f"{route.path} does not enter the scope"
                method = "POST" if "POST" in route.methods else "GET"
                routes.append((method, route.path, access))
    return routes


ROUTES = scoped_routes()


def concrete(template: str) -> str:
    for param, value in PATH_PARAMS.items():
        template = template.replace(param, value)
    return template


def send(client: httpx.Client, method: str, template: str, **headers: str) -> httpx.Response:
    body = BODIES.get(template)
    return client.request(method, concrete(template), json=body, headers=headers)


def test_every_route_of_the_app_is_a_protocol_route_or_named_here() -> None:
    app = create_app(Settings(_env_file=None))
    protocol_routes = {(method, path) for method, path, _ in ROUTES}
    others = {
        route.path
        for route in app.routes
        if getattr(route, "path", None) is not None
        and not {(m, route.path) for m in getattr(route, "methods", None) or {"GET"}}
        & protocol_routes
    }
    assert others == UNSCOPED, "a new route must go through a protocol's scope"
    assert {access for *_, access in ROUTES} == set(Access)


@pytest.fixture(scope="module")
def keyed_url(model_repository: Path) -> Iterator[str]:
    with running_server(model_repository, api_key=KEY, admin_keys=ADMIN_KEY) as url:
        yield url


@pytest.fixture(scope="module")
def keyed(keyed_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=keyed_url, timeout=TIMEOUT) as client:
        yield client


# "//embed" (LlamaIndex's path with a trailing slash in its base URL) is not a path an
# HTTP client can be given relative to a base URL; test_tei.py calls it by full URL.
@pytest.mark.parametrize(
    ("method", "template", "access"),
    [r for r in ROUTES if not r[1].startswith("//")],
    ids=lambda v: str(v),
)
def test_the_scope_applies_key_then_timeout_then_deadline(
    keyed: httpx.Client, keyed_url: str, method: str, template: str, access: Access
) -> None:
    before = metric(keyed_url, "attnserve_requests_total", route=template)
    bearer = f"Bearer {ADMIN_KEY if access is Access.ADMIN else KEY}"

    anonymous = send(keyed, method, template, **{"x-request-timeout": "abc"})
    if access is Access.OPEN:
        assert anonymous.status_code == 200, anonymous.text  # open, and no timeout rule
    else:
        assert anonymous.status_code == 401, anonymous.text
        assert anonymous.headers["www-authenticate"] == "Bearer"

    malformed = send(keyed, method, template, authorization=bearer, **{"x-request-timeout": "abc"})
    passed = send(keyed, method, template, authorization=bearer, **{"x-request-timeout": "1e-9"})
    fine = send(keyed, method, template, authorization=bearer)
    if access is Access.WORK:
        assert malformed.status_code == 400, malformed.text
        assert "X-Request-Timeout" in malformed.text
        assert passed.status_code == 504, passed.text
        assert "retry-after" in passed.headers
    else:  # no timeout rule: the answer is the route's own
        answer = REFUSED_BY_MODEL.get(template, 200)
        assert malformed.status_code == passed.status_code == answer
    assert fine.status_code == REFUSED_BY_MODEL.get(template, 200), fine.text

    counted = metric(keyed_url, "attnserve_requests_total", route=template) - before
    scrapes = template == "/metrics"  # the first scrape above counts itself too
    assert counted == 4 + scrapes  # every request counted once, under its template
    assert metric(keyed_url, "attnserve_in_flight_requests") == 0
    assert metric(keyed_url, "attnserve_in_flight_bytes") == 0
