"""schemathesis hooks of tests/service/test_fuzz_openapi.py (``SCHEMATHESIS_HOOKS=<this file>``).

The check ``v2_error_body``: every ``/v2`` answer with an error status has the
Open Inference Protocol error body docs/api.md documents, ``{"error": str,
"error_type": str}`` and nothing else, whether or not the OpenAPI schema lists
that status for that operation (schemathesis' own response_schema_conformance
checks only the statuses an operation documents, against what it documents).
Each answer it checks is recorded as ``METHOD path-template status`` in the file
named by ``ATTNSERVE_FUZZ_RECORD``, so the test can prove the check saw errors.

Generated path parameters name the served model (``ATTNSERVE_FUZZ_MODEL``) half
the time, so fuzzed ``/v2`` bodies reach the codec instead of all stopping at
404 on a random model name.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import jsonschema
import schemathesis

RECORD_ENV = "ATTNSERVE_FUZZ_RECORD"
MODEL_ENV = "ATTNSERVE_FUZZ_MODEL"
V2_ERROR_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}},
    "required": ["error", "error_type"],
    "additionalProperties": False,
}


@schemathesis.hook
def map_path_parameters(context: Any, path_parameters: dict[str, Any]) -> dict[str, Any]:
    """Random path parameters, or (for half of them, by a hash of the values, so a seed
    still replays) the same with the served model and its one version."""
    if not isinstance(path_parameters, dict):  # negative mode may generate anything
        return path_parameters
    if zlib.crc32(repr(sorted(path_parameters.items())).encode()) % 2:
        return path_parameters
    model = os.environ.get(MODEL_ENV, "tiny")
    served = {"model": model, "name": model, "version": "1"}  # name: /v1/models/{name}
    return {k: served.get(k, v) for k, v in path_parameters.items()}


@schemathesis.check
def v2_error_body(ctx: Any, response: Any, case: Any) -> bool | None:
    """A /v2 error answer is ``{"error": str, "error_type": str}``."""
    if not case.path.startswith("/v2") or response.status_code < 400:
        return None
    record = os.environ.get(RECORD_ENV)
    if record:
        with open(record, "a", encoding="utf-8") as f:
            f.write(f"{case.method.upper()} {case.path} {response.status_code}\n")
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise AssertionError(
            f"/v2 error {response.status_code} is not JSON: {response.content[:200]!r}"
        ) from exc
    try:
        jsonschema.validate(body, V2_ERROR_BODY)
    except jsonschema.ValidationError as exc:
        raise AssertionError(
            f"/v2 error {response.status_code} body {body!r:.200} breaks the documented "
            f"schema: {exc.message}"
        ) from exc
    return True
