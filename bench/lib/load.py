"""Load generators on the load client: bounded keep-alive loops, HTTP/1.1 and gRPC.

Each runs in a load process of its own (a ``multiprocessing`` pool of one, spawned),
so the process that measures does not share its interpreter with the load. Every
loop is bounded by count and, where given, by time.
"""

from __future__ import annotations

import asyncio
import math
import resource
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bench.lib.http import Answer, Connection, Request

SAMPLE_PER_RUN = 8  # answers kept from each timed run, to be checked after it
# No message size limit on the load generator's side: [1,128] attention answers are
# 4.7 MB (gRPC's default receive limit is 4 MiB); the servers keep their own limits.
GRPC_OPTIONS = (("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1))
# (call index, body, headers) of an answer kept for the check after a run.
Kept = tuple[int, bytes, dict[str, str]]


@dataclass
class Sample:
    """Answers kept from a timed run for the numerical check: (call index, answer)."""

    answers: list[tuple[int, Answer]] = field(default_factory=list)


async def keep_alive(
    port: int,
    requests: list[Request],
    count: int,
    deadline: float,
    latencies: list[float],
    sample: Sample | None = None,
    first: int = 0,
) -> int:
    """Sends ``requests`` in turn, from index ``first`` on, on one keep-alive connection
    until ``count`` or ``deadline``; each answer must be a 200. Returns the body bytes
    received.

    With ``sample``, keeps the first and the last answer it got (a reference each, no
    copy) for a check after the run: answers made under load, batched with others'."""
    connection = await Connection.open(port)
    received = 0
    last: tuple[int, Answer] | None = None
    try:
        for i in range(first, first + count):
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            answer = await connection.request(requests[i % len(requests)])
            if answer.status != 200:
                raise RuntimeError(f"answered {answer.status}: {answer.body[:300]!r}")
            latencies.append(time.perf_counter() - start)
            received += answer.size
            if sample is None:
                continue
            if i == first:
                sample.answers.append((i % len(requests), answer))
            else:
                last = (i % len(requests), answer)
    finally:
        await connection.close()
    if sample is not None and last is not None:
        sample.answers.append(last)
    return received


def latency_stats(latencies: list[float], wall: float) -> dict[str, float]:
    """Count, wall time, p50 and p99 (ms) of one run; sorts ``latencies``."""
    latencies.sort()
    return {
        "requests": len(latencies),
        "wall_s": wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[max(0, int(len(latencies) * 0.99) - 1)],
    }


def load_process(
    port: int, payload: bytes, requests: int, concurrency: int, path: str = "/v1/encode"
) -> dict[str, float]:
    """``requests`` JSON POSTs of ``payload`` to ``path`` over ``concurrency``
    connections, no warm-up: count, wall time, p50 and p99."""
    latencies: list[float] = []
    per_conn = max(1, requests // concurrency)
    request = Request(path, payload)

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(
            *(
                keep_alive(port, [request], per_conn, math.inf, latencies)
                for _ in range(concurrency)
            )
        )
        return time.perf_counter() - start

    wall = asyncio.run(main())
    return latency_stats(latencies, wall)


# One timed run of a load generator: (count, seconds) -> (wall, latencies, bytes, sample).
RunOnce = Callable[[int, float], Coroutine[Any, Any, tuple[float, list[float], int, Sample]]]


def load_run(
    port: int, requests: list[Request], concurrency: int, count: int, seconds: float
) -> tuple[dict[str, float], list[Kept]]:
    """A short warm-up, then one run bounded by ``count`` requests and ``seconds``. Each
    connection starts at its own place in ``requests``, and the timed run after the
    warm-up's: with as many distinct requests as are sent, none is sent twice."""
    used = [0]  # requests handed out so far, over both runs

    async def main(count: int, limit: float) -> tuple[float, list[float], int, Sample]:
        latencies: list[float] = []
        sample = Sample()
        per_conn = max(1, count // concurrency)
        base, used[0] = used[0], used[0] + per_conn * concurrency
        start = time.perf_counter()
        sizes = await asyncio.gather(
            *(
                keep_alive(
                    port, requests, per_conn, start + limit, latencies, sample, base + k * per_conn
                )
                for k in range(concurrency)
            )
        )
        return time.perf_counter() - start, latencies, sum(sizes), sample

    return timed_run(main, concurrency, count, seconds)


def timed_run(
    main: RunOnce, concurrency: int, requests: int, seconds: float
) -> tuple[dict[str, float], list[Kept]]:
    """A short warm-up, then the bounded measured run: its statistics (with this load
    process's cores and the bytes per answer) and a sample of its answers (at most
    ``SAMPLE_PER_RUN``: the first and last of each connection)."""
    asyncio.run(main(2 * concurrency, seconds))  # warm: connections, caches, batcher
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall, latencies, received, sample = asyncio.run(main(requests, seconds))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    stats = latency_stats(latencies, wall) | {
        "loadgen_cores": cpu / wall,
        "bytes_per_answer": received / max(1, len(latencies)),
    }
    # Spread over connections (first answers, then last ones), bounded in count.
    kept = sample.answers[:: max(1, len(sample.answers) // SAMPLE_PER_RUN)][:SAMPLE_PER_RUN]
    return stats, [(i, a.body, a.headers) for i, a in kept]


def grpc_load_run(
    port: int, path: str, bodies: list[bytes], concurrency: int, requests: int, seconds: float
) -> tuple[dict[str, float], list[Kept]]:
    """``load_run`` over gRPC: ``concurrency`` callers on one channel (one HTTP/2
    connection, as a gRPC client holds it), each sending pre-serialised requests in
    turn; answers stay bytes (no client-side decoding is timed)."""
    import grpc

    async def main(count: int, limit: float) -> tuple[float, list[float], int, Sample]:
        latencies: list[float] = []
        sample = Sample()
        per_caller = max(1, count // concurrency)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as ch:
            method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(path)
            start = time.perf_counter()

            async def caller() -> int:
                received, last = 0, None
                for i in range(per_caller):
                    if time.perf_counter() > start + limit:
                        break
                    sent = time.perf_counter()
                    body = await method(bodies[i % len(bodies)], timeout=120)
                    latencies.append(time.perf_counter() - sent)
                    received += len(body)
                    answer = (i % len(bodies), Answer(200, {}, body))
                    if i == 0:
                        sample.answers.append(answer)
                    else:
                        last = answer
                if last is not None:
                    sample.answers.append(last)
                return received

            sizes = await asyncio.gather(*(caller() for _ in range(concurrency)))
            return time.perf_counter() - start, latencies, sum(sizes), sample

    return timed_run(main, concurrency, requests, seconds)
