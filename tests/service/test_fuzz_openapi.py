"""Property-based fuzzing of every route from the server's own OpenAPI schema.

schemathesis generates requests (valid and invalid) for each operation and
checks every answer: no 5xx, responses that match their documented schema and
status codes, and so on. "positive_data_acceptance" is left out on purpose:
the schema cannot say that a sequence must be d_model wide or that text needs
a model with a tokenizer, so some schema-valid bodies are rightly refused with
422. Bounded: a fixed number of examples per operation, a fixed seed, on
127.0.0.1 only.

The ``/v2`` error answers are checked against the body docs/api.md documents,
``{"error": str, "error_type": str}``, twice: the OpenAPI schema must document
exactly that body for every error status of every ``/v2`` operation (so
schemathesis' conformance check holds the answers to it), and the hook check
``v2_error_body`` (tests/service/fuzz_hooks.py) holds every ``/v2`` error answer
of the fuzz to it, documented status or not, and records what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import jsonschema
import pytest

from tests.service import fuzz_hooks
from tests.support.tiny import MODEL

EXAMPLES_PER_OPERATION = 40
HOOKS = Path(fuzz_hooks.__file__)
ERROR = {"error": "model 'x' is not served here", "error_type": "model_not_found"}
NOT_AN_ERROR_BODY: list[Any] = [
    {"error": "no type"},
    {"error_type": "no message"},
    {**ERROR, "detail": "an extra key"},
    {"error": 1, "error_type": "model_not_found"},
    {"detail": [{"loc": ["body"], "msg": "field required", "type": "missing"}]},  # FastAPI's
    "not an object",
]


@pytest.mark.slow  # about 13 s on 2 cores, more under load: every route fuzzed
def test_no_route_breaks_its_contract_under_fuzzing(server_url: str, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).parent / "schemathesis"
    record = tmp_path / "v2-errors.txt"
    result = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{server_url}/openapi.json",
            "--max-examples",
            str(EXAMPLES_PER_OPERATION),
            "--seed",
            "1",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": str(HOOKS),
            fuzz_hooks.RECORD_ENV: str(record),
            fuzz_hooks.MODEL_ENV: MODEL,
        },
    )
    summary = result.stdout[-3000:]
    assert result.returncode == 0, summary
    assert " passed" in summary and "generated" in summary, summary
    # The /v2 error check ran, and on the errors that matter: unknown models on every
    # operation that names one, and refused infer bodies.
    seen = Counter(line.rsplit(" ", 1)[0] for line in record.read_text().splitlines())
    for operation in (
        "GET /v2/models/{model}",
        "GET /v2/models/{model}/ready",
        "POST /v2/models/{model}/infer",
        "POST /v2/models/{model}/versions/{version}/infer",
    ):
        assert seen[operation] > 0, (operation, seen)
    # Refused bodies (400, 422), unknown models (404), and a status no /v2 operation
    # documents (405: its body is held to the schema by the hook alone).
    statuses = {line.rsplit(" ", 1)[1] for line in record.read_text().splitlines()}
    assert {"400", "404", "405", "422"} <= statuses, statuses


@pytest.fixture(scope="module")
def openapi(server_url: str) -> dict[str, Any]:
    r = httpx.get(f"{server_url}/openapi.json", timeout=30.0)
    assert r.status_code == 200
    schema: dict[str, Any] = r.json()
    return schema


def v2_error_schemas(openapi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``METHOD path status`` -> the JSON schema the OpenAPI documents for that /v2 error."""
    found = {}
    for route, operations in openapi["paths"].items():
        if not route.startswith("/v2"):
            continue
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    found[f"{method.upper()} {route} {status}"] = schema
    return found


def test_openapi_documents_the_v2_error_body(openapi: dict[str, Any]) -> None:
    """Every documented /v2 error status has the body docs/api.md gives, and only it."""
    schemas = v2_error_schemas(openapi)
    infer = {k for k in schemas if k.startswith("POST /v2/models/{model}/infer ")}
    assert {f"POST /v2/models/{{model}}/infer {s}" for s in (400, 404, 413, 422, 429)} <= infer
    for where, schema in schemas.items():
        # The component schemas ride along so "#/components/schemas/..." resolves.
        validator = jsonschema.Draft202012Validator({**schema, "components": openapi["components"]})
        assert validator.is_valid(ERROR), where
        for body in NOT_AN_ERROR_BODY:
            assert not validator.is_valid(body), (where, body)


def answer(status: int, content: bytes) -> SimpleNamespace:
    """What the hook reads of a schemathesis response."""
    return SimpleNamespace(status_code=status, content=content)


@pytest.mark.parametrize("body", NOT_AN_ERROR_BODY)
def test_the_v2_error_check_can_fail(body: Any) -> None:
    infer = SimpleNamespace(path="/v2/models/{model}/infer", method="post")
    assert fuzz_hooks.v2_error_body(None, answer(404, json.dumps(ERROR).encode()), infer)
    bad = answer(422, json.dumps(body).encode())
    with pytest.raises(AssertionError, match="documented schema"):
        fuzz_hooks.v2_error_body(None, bad, infer)
    with pytest.raises(AssertionError, match="not JSON"):
        fuzz_hooks.v2_error_body(None, answer(500, b"Internal Server Error"), infer)
    native = SimpleNamespace(path="/v1/encode", method="post")
    assert fuzz_hooks.v2_error_body(None, bad, native) is None  # /v2 only
