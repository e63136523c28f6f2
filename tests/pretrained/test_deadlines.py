"""Deadlines (``X-Request-Timeout``) on a real all-MiniLM-L6-v2 server on 127.0.0.1.

A small request queued behind long attention requests is dropped at its deadline
(504 ``deadline_exceeded`` with a computed Retry-After) while every long one is
answered; alone, the same request is answered. Every protocol honours the header
and refuses a malformed one with its own 400.

The small request sends token embeddings, not text: a text is embedded by the model
while being prepared, which waits for the running inference (one onnxruntime run at a
time), so its deadline would pass before it was ever queued, a different path.

No speed is asserted. The long requests only have to outlast a 0.2 s deadline: the
small one is sent once a run of them has started and more are queued, and each run
of theirs (two requests of 8 x 256 tokens with attention) takes about 2 s on 2 cores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import running_server
from tests.support.metrics import metric
from tests.support.wait import wait_until

MODEL = "minilm-l6"
LONG_REQUESTS = 6
TEXTS_PER_REQUEST = 8
D_MODEL = 384
SHORT = "A short sentence about deadlines."
# Four token embeddings [4, d_model]: prepared without the model (see the docstring).
SMALL = {"inputs": [[[0.01 * ((i * 7 + j) % 11) for j in range(D_MODEL)] for i in range(4)]]}
TIMEOUT = httpx.Timeout(120.0)


def deadline_refusals(url: str) -> float:
    return metric(url, "attnserve_refusals_total", reason="deadline")


def long_body(k: int) -> dict[str, Any]:
    """Eight distinct texts cut to the model's 256 tokens, with the full attention graph
    run (every layer's and head's maps: only their rollout is returned, so the answers
    stay ~2 MB; one layer's maps would run the lighter selected-maps graph)."""
    texts = [
        f"Request {k}, text {j}: " + "the committee reviewed every clause of the long report " * 60
        for j in range(TEXTS_PER_REQUEST)
    ]
    return {
        "inputs": texts,
        "truncate": True,
        "return_attention": True,
        "attention": {"reduce": "rollout"},
        "return_embeddings": False,
        "encoding_format": "base64",
    }


def assert_retry_after(response: httpx.Response) -> None:
    value = response.headers.get("retry-after", "")
    assert value.isdigit() and int(value) >= 1, response.headers


@dataclass
class Behind:
    long: list[httpx.Response]
    small: httpx.Response
    refusals: float  # attnserve_refusals_total{reason="deadline"} added meanwhile


@pytest.fixture(scope="module")
def behind_long_requests(minilm_server_url: str) -> Behind:
    url = minilm_server_url
    refusals = deadline_refusals(url)
    runs = metric(url, "attnserve_queue_seconds_count")  # requests that have started a run
    with ThreadPoolExecutor(LONG_REQUESTS) as pool:
        long = [
            pool.submit(httpx.post, f"{url}/v1/encode", json=long_body(k), timeout=TIMEOUT)
            for k in range(LONG_REQUESTS)
        ]
        # A run of long requests is under way and more of them wait behind it.
        wait_until(
            lambda: (
                metric(url, "attnserve_queue_seconds_count") > runs
                and metric(url, "attnserve_queued_requests") >= 2
            ),
            "no run under way with two requests queued",
            timeout=60,
            interval=0.02,
        )
        small = httpx.post(
            f"{url}/v1/encode", json=SMALL, headers={"X-Request-Timeout": "0.2"}, timeout=TIMEOUT
        )
        answers = [future.result() for future in long]
    return Behind(answers, small, deadline_refusals(url) - refusals)


def test_a_small_request_behind_long_ones_gets_504_at_its_deadline(
    behind_long_requests: Behind,
) -> None:
    small = behind_long_requests.small
    assert small.status_code == 504, small.text
    assert small.json()["error_type"] == "deadline_exceeded"
    assert_retry_after(small)
    for answer in behind_long_requests.long:
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["data"]) == TEXTS_PER_REQUEST


def test_the_dropped_request_counts_as_a_deadline_refusal(behind_long_requests: Behind) -> None:
    assert behind_long_requests.refusals == 1


@pytest.mark.parametrize("body", [SMALL, {"inputs": [SHORT]}], ids=["embeddings", "text"])
def test_the_same_request_alone_is_answered(minilm_server_url: str, body: dict[str, Any]) -> None:
    r = httpx.post(
        f"{minilm_server_url}/v1/encode",
        json=body,
        headers={"X-Request-Timeout": "0.2"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 1


# -- every protocol -----------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    path: str
    body: dict[str, Any]
    error_type: Callable[[dict[str, Any]], str]  # the machine type, read from its error body
    heads: bool = False  # served by a model with a head (a reranker), not MiniLM
    late: bool = False  # served by a late-interaction model, not MiniLM


# TEI's error kinds are its own (TEI has no deadlines or header rules): the engine's
# 504 is "Backend" there and a malformed header "Validation".
TEI_KINDS = {"Backend": "deadline_exceeded", "Validation": "invalid_header"}
# Every POST route of every protocol (checked against the OpenAPI paths below).
PROTOCOLS = {
    "native": Protocol("/v1/encode", {"inputs": [SHORT]}, lambda body: body["error_type"]),
    "native-tokenize": Protocol(
        "/v1/tokenize",
        {"text": [SHORT], "return_embeddings": True},
        lambda body: body["error_type"],
    ),
    "native-sparse": Protocol(
        "/v1/embed_sparse", {"inputs": [SHORT]}, lambda body: body["error_type"]
    ),
    "native-similarity": Protocol(
        "/v1/explain/similarity",
        {"query": SHORT, "documents": [SHORT]},
        lambda body: body["error_type"],
    ),
    **{
        f"tei{path.replace('/', '-')}": Protocol(path, body, lambda b: TEI_KINDS[b["error_type"]])
        for path, body in (
            ("/", {"inputs": SHORT}),
            ("/embed", {"inputs": [SHORT]}),
            ("/embed_all", {"inputs": SHORT}),
            ("/embed_sparse", {"inputs": [SHORT]}),
            ("/similarity", {"inputs": {"source_sentence": SHORT, "sentences": [SHORT]}}),
            ("/invocations", {"inputs": [SHORT]}),
            ("/tokenize", {"inputs": [SHORT]}),
            ("/decode", {"ids": [101, 7592, 102]}),
        )
    },
    **{
        f"tei{path.replace('/', '-')}": Protocol(
            path, body, lambda b: TEI_KINDS[b["error_type"]], heads=True
        )
        for path, body in (
            ("/rerank", {"query": SHORT, "texts": [SHORT]}),
            ("/predict", {"inputs": SHORT}),
        )
    },
    "native-rerank": Protocol(
        "/v1/rerank",
        {"query": SHORT, "documents": [SHORT]},
        lambda body: body["error_type"],
        heads=True,
    ),
    "native-multi-vector": Protocol(
        "/v1/multi-vector", {"input": [SHORT]}, lambda body: body["error_type"], late=True
    ),
    "native-classify": Protocol(
        "/v1/classify", {"inputs": [SHORT]}, lambda body: body["error_type"], heads=True
    ),
    "openai": Protocol(
        "/v1/embeddings", {"model": MODEL, "input": [SHORT]}, lambda body: body["error"]["code"]
    ),
    "kserve-v2": Protocol(
        f"/v2/models/{MODEL}/infer",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [SHORT]}]},
        lambda body: body["error_type"],
    ),
    "kserve-v2-versioned": Protocol(
        f"/v2/models/{MODEL}/versions/1/infer",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [SHORT]}]},
        lambda body: body["error_type"],
    ),
}


def test_every_post_route_is_covered(minilm_server_url: str) -> None:
    """A new inference route must join PROTOCOLS, so its deadline handling is tested."""
    paths = httpx.get(f"{minilm_server_url}/openapi.json", timeout=10).json()["paths"]
    posted = {
        path.replace("{model}", MODEL).replace("{version}", "1")
        for path, operations in paths.items()
        if "post" in operations
    }
    # TEI's POST / (= /embed, kept out of the schema beside the viewer's GET /) and
    # SageMaker's /invocations (= /embed too).
    hidden = {"/", "/invocations"}
    posted = {path for path in posted if not path.startswith("/v2/repository/")}  # admin
    assert posted == {protocol.path for protocol in PROTOCOLS.values()} - hidden


@pytest.fixture(scope="module")
def reranker_url(head_models: tuple[Path, dict[str, Path]]) -> Iterator[str]:
    """The head models' server, a reranker by default (TEI's /rerank and /predict)."""
    with running_server(head_models[0], default_model="bert-reranker") as url:
        yield url


@pytest.fixture(scope="module")
def late_interaction_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of a late-interaction model (the MultiVectorEncoder layout)."""
    from tests.support.late_interaction import LAYOUTS, export_all

    root = tmp_path_factory.mktemp("late-deadlines")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        checkpoint = LAYOUTS["multi_vector_encoder"](root / "checkpoint")
    repository = export_all({"multi_vector_encoder": checkpoint}, root / "models")
    with running_server(repository) as url:
        yield url


def url_of(request: pytest.FixtureRequest, protocol: Protocol) -> str:
    """The server that serves ``protocol``'s route: MiniLM, the reranker's, or a
    late-interaction model's."""
    fixture = "minilm_server_url"
    if protocol.heads:
        fixture = "reranker_url"
    elif protocol.late:
        fixture = "late_interaction_url"
    url: str = request.getfixturevalue(fixture)
    return url


def post(url: str, protocol: Protocol, timeout: str) -> httpx.Response:
    return httpx.post(
        f"{url}{protocol.path}",
        json=protocol.body,
        headers={"X-Request-Timeout": timeout},
        timeout=TIMEOUT,
    )


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_protocol_answers_504_past_the_deadline(
    request: pytest.FixtureRequest, name: str
) -> None:
    """A microsecond has passed before the request can be queued: 504, never run."""
    protocol = PROTOCOLS[name]
    url = url_of(request, protocol)
    refusals = deadline_refusals(url)
    r = post(url, protocol, "0.000001")
    assert r.status_code == 504, r.text
    assert protocol.error_type(r.json()) == "deadline_exceeded"
    if name == "openai":
        assert r.json()["error"]["type"] == "server_error"
    assert_retry_after(r)
    assert deadline_refusals(url) == refusals + 1


@pytest.mark.parametrize("name", list(PROTOCOLS))
@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf", "86401", ""])
def test_every_protocol_refuses_a_malformed_header(
    request: pytest.FixtureRequest, name: str, value: str
) -> None:
    protocol = PROTOCOLS[name]
    r = post(url_of(request, protocol), protocol, value)
    assert r.status_code == 400, r.text
    assert protocol.error_type(r.json()) == "invalid_header"
    assert "X-Request-Timeout" in r.text


@pytest.mark.parametrize("name", list(PROTOCOLS))
@pytest.mark.parametrize("value", ["86400", "1e3", "30"])
def test_every_protocol_accepts_a_well_formed_header(
    request: pytest.FixtureRequest, name: str, value: str
) -> None:
    """Up to a day is accepted (the server's ATTNSERVE_REQUEST_TIMEOUT caps it anyway)."""
    protocol = PROTOCOLS[name]
    r = post(url_of(request, protocol), protocol, value)
    assert r.status_code == 200, r.text
