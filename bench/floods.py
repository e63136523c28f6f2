"""Cheap bodies that are expensive to parse: what they cost before they are refused.

A hostile client can send bodies that cost it nothing to make but cost the
server per element to parse (millions of tiny JSON strings or empty lists).
Each is refused; this measures what the refusal costs and what the other
clients feel. One real server (``python -m service``, all-MiniLM-L6-v2) on
127.0.0.1; bounded loops.

For each flood body: the seconds to its refusal and its status, alone; then
``--senders`` clients send it back to back while one light client sends small
text requests and liveness probes: their p99 under the flood as a ratio of the
same p99 measured idle in the same run; and the server's peak RSS over its
idle RSS, against the memory budget (ATTNSERVE_MAX_INFLIGHT_BYTES).

    .venv/bin/python -m bench.floods --model-dir models --seconds 10

Writes ``bench/out/floods.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import httpx

from bench.lib.models import MODELS, OUT
from bench.lib.procs import vm_rss
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_repository

BODY_BYTES = 32 * 1024 * 1024 - 4096  # just under the default 32 MiB limit
SMALL_TEXT = {"input": ["A short sentence to embed."], "model": "minilm-l6"}


def v2_tiny_strings() -> tuple[str, bytes, dict[str, str]]:
    """/v2 JSON with ~6.7 M one-letter BYTES elements (the shape says so, too)."""
    count = (BODY_BYTES - 200) // 4
    data = b",".join([b'"a"'] * count)
    head = b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[%d],"data":[' % count
    return "/v2/models/minilm-l6/infer", head + data + b"]}]}", {}


def native_empty_lists() -> tuple[str, bytes, dict[str, str]]:
    """/v1/encode with ~10 M empty sequences."""
    count = (BODY_BYTES - 20) // 3
    return "/v1/encode", b'{"inputs":[' + b",".join([b"[]"] * count) + b"]}", {}


def openai_tiny_strings() -> tuple[str, bytes, dict[str, str]]:
    """/v1/embeddings with ~8 M empty strings."""
    count = (BODY_BYTES - 40) // 3
    return "/v1/embeddings", b'{"input":[' + b",".join([b'""'] * count) + b"]}", {}


def control_oversized() -> tuple[str, bytes, dict[str, str]]:
    """The control: a body over ATTNSERVE_MAX_BODY_BYTES, refused by its Content-Length
    before any of it is read (413), then read and dropped: what moving the bytes alone
    costs the server and the machine, whatever the body holds."""
    return "/v1/encode", b" " * (BODY_BYTES + 8192), {}


FLOODS: dict[str, Callable[[], tuple[str, bytes, dict[str, str]]]] = {
    "control: 32 MiB refused by Content-Length": control_oversized,
    "v2 BYTES, 6.7 M tiny strings": v2_tiny_strings,
    "/v1/encode, 10 M empty lists": native_empty_lists,
    "/v1/embeddings, 8 M empty strings": openai_tiny_strings,
}


def rss_mb(pid: int) -> float:
    """The server's RSS in MiB (0 once it is gone)."""
    return (vm_rss(pid) or 0) / 2**20


def probe_latencies(url: str, seconds: float) -> dict[str, list[float]]:
    """Small text requests and liveness probes, one at a time, for ``seconds``."""
    out: dict[str, list[float]] = {"text": [], "live": [], "failed": []}
    stop = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=60) as client:
        while time.monotonic() < stop:
            calls: tuple[tuple[str, Callable[[], httpx.Response]], ...] = (
                ("text", lambda: client.post("/v1/embeddings", json=SMALL_TEXT)),
                ("live", lambda: client.get("/health/live")),
            )
            for kind, call in calls:
                started = time.perf_counter()
                response = call()
                elapsed = time.perf_counter() - started
                if response.status_code == 200:
                    out[kind].append(elapsed)
                else:  # a small request must never be refused by a flood it did not send
                    out["failed"].append(float(response.status_code))
    return out


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else float("nan")


def send_loop(url: str, name: str, seconds: float, out: Any) -> None:
    """One flood sender, in its own process (a load generator must not share the probe's
    GIL): ``name``'s body back to back; (status, seconds) of each send onto ``out``."""
    path, body, _ = FLOODS[name]()
    stop = time.monotonic() + seconds
    results = []
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.monotonic() < stop:
            started = time.perf_counter()
            try:
                status = str(client.post(path, content=body, headers=JSON).status_code)
            except httpx.TransportError as exc:
                status = type(exc).__name__
            results.append((status, time.perf_counter() - started))
    out.put(results)


def flood(url: str, name: str, seconds: float, senders: int) -> tuple[list[Any], Any]:
    """``senders`` processes sending the flood; join them with ``collect``."""
    context = get_context("spawn")
    out = context.Queue()
    procs = [
        context.Process(target=send_loop, args=(url, name, seconds, out)) for _ in range(senders)
    ]
    for proc in procs:
        proc.start()
    return procs, out


def collect(procs: list[Any], out: Any) -> tuple[dict[str, int], list[float]]:
    statuses: dict[str, int] = {}
    times: list[float] = []
    for _ in procs:
        for status, elapsed in out.get(timeout=300):
            statuses[status] = statuses.get(status, 0) + 1
            times.append(elapsed)
    for proc in procs:
        proc.join()
    return statuses, times


JSON = {"content-type": "application/json"}


def measure(url: str, pid: int, name: str, seconds: float, senders: int) -> dict[str, Any]:
    path, body, _ = FLOODS[name]()
    with httpx.Client(base_url=url, timeout=120) as client:
        started = time.perf_counter()
        alone = client.post(path, content=body, headers=JSON)
        alone_seconds = time.perf_counter() - started
    idle = probe_latencies(url, seconds / 2)
    idle_rss = rss_mb(pid)
    procs, out = flood(url, name, seconds, senders)
    time.sleep(1.0)  # let the senders start (spawned interpreters) before probing
    peak = idle_rss
    sampler_stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not sampler_stop.is_set():
            peak = max(peak, rss_mb(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    under = probe_latencies(url, seconds - 2.0)
    statuses, times = collect(procs, out)
    sampler_stop.set()
    sampler.join()
    return {
        "flood": name,
        "body_mb": round(len(body) / 2**20, 1),
        "alone_status": alone.status_code,
        "alone_seconds": round(alone_seconds, 3),
        "flood_statuses": statuses,
        "flood_refusal_p50_seconds": round(statistics.median(times), 3),
        "text_p99_idle_ms": round(1000 * p99(idle["text"]), 1),
        "text_p99_flood_ms": round(1000 * p99(under["text"]), 1),
        "text_p99_ratio": round(p99(under["text"]) / p99(idle["text"]), 2),
        "live_p99_idle_ms": round(1000 * p99(idle["live"]), 1),
        "live_p99_flood_ms": round(1000 * p99(under["live"]), 1),
        "live_p99_ratio": round(p99(under["live"]) / p99(idle["live"]), 2),
        "small_failed": len(under["failed"]),
        "rss_idle_mb": round(idle_rss),
        "rss_peak_over_idle_mb": round(peak - idle_rss),
    }


def render(rows: list[dict[str, Any]]) -> str:
    return table(
        ["flood", "alone", "text p99 idle → flood", "live p99 idle → flood", "RSS peak over idle"],
        [
            [
                r["flood"],
                f"{r['alone_status']} in {r['alone_seconds']} s",
                f"{r['text_p99_idle_ms']} → {r['text_p99_flood_ms']} ms (×{r['text_p99_ratio']})",
                f"{r['live_p99_idle_ms']} → {r['live_p99_flood_ms']} ms (×{r['live_p99_ratio']})",
                f"+{r['rss_peak_over_idle_mb']} MB",
            ]
            for r in rows
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, default=MODELS, help="the model repository served (all of it)"
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--only", default="", help="run the floods whose name contains this")
    parser.add_argument("--out", type=Path, default=OUT / "floods.json")
    args = parser.parse_args(argv)
    rows = []
    for name in FLOODS:
        if args.only not in name:
            continue
        # A fresh server per flood: RSS is per flood.
        with running_repository(args.model_dir) as server:
            rows.append(measure(server.url, server.pid, name, args.seconds, args.senders))
        print(json.dumps(rows[-1]), flush=True)
    write_json(args.out, rows)
    print("\n" + render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
