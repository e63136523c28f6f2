"""The soak's clients: a mix of good, bad, huge, slow and abandoned requests, judged.

Ordinary requests go through an httpx client (a pool of keep-alive connections);
slow and oversized ones through raw connections of the load client, written at
their own pace while the answer is read, so a server that answers (408, 413) or
closes before the last byte is seen doing so.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress

import httpx

from bench.lib.http import Answer, Closed, Connection, Malformed
from bench.lib.procs import vm_rss
from bench.soak.config import (
    ABANDONED,
    ATTENTION,
    KEEP_ALIVE_TIMEOUT,
    MB,
    MIX,
    OVERSIZED,
    SECOND_ANSWER_WAIT,
    SHED,
    SLOW,
    VALID,
)
from bench.soak.reference import Reference
from bench.soak.report import Failure, SoakReport
from bench.soak.requests import Planned, Requests

Part = tuple[bytes, int, float]  # bytes to send, chunk size, seconds between chunks


def rss_mb(pid: int) -> float | None:
    """The server's RSS in MB; None once the process is gone."""
    value = vm_rss(pid)
    return None if value is None else value / MB


class Soak:
    """The clients of one run, and the tally they keep."""

    def __init__(
        self, port: int, reference: Reference, report: SoakReport, requests: Requests
    ) -> None:
        self.port, self.reference, self.report, self.requests = port, reference, report, requests
        self.config = report.config
        self.checker = ThreadPoolExecutor(max_workers=2, thread_name_prefix="check")
        self.deadline = 0.0

    def fail(self, kind: str, planned: Planned, detail: str) -> None:
        self.report.failures.append(
            Failure(kind, planned.cls, planned.variant, planned.rid, detail)
        )

    def note(self, planned: Planned, outcome: str) -> None:
        self.report.outcomes[planned.cls][outcome] += 1
        self.report.variants[planned.label][outcome] += 1

    async def run(self) -> None:
        cfg = self.config
        start = time.monotonic()
        self.deadline = start + cfg.seconds
        # The server closes a connection idle for HEADER_TIMEOUT (= body_timeout here); a
        # client reusing one just then loses its request (ECONNRESET): the keep-alive race
        # of HTTP/1.1, not the server's fault. Expiring idle connections first avoids it.
        limits = httpx.Limits(
            max_connections=cfg.clients,
            max_keepalive_connections=cfg.clients,
            keepalive_expiry=min(cfg.body_timeout, KEEP_ALIVE_TIMEOUT) / 2,
        )
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.port}",
            timeout=cfg.request_timeout,
            limits=limits,
        ) as client:
            clients = [
                asyncio.create_task(self.client(client, random.Random(f"{cfg.seed}/{i}")))
                for i in range(cfg.clients)
            ] + [asyncio.create_task(self.slow_client()) for _ in range(cfg.slow_clients)]
            sampler = asyncio.create_task(self.sample_rss(start))
            # Each request is bounded; the drain is bounded by the longest of them.
            grace = cfg.request_timeout + cfg.slow_seconds + 10
            done, pending = await asyncio.wait(clients, timeout=cfg.seconds + grace)
            for task in pending:
                task.cancel()
            if pending:
                self.report.failures.append(
                    Failure("lost", "-", "", -1, f"{len(pending)} clients hung past the drain")
                )
            for task in done:
                task.result()  # raises a bug of the soak itself
            sampler.cancel()
            with suppress(asyncio.CancelledError):
                await sampler
            self.report.elapsed = time.monotonic() - start
            await self.after(client)
        self.report.largest_difference = self.reference.largest
        self.checker.shutdown()

    async def client(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        classes, weights = list(MIX), list(MIX.values())
        while time.monotonic() < self.deadline:
            planned = self.requests.next(rng.choices(classes, weights)[0])
            self.record_sent(planned)
            if planned.cls == ABANDONED:
                await self.abandon(planned, rng)
            elif planned.variant == "body-too-large":
                # As most clients do (no Expect: 100-continue): the whole body, then read.
                await self.raw(planned, "whole", write_all=True)
            else:
                await self.http(client, planned)

    async def slow_client(self) -> None:
        while time.monotonic() < self.deadline:
            planned = self.requests.next(SLOW)
            self.record_sent(planned)
            await self.raw(planned, planned.variant)

    def slowly(self, data: bytes) -> Part:
        """``data`` spread over slow_seconds, a chunk every slow_interval."""
        pace = self.config.slow_interval
        return data, max(1, math.ceil(len(data) * pace / self.config.slow_seconds)), pace

    def record_sent(self, planned: Planned) -> None:
        self.note(planned, "sent")

    async def http(self, client: httpx.AsyncClient, planned: Planned) -> None:
        started = time.perf_counter()
        try:
            r = await client.post(
                "/v1/encode", content=planned.body, headers={"content-type": planned.content_type}
            )
        except httpx.HTTPError as exc:
            self.note(planned, type(exc).__name__)
            self.fail("lost", planned, f"{type(exc).__name__}: {exc}")
            return
        latency = time.perf_counter() - started
        await self.judge(planned, Answer(r.status_code, dict(r.headers), r.content), latency)

    def paced(self, head: bytes, body: bytes, pace: str) -> list[Part]:
        """The request as parts: ``whole`` in 64 KiB writes, or its head or body spread
        over slow_seconds (``slow-head``, ``slow-body``)."""
        if pace == "slow-head":
            return [self.slowly(head), (body, len(body), 0.0)]
        if pace == "slow-body":
            return [(head, len(head), 0.0), self.slowly(body)]
        return [(head + body, 64 * 1024, 0.0)]

    async def raw(self, planned: Planned, pace: str, *, write_all: bool = False) -> None:
        """Send ``planned`` on a connection of its own, ``paced``, reading the answer
        meanwhile: the server may answer (408, 413) or close before the last byte, and
        then the rest is not sent unless ``write_all``. One request must get one answer:
        a second one is a failure."""
        connection = await self._connect(planned)
        if connection is None:
            return
        try:
            parts = self.paced(*connection.prepare(planned.request), pace)
            await self._exchange(planned, parts, connection, write_all)
        finally:
            await connection.close()

    async def _connect(self, planned: Planned) -> Connection | None:
        """A connection of its own for ``planned``; None (counted as lost) if refused."""
        try:
            return await Connection.open(self.port)
        except OSError as exc:
            self.note(planned, "connect failed")
            self.fail("lost", planned, f"cannot connect: {exc!r}")
            return None

    async def _exchange(
        self, planned: Planned, parts: list[Part], connection: Connection, write_all: bool
    ) -> None:
        answer = asyncio.create_task(connection.receive())
        written = 0
        try:
            for data, chunk, pause in parts:
                for offset in range(0, len(data), chunk):
                    if answer.done() and not write_all:
                        break
                    await connection.write(data[offset : offset + chunk])
                    written += len(data[offset : offset + chunk])
                    if pause:
                        await asyncio.wait({answer}, timeout=pause)
        except OSError:
            pass  # the server stopped reading: its answer (if any) is read below
        sent_all = written == sum(len(data) for data, _, _ in parts)
        timeout = self.config.request_timeout
        try:
            got = await asyncio.wait_for(answer, timeout=timeout)
        except TimeoutError:
            self.note(planned, "no answer")
            if sent_all:
                self.fail("lost", planned, f"no answer {timeout:g} s after the whole request")
            else:
                self.report.notes.append(f"{planned.label} {planned.rid}: no answer, unsent")
            return
        except (Closed, OSError):
            # Closed without (a whole) answer: the refusal of a slow or oversized body. (A
            # server that answers 413 and closes with the body unread resets the connection,
            # which may discard the 413 before this side reads it.)
            self.note(planned, "closed")
            if planned.cls not in (SLOW, OVERSIZED) or (sent_all and planned.cls == SLOW):
                self.fail("lost", planned, "connection closed without an answer")
            return
        except Malformed as exc:
            self.note(planned, "malformed")
            self.fail("unexpected status", planned, f"malformed HTTP response: {exc!r}")
            return
        # Anything more on this connection answers no request of ours.
        extra = await connection.extra(SECOND_ANSWER_WAIT)
        if extra:
            line = extra.split(b"\r\n", 1)[0].decode("latin-1")
            self.fail("answered twice", planned, f"{got.status}, then {line!r}")
        await self.judge(planned, got, None)

    async def abandon(self, planned: Planned, rng: random.Random) -> None:
        """Send the request (or half its body), wait 0-50 ms, hang up without reading."""
        data = planned.request.wire
        if planned.variant == "mid-body":
            data = data[: len(data) - len(planned.body) // 2]
        connection = await self._connect(planned)
        if connection is None:
            return
        try:
            await connection.write(data)
            await asyncio.sleep(rng.uniform(0, 0.05))
        except OSError:
            pass
        finally:
            await connection.close()
        self.note(planned, "hung up")

    async def judge(self, planned: Planned, answer: Answer, latency: float | None) -> None:
        status = answer.status
        self.note(planned, str(status))
        excerpt = answer.body[:300].decode("utf-8", "replace")
        if status in SHED:
            if "retry-after" not in answer.headers:
                self.fail("shed without Retry-After", planned, f"{status} {excerpt}")
        elif status >= 500:
            self.fail("unexpected 5xx", planned, f"{status} {excerpt}")
        elif 200 <= status < 300:
            if not planned.valid:
                self.fail("bad request accepted", planned, f"{status} {excerpt}")
                return
            loop = asyncio.get_running_loop()
            error = await loop.run_in_executor(
                self.checker, self.reference.check, planned, answer.body
            )
            self.report.checked += 1
            if error:
                self.fail("wrong", planned, error)
            elif latency is not None:
                self.report.latencies.append(latency)
        elif 400 <= status < 500:
            if planned.valid and planned.cls != SLOW:
                self.fail("valid request refused", planned, f"{status} {excerpt}")
        else:
            self.fail("unexpected status", planned, f"{status} {excerpt}")

    async def sample_rss(self, start: float) -> None:
        """The server's RSS every 0.5 s: peak, and the value when the warm-up ends."""
        report = self.report
        while True:
            value = rss_mb(report.pid)
            if value is None:
                return
            report.rss_peak = max(report.rss_peak, value)
            if report.rss_start is None and time.monotonic() - start >= self.config.warmup_seconds:
                report.rss_start = value
            await asyncio.sleep(0.5)

    async def after(self, client: httpx.AsyncClient) -> None:
        """After the run: the server still alive, ready, and right on fresh requests."""
        report = self.report
        await asyncio.sleep(1.0)  # abandoned work still draining
        report.rss_end = rss_mb(report.pid)
        if report.rss_end is None:
            report.failures.append(Failure("server", "-", "", -1, "the server process is gone"))
            return
        report.rss_peak = max(report.rss_peak, report.rss_end)
        growth = report.rss_growth
        if growth is not None and growth > self.config.max_rss_growth_mb:
            report.failures.append(
                Failure(
                    "rss",
                    "-",
                    "",
                    -1,
                    f"grew {growth:.1f} MB, allowed {self.config.max_rss_growth_mb:g} MB",
                )
            )
        try:
            ready = await client.get("/health/ready")
            if ready.status_code != 200:
                report.failures.append(
                    Failure("server", "-", "", -1, f"/health/ready {ready.status_code} after")
                )
        except httpx.HTTPError as exc:
            report.failures.append(Failure("server", "-", "", -1, f"/health/ready: {exc!r}"))
        for cls in (VALID, ATTENTION):
            planned = self.requests.next(cls)
            self.record_sent(planned)
            await self.http(client, planned)
