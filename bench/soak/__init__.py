"""Soak: many clients mixing good, bad, huge, slow and abandoned requests, for a bounded time.

One real server (``python -m service``, started by ``bench.lib.server.running_server``)
on 127.0.0.1; this process runs ``--clients`` concurrent clients, each drawing
its next request from a mix of classes, plus ``--slow-clients`` that trickle
their bodies:

    valid             1-4 sequences, ragged, unique random content, base64 or nested
                      floats both ways: every 2xx answer is checked against
                      onnxruntime run here, in-process, on the same ONNX graph (atol)
    valid+attention   the same with ``return_attention`` (reduce mean): embeddings
                      and head-averaged maps checked
    invalid           bad JSON, wrong width, NaN (in JSON and in base64), empty
                      sequence, unknown field, unknown model, bad base64, text/plain:
                      expected 4xx
    oversized         too many sequences, a sequence past the model's length, too
                      many tokens, a body past the limit: expected 413 (a body past
                      the limit may also be cut off by the server closing)
    slow              a valid request whose body (or headers) are sent a few bytes
                      at a time over ``--slow-seconds``, longer than the server's body
                      (header) timeout: expected 408 or the server closing; a 2xx (the
                      request beat the timeout) is checked like a valid answer
    abandoned         a request sent whole or half, then the socket closed without
                      reading: nothing expected, except that the server survives

Failures (any makes the CLI exit 1): a wrong 2xx answer; a lost request (a
connection error, a timeout or no answer where one is due: valid, invalid and
oversized requests, and slow ones whose body was sent whole); a 5xx other than
503/504; a 429/503/504 without Retry-After; a 2xx to an invalid or oversized
request; a 4xx to a valid one; the server dead or unready after the soak; its
RSS grown beyond ``--max-rss-growth-mb`` between the end of the warm-up and the
end of the run. Loops are bounded by time, each request by a timeout.

    .venv/bin/python -m bench.soak --seconds 60 --clients 16

Without ``--model-dir`` it serves ``models/minilm-l6`` if exported, else the
``tiny`` test model exported to a temporary directory (needs the export extra).

The soak sets its server's limits small, from the model (MAX_SEQUENCES,
MAX_TOKENS, MAX_BODY_BYTES: oversized requests stay cheap to send),
MAX_QUEUED_REQUESTS to half the clients (so load is shed, and the Retry-After of
each 429 checked) and BODY_TIMEOUT and HEADER_TIMEOUT to ``--body-timeout``; the
report prints every setting. A failure names its class, variant and request id:
``Requests(Limits.for_model(manifest), seed).make(rid, cls, variant)`` rebuilds
that very request.
"""

from __future__ import annotations

from bench.lib.http import Answer
from bench.soak.clients import Soak
from bench.soak.config import (
    ABANDONED,
    ATTENTION,
    CLASSES,
    INVALID,
    OVERSIZED,
    SLOW,
    VALID,
    Limits,
    SoakConfig,
)
from bench.soak.reference import Reference
from bench.soak.report import Failure, SoakReport
from bench.soak.requests import Planned, Requests
from bench.soak.run import run_soak

__all__ = [
    "ABANDONED",
    "ATTENTION",
    "CLASSES",
    "INVALID",
    "OVERSIZED",
    "SLOW",
    "VALID",
    "Answer",
    "Failure",
    "Limits",
    "Planned",
    "Reference",
    "Requests",
    "Soak",
    "SoakConfig",
    "SoakReport",
    "run_soak",
]
