"""Soak: many clients mixing good, bad, huge, slow and abandoned requests, for a bounded time.

One real server (``python -m service``, started by ``bench_serving.running_server``)
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

    .venv/bin/python bench/soak.py --seconds 60 --clients 16

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

import argparse
import asyncio
import base64
import itertools
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort

from model_export import graph_io
from model_export.manifest import Manifest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_serving import running_server  # noqa: E402

# fp32, the same graph on both sides, but batched with other requests' padding on the
# server and alone here: observed differences ~1e-6 (graph_io.DEFAULT_ATOL's reasoning).
ATOL = 1e-4
MB = 1e6
MiB = 1024 * 1024
KEEP_ALIVE_TIMEOUT = 5.0  # the server's default ATTNSERVE_KEEP_ALIVE_TIMEOUT
SECOND_ANSWER_WAIT = 0.2  # after a raw request's answer, seconds to watch for another

VALID, ATTENTION, INVALID, OVERSIZED, SLOW, ABANDONED = (
    "valid",
    "valid+attention",
    "invalid",
    "oversized",
    "slow",
    "abandoned",
)
CLASSES = (VALID, ATTENTION, INVALID, OVERSIZED, SLOW, ABANDONED)
# What the --clients draw from (slow requests have their own --slow-clients).
MIX = {VALID: 50, ATTENTION: 20, INVALID: 12, OVERSIZED: 10, ABANDONED: 8}
INVALID_VARIANTS = (
    "bad-json",
    "wrong-width",
    "nan-base64",
    "nan-json",
    "empty-sequence",
    "unknown-field",
    "unknown-model",
    "bad-base64",
    "text-plain",
)
OVERSIZED_VARIANTS = ("too-many-sequences", "too-long", "too-many-tokens", "body-too-large")
SLOW_VARIANTS = ("slow-body", "slow-head")
ABANDONED_VARIANTS = ("after-request", "mid-body")
SHED = (429, 503, 504)  # load shedding: each must say when to come back (Retry-After)
# Kinds of failure, in the order the report lists them.
FAILURES = (
    "wrong",
    "lost",
    "unexpected 5xx",
    "shed without Retry-After",
    "bad request accepted",
    "valid request refused",
    "unexpected status",
    "answered twice",
    "server",
    "rss",
)


@dataclass(frozen=True)
class SoakConfig:
    """One soak run; every loop and wait below is bounded by these."""

    seconds: float = 60.0
    clients: int = 16
    slow_clients: int = 2
    warmup_seconds: float = 5.0  # RSS growth is measured from the end of the warm-up
    max_rss_growth_mb: float = 64.0
    atol: float = ATOL
    body_timeout: float = 2.0  # the server's ATTNSERVE_BODY_TIMEOUT / HEADER_TIMEOUT
    slow_seconds: float = 6.0  # a slow client spreads one request over this long
    slow_interval: float = 0.25  # seconds between a slow client's chunks
    max_queued: int | None = None  # ATTNSERVE_MAX_QUEUED_REQUESTS; None: clients // 2
    request_timeout: float = 30.0  # client side, per request
    seed: int = 0
    server_settings: dict[str, str] = field(default_factory=dict)  # more ATTNSERVE_* values

    def __post_init__(self) -> None:
        assert self.seconds > 0 and self.clients >= 1 and self.slow_clients >= 0
        assert 0 <= self.warmup_seconds < self.seconds
        assert self.slow_interval > 0 and self.slow_seconds >= self.slow_interval


@dataclass(frozen=True)
class Limits:
    """The request limits the soak gives its server, derived from the model."""

    d_model: int
    max_seq_len: int  # the model's own (ATTNSERVE_MAX_SEQ_LEN is set to it)
    valid_len: int  # valid sequences are 1..valid_len tokens
    valid_sequences: int  # and 1..valid_sequences per request
    max_sequences: int
    max_tokens: int
    max_body_bytes: int

    @classmethod
    def for_model(cls, manifest: Manifest) -> Limits:
        arch = manifest.architecture
        valid_len, valid_sequences = min(32, arch.max_seq_len), 4
        max_tokens = valid_len * valid_sequences
        # The largest bodies sent: valid ones as nested floats (<= 24 bytes a float),
        # the too-long and too-many-tokens ones as base64 (16/3 bytes a float).
        largest = max(
            valid_sequences * valid_len * arch.d_model * 24,
            (max(arch.max_seq_len, max_tokens) + 1) * arch.d_model * 16 // 3,
        )
        return cls(
            d_model=arch.d_model,
            max_seq_len=arch.max_seq_len,
            valid_len=valid_len,
            valid_sequences=valid_sequences,
            max_sequences=2 * valid_sequences,
            max_tokens=max_tokens,
            max_body_bytes=max(MiB, 2 * largest + 64 * 1024),
        )

    def server_settings(self) -> dict[str, str]:
        return {
            "MAX_SEQ_LEN": str(self.max_seq_len),
            "MAX_SEQUENCES": str(self.max_sequences),
            "MAX_TOKENS": str(self.max_tokens),
            "MAX_BODY_BYTES": str(self.max_body_bytes),
        }


# -- requests ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Planned:
    """One request to send: its bytes, and what a correct answer holds (valid ones)."""

    rid: int  # unique per run; with the seed, it regenerates the request (``make``)
    cls: str
    variant: str
    body: bytes
    content_type: str = "application/json"
    sequences: tuple[np.ndarray, ...] = ()  # the inputs of a valid request, [n_i, d]
    attention: bool = False

    @property
    def valid(self) -> bool:
        return bool(self.sequences)

    @property
    def label(self) -> str:
        return f"{self.cls}/{self.variant}" if self.variant else self.cls

    def head(self) -> bytes:
        """The HTTP/1.1 request line and headers, for raw sockets."""
        return (
            f"POST /v1/encode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {self.content_type}"
            f"\r\nContent-Length: {len(self.body)}\r\n\r\n"
        ).encode()

    def raw(self) -> bytes:
        """The whole HTTP/1.1 request."""
        return self.head() + self.body


def b64(array: np.ndarray) -> dict[str, Any]:
    le = np.ascontiguousarray(array, dtype="<f4")
    return {"shape": list(le.shape), "data": base64.b64encode(le.tobytes()).decode("ascii")}


class Requests:
    """Makes every request of a run; request ``rid`` depends only on (seed, rid)."""

    def __init__(self, limits: Limits, seed: int) -> None:
        self.limits, self.seed = limits, seed
        self._ids = itertools.count()

    def next(self, cls: str) -> Planned:
        rid = next(self._ids)
        rng = np.random.default_rng([self.seed, rid])
        variants = {
            INVALID: INVALID_VARIANTS,
            OVERSIZED: OVERSIZED_VARIANTS,
            SLOW: SLOW_VARIANTS,
            ABANDONED: ABANDONED_VARIANTS,
        }.get(cls, ("",))
        return self.make(rid, cls, variants[int(rng.integers(len(variants)))])

    def make(self, rid: int, cls: str, variant: str) -> Planned:
        rng = np.random.default_rng([self.seed, rid, 1])
        lim, d = self.limits, self.limits.d_model

        def seqs(count: int, longest: int) -> tuple[np.ndarray, ...]:
            lengths = rng.integers(1, longest + 1, size=count)
            return tuple(rng.standard_normal((int(n), d), dtype=np.float32) for n in lengths)

        def body(inputs: list[Any], **options: Any) -> bytes:
            return json.dumps({"inputs": inputs, **options}).encode()

        if cls in (VALID, ATTENTION) or (cls in (SLOW, ABANDONED) and variant):
            count = int(rng.integers(1, (lim.valid_sequences if cls != SLOW else 1) + 1))
            xs = seqs(count, lim.valid_len if cls != SLOW else 4)
            attention = cls == ATTENTION or (cls != VALID and bool(rng.integers(2)))
            as_b64 = bool(rng.integers(2))
            options: dict[str, Any] = {
                "encoding_format": "base64" if rng.integers(2) else "float",
            }
            if attention:
                options |= {"return_attention": True, "attention": {"reduce": "mean"}}
            wire = [b64(x) if as_b64 else x.tolist() for x in xs]
            return Planned(
                rid, cls, variant, body(wire, **options), sequences=xs, attention=attention
            )
        x = seqs(1, lim.valid_len)[0]
        if variant == "bad-json":
            data = body([x.tolist()])
            return Planned(rid, cls, variant, data[: len(data) // 2])
        if variant == "wrong-width":
            wide = rng.standard_normal((len(x), d + 1), dtype=np.float32)
            return Planned(rid, cls, variant, body([wide.tolist()]))
        if variant == "nan-base64":
            x[0, 0] = np.nan
            return Planned(rid, cls, variant, body([b64(x)]))
        if variant == "nan-json":  # json.dumps writes NaN, which is not JSON
            x[-1, -1] = np.nan
            return Planned(rid, cls, variant, body([x.tolist()]))
        if variant == "empty-sequence":
            return Planned(rid, cls, variant, body([[]]))
        if variant == "unknown-field":
            return Planned(rid, cls, variant, body([x.tolist()], colour="blue"))
        if variant == "unknown-model":
            return Planned(rid, cls, variant, body([x.tolist()], model=f"no-such-model-{rid}"))
        if variant == "bad-base64":
            return Planned(
                rid, cls, variant, body([{"shape": list(x.shape), "data": "not base64!"}])
            )
        if variant == "text-plain":
            return Planned(rid, cls, variant, body([x.tolist()]), content_type="text/plain")
        if variant == "too-many-sequences":
            ones = rng.standard_normal((lim.max_sequences + 1, 1, d), dtype=np.float32)
            return Planned(rid, cls, variant, body([b64(o) for o in ones]))
        if variant == "too-long":
            long = rng.standard_normal((lim.max_seq_len + 1, d), dtype=np.float32)
            return Planned(rid, cls, variant, body([b64(long)]))
        if variant == "too-many-tokens":
            each = min(lim.max_seq_len, lim.max_tokens)
            parts = rng.standard_normal((lim.max_tokens // each + 1, each, d), dtype=np.float32)
            return Planned(rid, cls, variant, body([b64(p) for p in parts]))
        if variant == "body-too-large":  # well-formed JSON, padded past the limit
            data = body([b64(x)])
            return Planned(rid, cls, variant, data + b" " * (lim.max_body_bytes + 1 - len(data)))
        raise ValueError(f"no request {cls}/{variant}")


# -- the reference: onnxruntime in this process --------------------------------------------


class Reference:
    """onnxruntime on the model directory's graphs, each sequence run alone (no padding)."""

    def __init__(self, model_dir: Path, atol: float) -> None:
        self.atol = atol
        self.largest = 0.0  # the largest difference of an answer within atol
        self._lock = threading.Lock()  # check() runs in several threads
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        self.sessions = {
            attention: ort.InferenceSession(
                str(model_dir / graph), options, providers=["CPUExecutionProvider"]
            )
            for attention, graph in (
                (False, graph_io.GRAPH_EMBEDDINGS),
                (True, graph_io.GRAPH_ATTENTION),
            )
        }

    def expected(self, x: np.ndarray, attention: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(embeddings [n, d], head-averaged attention [L, 1, n, n] or None) of one sequence."""
        session = self.sessions[attention]
        names = [graph_io.OUTPUT_HIDDEN] + ([graph_io.OUTPUT_ATTENTIONS] if attention else [])
        feeds = {
            graph_io.INPUT_EMBEDS: x[None],  # (1, n, d)
            graph_io.INPUT_MASK: np.ones((1, len(x)), dtype=np.int64),  # (1, n)
        }
        outputs = session.run(names, feeds)
        hidden = outputs[0][0]  # (n, d)
        maps = outputs[1][0].mean(axis=1, keepdims=True) if attention else None  # (L, 1, n, n)
        return hidden, maps

    def check(self, planned: Planned, answer: bytes) -> str | None:
        """None if ``answer`` is the right one for ``planned``, else what is wrong."""
        try:
            data = json.loads(answer)["data"]
        except (ValueError, KeyError, TypeError) as exc:
            return f"unreadable answer ({exc!r}): {answer[:200]!r}"
        if not isinstance(data, list):
            return f"data is {type(data).__name__}, not a list"
        if len(data) != len(planned.sequences):
            return f"{len(data)} items answer {len(planned.sequences)} sequences"
        for i, (item, x) in enumerate(zip(data, planned.sequences, strict=True)):
            hidden, maps = self.expected(x, planned.attention)
            try:
                if item.get("index") != i:
                    return f"data[{i}].index is {item.get('index')!r}"
                for name, want in (("embeddings", hidden), ("attention", maps)):
                    got = item.get(name)
                    if want is None:
                        if got is not None:
                            return f"data[{i}].{name} not asked for, yet answered"
                        continue
                    if got is None:
                        return f"data[{i}].{name} missing"
                    error = self._compare(as_array(got), want)
                    if error:
                        return f"data[{i}].{name}: {error}"
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                return f"data[{i}] unreadable: {exc!r}"
        return None

    def _compare(self, got: np.ndarray, want: np.ndarray) -> str | None:
        if got.shape != want.shape:
            return f"shape {list(got.shape)}, expected {list(want.shape)}"
        diff = float(np.max(np.abs(got - want), initial=0.0))
        if not diff <= self.atol:  # NaN fails too
            return f"max |difference| {diff:.3g} from onnxruntime > atol {self.atol:g}"
        with self._lock:
            self.largest = max(self.largest, diff)
        return None


def as_array(value: Any) -> np.ndarray:
    """An answered array (nested floats or a base64 object) as float32."""
    if isinstance(value, dict):
        if value.get("dtype", "float32") != "float32":
            raise ValueError(f"dtype {value.get('dtype')!r}")
        raw = base64.b64decode(value["data"], validate=True)
        return np.frombuffer(raw, dtype="<f4").reshape(value["shape"]).astype(np.float32)
    return np.asarray(value, dtype=np.float32)


# -- the server's memory -------------------------------------------------------------------


def listening_pid(port: int) -> int:
    """The pid of the child of this process that listens on 127.0.0.1:``port``.

    ``running_server`` yields a port, not its process: find the socket's inode in
    /proc/net/tcp, then the child holding it.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(FileNotFoundError), open(table) as f:
            for line in itertools.islice(f, 1, None):
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{inode}]")
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[1] != me:  # the ppid field
                continue
            for fd in (proc / "fd").iterdir():
                with suppress(OSError):
                    if str(fd.readlink()) in inodes:
                        return int(proc.name)
        except OSError:
            continue
    raise RuntimeError(f"no child process of this one listens on port {port}")


def rss_mb(pid: int) -> float | None:
    """VmRSS of ``pid`` in MB; None once the process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / MB
    return None  # a zombie has no VmRSS


# -- the report ----------------------------------------------------------------------------


@dataclass
class Failure:
    kind: str
    cls: str
    variant: str
    rid: int
    detail: str

    def __str__(self) -> str:
        name = f"{self.cls}/{self.variant}" if self.variant else self.cls
        where = f"{name} request {self.rid}" if self.rid >= 0 else "server"
        return f"{self.kind}: {where}: {self.detail}"


@dataclass
class SoakReport:
    """What one soak saw. ``problems()`` empty means it passed."""

    config: SoakConfig
    model: str
    limits: Limits
    server_settings: dict[str, str]
    pid: int = 0
    elapsed: float = 0.0
    outcomes: dict[str, Counter[str]] = field(
        default_factory=lambda: {cls: Counter() for cls in CLASSES}
    )
    variants: defaultdict[str, Counter[str]] = field(  # by Planned.label
        default_factory=lambda: defaultdict(Counter)
    )
    latencies: list[float] = field(default_factory=list)  # seconds, valid 2xx answers
    checked: int = 0  # 2xx answers compared with onnxruntime
    largest_difference: float = 0.0  # among the answers within atol
    rss_ready: float | None = None
    rss_start: float | None = None  # at the end of the warm-up
    rss_end: float | None = None
    rss_peak: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.failures)

    def sent(self, cls: str) -> int:
        return self.outcomes[cls]["sent"]

    @property
    def rss_growth(self) -> float | None:
        if self.rss_start is None or self.rss_end is None:
            return None
        return self.rss_end - self.rss_start

    def percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile of valid answers' latency, in ms (NaN with none)."""
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return 1000 * ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    def problems(self) -> list[str]:
        """Every reason this run fails; empty when it passes."""
        out = [f"{self.count(kind)} {kind}" for kind in FAILURES if self.count(kind)]
        out += [f"no {cls} request sent" for cls in CLASSES if not self.sent(cls)]
        return out

    def render(self) -> str:
        cfg, lim = self.config, self.limits
        lines = [
            f"soak: {self.elapsed:.0f} s, {cfg.clients} clients + {cfg.slow_clients} slow, "
            f"model {self.model} (d_model {lim.d_model}), server pid {self.pid}",
            "server settings: " + " ".join(f"{k}={v}" for k, v in self.server_settings.items()),
            f"slow clients: each request spread over {cfg.slow_seconds:g} s in chunks every "
            f"{cfg.slow_interval:g} s",
            "",
            f"| class | sent | 2xx | refused (4xx by status) | shed {'/'.join(map(str, SHED))} "
            "| closed, no answer | failures |",
            "|---|---|---|---|---|---|---|",
        ]
        for cls in CLASSES:
            seen = self.outcomes[cls]
            ok = sum(n for k, n in seen.items() if k.isdigit() and k.startswith("2"))
            refused = " ".join(
                f"{k}×{n}"
                for k, n in sorted(seen.items())
                if k.isdigit() and k.startswith("4") and int(k) not in SHED
            )
            shed = sum(seen[str(s)] for s in SHED)
            closed = " ".join(
                f"{k}×{n}" for k, n in sorted(seen.items()) if not k.isdigit() and k != "sent"
            )
            failed = sum(f.cls == cls for f in self.failures)
            lines.append(
                f"| {cls} | {seen['sent']} | {ok} | {refused or '-'} | {shed} "
                f"| {closed or '-'} | {failed} |"
            )
        lines += ["", "| request | sent | answers |", "|---|---|---|"]
        for label, seen in sorted(self.variants.items()):
            answers = " ".join(f"{k}×{n}" for k, n in sorted(seen.items()) if k != "sent")
            lines.append(f"| {label} | {seen['sent']} | {answers or '-'} |")
        lines += [
            "",
            f"valid answers: {len(self.latencies)}, latency p50 {self.percentile_ms(0.5):.1f} ms, "
            f"p99 {self.percentile_ms(0.99):.1f} ms; {self.checked} 2xx answers checked against "
            f"onnxruntime in-process (same graph, each sequence alone): atol {cfg.atol:g}, "
            f"largest difference of a right answer {self.largest_difference:.2g}",
        ]
        growth = self.rss_growth
        verdict = (
            "unknown" if growth is None else ("PASS" if growth <= cfg.max_rss_growth_mb else "FAIL")
        )
        lines.append(
            f"server RSS: {mb(self.rss_ready)} MB at ready, {mb(self.rss_start)} MB after the "
            f"{cfg.warmup_seconds:g} s warm-up, {mb(self.rss_end)} MB at the end, peak "
            f"{self.rss_peak:.1f} MB: growth {mb(growth)} MB, allowed {cfg.max_rss_growth_mb:g} "
            f"MB: {verdict}"
        )
        lines.append(", ".join(f"{kind} {self.count(kind)}" for kind in FAILURES))
        shown = self.failures[:20]
        if shown:
            lines += ["", f"first {len(shown)} of {len(self.failures)} failures:"]
            lines += [f"  {f}" for f in shown]
        lines += [f"note: {n}" for n in self.notes]
        problems = self.problems()
        lines += [
            "",
            "RESULT: " + ("PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"),
        ]
        return "\n".join(lines)


def mb(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"


# -- the run -------------------------------------------------------------------------------


Part = tuple[bytes, int, float]  # bytes to send, chunk size, seconds between chunks


@dataclass
class Answer:
    """An HTTP answer read from a raw socket."""

    status: int
    headers: dict[str, str]
    body: bytes


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 response; IncompleteReadError/ConnectionError if the server closes first."""
    line = await reader.readline()
    if not line:
        raise asyncio.IncompleteReadError(b"", None)
    status = int(line.split(b" ", 2)[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    return Answer(status, headers, body)


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
                await self.raw(planned, [(planned.raw(), 64 * 1024, 0.0)], write_all=True)
            else:
                await self.http(client, planned)

    async def slow_client(self) -> None:
        while time.monotonic() < self.deadline:
            planned = self.requests.next(SLOW)
            self.record_sent(planned)
            head, body = planned.head(), planned.body
            if planned.variant == "slow-head":
                await self.raw(planned, [self.slowly(head), (body, len(body), 0.0)])
            else:
                await self.raw(planned, [(head, len(head), 0.0), self.slowly(body)])

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

    async def raw(self, planned: Planned, parts: list[Part], *, write_all: bool = False) -> None:
        """Send ``planned`` over a raw socket as ``parts`` (bytes, chunk size, seconds between
        chunks), reading the answer meanwhile: the server may answer (408, 413) or close
        before the last byte, and then the rest is not sent unless ``write_all``. One
        request must get one answer: a second one is a failure."""
        assert b"".join(data for data, _, _ in parts) == planned.raw()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError as exc:
            self.note(planned, "connect failed")
            self.fail("lost", planned, f"cannot connect: {exc!r}")
            return
        try:
            await self._exchange(planned, parts, reader, writer, write_all)
        finally:
            writer.close()
            with suppress(OSError):
                await writer.wait_closed()

    async def _exchange(
        self,
        planned: Planned,
        parts: list[Part],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        write_all: bool,
    ) -> None:
        answer = asyncio.create_task(read_answer(reader))
        written = 0
        try:
            for data, chunk, pause in parts:
                for offset in range(0, len(data), chunk):
                    if answer.done() and not write_all:
                        break
                    writer.write(data[offset : offset + chunk])
                    await writer.drain()
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
        except (OSError, asyncio.IncompleteReadError):
            # Closed without (a whole) answer: the refusal of a slow or oversized body. (A
            # server that answers 413 and closes with the body unread resets the connection,
            # which may discard the 413 before this side reads it.)
            self.note(planned, "closed")
            if planned.cls not in (SLOW, OVERSIZED) or (sent_all and planned.cls == SLOW):
                self.fail("lost", planned, "connection closed without an answer")
            return
        except (ValueError, IndexError) as exc:
            self.note(planned, "malformed")
            self.fail("unexpected status", planned, f"malformed HTTP response: {exc!r}")
            return
        # Anything more on this connection answers no request of ours.
        extra = b""
        with suppress(TimeoutError, OSError):
            extra = await asyncio.wait_for(reader.read(256), timeout=SECOND_ANSWER_WAIT)
        if extra:
            line = extra.split(b"\r\n", 1)[0].decode("latin-1")
            self.fail("answered twice", planned, f"{got.status}, then {line!r}")
        await self.judge(planned, got, None)

    async def abandon(self, planned: Planned, rng: random.Random) -> None:
        """Send the request (or half its body), wait 0-50 ms, hang up without reading."""
        data = planned.raw()
        if planned.variant == "mid-body":
            data = data[: len(data) - len(planned.body) // 2]
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError as exc:
            self.note(planned, "connect failed")
            self.fail("lost", planned, f"cannot connect: {exc!r}")
            return
        try:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(rng.uniform(0, 0.05))
        except OSError:
            pass
        finally:
            writer.close()
            with suppress(OSError):
                await writer.wait_closed()
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


def run_soak(model_dir: Path, config: SoakConfig | None = None) -> SoakReport:
    """Start a server on ``model_dir``, soak it per ``config``, stop it; the report."""
    config = config or SoakConfig()
    manifest = Manifest.read(model_dir)
    limits = Limits.for_model(manifest)
    settings = {
        **limits.server_settings(),
        "MAX_QUEUED_REQUESTS": str(config.max_queued or max(1, config.clients // 2)),
        "BODY_TIMEOUT": f"{config.body_timeout:g}",
        "HEADER_TIMEOUT": f"{config.body_timeout:g}",
        "DRAIN_SECONDS": "0",  # no load balancer to wait for at the end
        **config.server_settings,
    }
    report = SoakReport(config, manifest.name, limits, settings)
    reference = Reference(model_dir, config.atol)
    with running_server(model_dir, **settings) as port:
        report.pid = listening_pid(port)
        report.rss_ready = rss_mb(report.pid)
        soak = Soak(port, reference, report, Requests(limits, config.seed))
        asyncio.run(soak.run())
    return report


@contextmanager
def default_model_dir() -> Iterator[Path]:
    """models/minilm-l6 if exported, else the tiny test model exported to a temp dir."""
    exported = ROOT / "models" / "minilm-l6"
    if (exported / graph_io.CONFIG_FILE).exists():
        yield exported
        return
    from model_export.config import preset
    from model_export.export import export_model
    from model_export.model import Encoder

    seed = 1234  # tests/conftest.py's TINY_SEED
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        export_model(Encoder(preset("tiny"), seed=seed), model_dir, name="tiny", seed=seed)
        yield model_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = SoakConfig()
    parser.add_argument("--model-dir", type=Path, help="exported model directory (see above)")
    parser.add_argument("--seconds", type=float, default=defaults.seconds)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--slow-clients", type=int, default=defaults.slow_clients)
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=defaults.warmup_seconds,
        help="RSS growth is measured from the end of this first part of the run",
    )
    parser.add_argument(
        "--max-rss-growth-mb",
        type=float,
        default=defaults.max_rss_growth_mb,
        help="allowed growth of the server's RSS from the warm-up's end to the run's end",
    )
    parser.add_argument("--atol", type=float, default=defaults.atol)
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=defaults.body_timeout,
        help="the server's ATTNSERVE_BODY_TIMEOUT and HEADER_TIMEOUT",
    )
    parser.add_argument(
        "--slow-seconds",
        type=float,
        default=defaults.slow_seconds,
        help="a slow client spreads one request over this long (beyond --body-timeout)",
    )
    parser.add_argument("--slow-interval", type=float, default=defaults.slow_interval)
    parser.add_argument(
        "--max-queued", type=int, help="ATTNSERVE_MAX_QUEUED_REQUESTS (default clients / 2)"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    config = SoakConfig(
        seconds=args.seconds,
        clients=args.clients,
        slow_clients=args.slow_clients,
        warmup_seconds=min(args.warmup_seconds, args.seconds / 2),
        max_rss_growth_mb=args.max_rss_growth_mb,
        atol=args.atol,
        body_timeout=args.body_timeout,
        slow_seconds=args.slow_seconds,
        slow_interval=args.slow_interval,
        max_queued=args.max_queued,
        seed=args.seed,
    )
    with ExitStack() as stack:
        model_dir = args.model_dir or stack.enter_context(default_model_dir())
        report = run_soak(model_dir, config)
    print(report.render())
    return 0 if not report.problems() else 1


if __name__ == "__main__":
    sys.exit(main())
