"""Serving benchmark: the HTTP service against onnxruntime in-process, as ratios.

The machine is shared and noisy, so every number is reported next to a
baseline measured in the same run: onnxruntime called directly in its own
process on the same model and the same inputs. Each scenario starts a real
server (``python -m service``) on 127.0.0.1 and drives it from a separate
load process with a small keep-alive HTTP/1.1 client (raw asyncio streams:
an httpx load generator would eat the cores it measures). Loops are bounded
by request count.

    .venv/bin/python bench/bench_serving.py --model-dir models/minilm-l6 --requests 400

Writes ``bench/out/serving.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Scenario:
    name: str
    seq_len: int
    concurrency: int
    encoding: str = "base64"  # how the arrays travel both ways
    attention: bool = False
    batch_tokens: int = 4096  # ATTNSERVE_MAX_BATCH_TOKENS; seq_len disables merging


SCENARIOS = [
    Scenario("latency [1,16], c=1", 16, 1),
    Scenario("throughput [1,16], c=32, batching", 16, 32),
    Scenario("throughput [1,16], c=32, no batching", 16, 32, batch_tokens=16),
    Scenario("throughput [1,16], c=32, float JSON", 16, 32, encoding="float"),
    Scenario("[1,128] c=8", 128, 8),
    Scenario("[1,128] c=8 + attention (mean)", 128, 8, attention=True),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request_body(x: np.ndarray, scenario: Scenario) -> bytes:
    data: Any
    if scenario.encoding == "base64":
        data = {"shape": list(x.shape), "data": base64.b64encode(x.tobytes()).decode()}
    else:
        data = x.tolist()
    body: dict[str, Any] = {"inputs": [data], "encoding_format": scenario.encoding}
    if scenario.attention:
        body |= {"return_attention": True, "attention": {"reduce": "mean"}}
    return json.dumps(body).encode()


async def _one_connection(
    port: int, payload: bytes, count: int, latencies: list[float], path: str = "/v1/encode"
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    for _ in range(count):
        start = time.perf_counter()
        writer.write(head + payload)
        await writer.drain()
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        if b" 200 " not in status:
            raise RuntimeError(f"server answered {status!r}")
        latencies.append(time.perf_counter() - start)
    writer.close()


def load_process(
    port: int, payload: bytes, requests: int, concurrency: int, path: str = "/v1/encode"
) -> dict[str, float]:
    """Runs in its own process: ``requests`` POSTs to ``path`` over ``concurrency`` connections."""
    latencies: list[float] = []
    per_conn = max(1, requests // concurrency)

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(
            *(_one_connection(port, payload, per_conn, latencies, path) for _ in range(concurrency))
        )
        return time.perf_counter() - start

    wall = asyncio.run(main())
    latencies.sort()
    return {
        "requests": len(latencies),
        "wall_s": wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99) - 1],
    }


def in_process_baseline(
    model_dir: str, x: np.ndarray, batch: int, attention: bool, repeats: int
) -> float:
    """Tokens/s of onnxruntime itself on ``batch`` copies of x (own process, 2 threads)."""
    import onnxruntime as ort

    graph = "model_attn.onnx" if attention else "model.onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = 0
    session = ort.InferenceSession(
        f"{model_dir}/{graph}", options, providers=["CPUExecutionProvider"]
    )
    embeds = np.repeat(x[None], batch, axis=0)
    mask = np.ones(embeds.shape[:2], dtype=np.int64)
    feeds = {"inputs_embeds": embeds, "attention_mask": mask}
    session.run(None, feeds)
    start = time.perf_counter()
    for _ in range(repeats):
        session.run(None, feeds)
    return repeats * embeds.shape[0] * embeds.shape[1] / (time.perf_counter() - start)


def run_scenario(
    model_dir: Path, d_model: int, scenario: Scenario, requests: int
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((scenario.seq_len, d_model), dtype=np.float32)
    payload = request_body(x, scenario)
    ctx = get_context("spawn")
    with ctx.Pool(1) as pool:
        batch = max(1, min(scenario.concurrency, 4096 // scenario.seq_len))
        baseline = pool.apply(
            in_process_baseline, (str(model_dir), x, batch, scenario.attention, 20)
        )
    with (
        running_server(model_dir, MAX_BATCH_TOKENS=str(scenario.batch_tokens)) as port,
        ctx.Pool(1) as pool,
    ):
        pool.apply(load_process, (port, payload, 20, 1))  # warm the server up
        stats = pool.apply(load_process, (port, payload, requests, scenario.concurrency))
    tokens_per_s = stats["requests"] * scenario.seq_len / stats["wall_s"]
    return {
        **asdict(scenario),
        **stats,
        "tokens_per_s": tokens_per_s,
        "baseline_tokens_per_s": baseline,
        "ratio_vs_in_process": tokens_per_s / baseline,
    }


@contextmanager
def running_server(model_dir: Path, **settings: str) -> Iterator[int]:
    """``python -m service`` on 127.0.0.1 serving ``model_dir``; yields its port once ready.

    ``settings`` are ATTNSERVE_* values without the prefix.
    """
    port = free_port()
    env = {
        **os.environ,
        "ATTNSERVE_MODEL_REPOSITORY": str(model_dir.parent),
        "ATTNSERVE_DEFAULT_MODEL": model_dir.name,
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_GRPC_PORT": "0",
        # Every request computed: the cache would answer repeats (bench_cache measures it).
        "ATTNSERVE_RESPONSE_CACHE_BYTES": "0",
        "ATTNSERVE_LOG_LEVEL": "warning",
        **{f"ATTNSERVE_{k}": v for k, v in settings.items()},
    }
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "service"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_ready(port, server)
            yield port
        finally:
            server.terminate()
            server.wait(timeout=30)


def _wait_ready(port: int, server: subprocess.Popen[bytes], timeout: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError("server not ready")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "minilm-l6")
    parser.add_argument("--requests", type=int, default=400, help="requests per scenario")
    parser.add_argument("--only", default="", help="run only scenarios whose name has this")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "serving.json")
    args = parser.parse_args()
    config = json.loads((args.model_dir / "config.json").read_text())
    d_model = config["architecture"]["d_model"]
    rows = [
        run_scenario(args.model_dir, d_model, s, args.requests)
        for s in SCENARIOS
        if args.only in s.name
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": config["name"], "rows": rows}, indent=2))
    print(
        f"model {config['name']} (d_model {d_model}); baseline: onnxruntime in-process, "
        "same inputs, batch = min(concurrency, 4096 / seq)\n"
    )
    print("| scenario | p50 ms | p99 ms | tokens/s | in-process tokens/s | ratio |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['tokens_per_s']:,.0f} "
            f"| {r['baseline_tokens_per_s']:,.0f} | {r['ratio_vs_in_process']:.2f} |"
        )
    print(f"\nmedian ratio {statistics.median(r['ratio_vs_in_process'] for r in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
