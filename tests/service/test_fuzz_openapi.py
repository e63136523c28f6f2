"""Property-based fuzzing of every route from the server's own OpenAPI schema.

schemathesis generates requests (valid and invalid) for each operation and
checks every answer: no 5xx, responses that match their documented schema and
status codes, and so on. "positive_data_acceptance" is left out on purpose:
the schema cannot say that a sequence must be d_model wide or that text needs
a model with a tokenizer, so some schema-valid bodies are rightly refused with
422. Bounded: a fixed number of examples per operation, a fixed seed, on
127.0.0.1 only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES_PER_OPERATION = 40


def test_no_route_breaks_its_contract_under_fuzzing(server_url: str) -> None:
    schemathesis = Path(sys.executable).parent / "schemathesis"
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
    )
    summary = result.stdout[-3000:]
    assert result.returncode == 0, summary
    assert " passed" in summary and "generated" in summary, summary
