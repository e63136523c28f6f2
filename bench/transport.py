"""SDK transports side by side: binary tensors (/v2 infer) against base64 JSON (/v1/encode).

One server (``python -m service``) on 127.0.0.1; the SDK's ``Client`` in this
process sends the same [8, 128] batch with ``wire_format="binary"`` and
``"base64"``, interleaved round by round (the machine is shared and noisy), with
and without attention. Reported: median wall ms per call, the ratio binary /
base64 (below 1: binary is faster), and the bytes each moves. Loops are
bounded by ``--calls`` per round.

    .venv/bin/python -m bench.transport --model-dir models/minilm-l6

Writes ``bench/out/transport.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np

from attnserve_client import Client
from bench.lib.models import DEFAULT_MODEL_DIR, OUT, model_config
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_server


class CountingTransport(httpx.HTTPTransport):
    """Counts the bytes of request and response bodies."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = self.received = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        self.sent += len(request.content)
        self.received += len(response.content)
        return response


def measure(
    url: str, batch: np.ndarray, attention: bool, rounds: int, calls: int
) -> dict[str, Any]:
    """Median ms per call and bytes per call of each wire format, interleaved."""
    times: dict[Literal["binary", "base64"], list[float]] = {"binary": [], "base64": []}
    sizes: dict[str, tuple[int, int]] = {}
    for _ in range(rounds):
        for fmt in times:
            transport = CountingTransport()
            with Client(url, transport=transport, timeout=120) as client:
                client.encode(batch, wire_format=fmt, return_attention=attention)  # warm
                transport.sent = transport.received = 0
                for _ in range(calls):
                    start = time.perf_counter()
                    client.encode(batch, wire_format=fmt, return_attention=attention)
                    times[fmt].append((time.perf_counter() - start) * 1000)
            sizes[fmt] = (transport.sent // calls, transport.received // calls)
    median = {fmt: statistics.median(t) for fmt, t in times.items()}
    return {
        "attention": attention,
        "binary_ms": median["binary"],
        "base64_ms": median["base64"],
        "ratio_binary_vs_base64": median["binary"] / median["base64"],
        "binary_bytes": sizes["binary"],
        "base64_bytes": sizes["base64"],
    }


def render(results: list[dict[str, Any]]) -> str:
    return table(
        [
            "[8,128]",
            "binary ms",
            "base64 JSON ms",
            "binary / base64",
            "bytes sent, received (binary)",
            "(base64)",
        ],
        [
            [
                "+ attention" if r["attention"] else "embeddings",
                f"{r['binary_ms']:.1f}",
                f"{r['base64_ms']:.1f}",
                f"{r['ratio_binary_vs_base64']:.2f}",
                f"{r['binary_bytes'][0]:,}, {r['binary_bytes'][1]:,}",
                f"{r['base64_bytes'][0]:,}, {r['base64_bytes'][1]:,}",
            ]
            for r in results
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10, help="calls per round and format")
    parser.add_argument("--out", type=Path, default=OUT / "transport.json")
    args = parser.parse_args(argv)
    d_model = model_config(args.model_dir)["architecture"]["d_model"]
    batch = np.random.default_rng(0).standard_normal((8, 128, d_model), dtype=np.float32)
    with running_server(args.model_dir) as server:
        results = [
            measure(server.url, batch, attention, args.rounds, args.calls)
            for attention in (False, True)
        ]
    write_json(args.out, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
