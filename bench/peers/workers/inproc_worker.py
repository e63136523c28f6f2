"""In-process contenders for ``python -m bench.peers``, one process per venv and round.

Runs under whichever Python the benchmark picks: our own venv for onnxruntime
(on our graphs and on the optimum export of the same weights), the optimum venv
for sentence-transformers (on torch, and on its ONNX backend). It imports only
numpy at the top so any of those venvs can run it. The job is a JSON file (plus
an .npz of inputs) written by bench.peers; the answer is a JSON file of
timings plus an .npz of outputs (every text batch's) for the numerical check.
Every loop is bounded by count and time.

    python bench/peers/workers/inproc_worker.py JOB.json
"""

from __future__ import annotations

import itertools
import json
import resource
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np


def timed(fn: Callable[[], Any], seconds: float, runs: int) -> dict[str, float]:
    """p50/p99 ms, runs, wall and CPU cores of ``fn`` repeated (after one warm-up)."""
    return timed_together([fn], seconds, runs)


def timed_together(fns: Sequence[Callable[[], Any]], seconds: float, runs: int) -> dict[str, float]:
    """``timed`` with one Python thread per function, all running at once (onnxruntime
    releases the GIL in ``run``): ``runs`` is the count over all of them, each run's time
    is its own, the wall is the whole."""
    for fn in fns:
        fn()
    times: list[float] = []
    errors: list[Exception] = []  # a thread's failure, raised here once all have stopped
    lock = threading.Lock()
    clock = {"cpu0": 0.0, "wall0": 0.0}  # set once, by the last thread to reach the start

    def start() -> None:
        clock["cpu0"], clock["wall0"] = time.process_time(), time.perf_counter()

    start_together = threading.Barrier(len(fns), action=start)

    def loop(fn: Callable[[], Any]) -> None:
        start_together.wait()
        while True:
            with lock:  # a run is counted before it starts: never more than ``runs``
                late = time.perf_counter() - clock["wall0"] >= seconds
                if errors or len(times) >= runs or late:
                    return
                times.append(0.0)
                slot = len(times) - 1
            began = time.perf_counter()
            try:
                fn()
            except Exception as exc:  # stops every thread; raised by the caller
                errors.append(exc)
                return
            times[slot] = time.perf_counter() - began

    threads = [threading.Thread(target=loop, args=(fn,)) for fn in fns[1:]]
    for thread in threads:
        thread.start()
    loop(fns[0])
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    wall = time.perf_counter() - clock["wall0"]
    times.sort()
    return {
        "runs": len(times),
        "wall_s": wall,
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[max(0, int(len(times) * 0.99) - 1)],
        "cores": (time.process_time() - clock["cpu0"]) / wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def ort_session(path: str, threads: int) -> Any:
    """Same settings as our server: 2 intra-op threads, no spinning."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over real tokens, then L2-normalised (all-MiniLM-L6-v2's and
    all-mpnet-base-v2's own pooling)."""
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    normed: np.ndarray = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return normed


class Text:
    """Texts -> sentence embeddings with onnxruntime: our two graphs or optimum's one."""

    def __init__(self, model_dir: str, optimum: bool, threads: int) -> None:
        from tokenizers import Tokenizer

        self.optimum = optimum
        self.tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
        self.tokenizer.enable_padding()
        self.tokenizer.no_truncation()
        self.plain = Tokenizer.from_file(f"{model_dir}/tokenizer.json")  # no padding
        self.plain.no_padding()
        self.plain.no_truncation()
        if optimum:
            self.model = ort_session(f"{model_dir}/model.onnx", threads)
        else:
            self.embed = ort_session(f"{model_dir}/embeddings.onnx", threads)
            self.model = ort_session(f"{model_dir}/model.onnx", threads)

    def ids(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        types = np.zeros_like(ids)
        if self.optimum:
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            # Only what the graph takes: MPNet's, RoBERTa's exports have no token types.
            feeds = {i.name: feeds[i.name] for i in self.model.get_inputs()}
        else:
            (embeds,) = self.embed.run(None, {"input_ids": ids, "token_type_ids": types})
            feeds = {"inputs_embeds": embeds, "attention_mask": mask}
        hidden: np.ndarray = self.model.run(None, feeds)[0]
        return hidden

    def texts(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return mean_pool(self.ids(ids, mask), mask)

    def sorted_texts(self, texts: list[str], batch: int) -> np.ndarray:
        """``texts`` tokenized, sorted by token count and run in batches of ``batch``, each
        padded to its own longest (the least padding); the vectors in the texts' order."""
        encodings = [e.ids for e in self.plain.encode_batch(texts)]
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i]))
        vectors: list[np.ndarray] = [np.empty(0)] * len(texts)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            ids = np.zeros((len(chunk), max(len(encodings[i]) for i in chunk)), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(chunk):
                ids[row, : len(encodings[i])] = encodings[i]
                mask[row, : len(encodings[i])] = 1
            for row, pooled in zip(chunk, mean_pool(self.ids(ids, mask), mask), strict=True):
                vectors[row] = pooled
        return np.stack(vectors)


def text_limit(task: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    """The text limit at one setting: each run takes the next ``window`` texts of the
    stream (the requests a server could hold at once), tokenizes them, sorts them by
    length and runs them in batches of ``batch``; ``concurrent`` runs at once over
    ``sessions`` pairs of sessions of ``threads`` threads."""
    stream: list[str] = task["texts"]
    window, batch = task["window"], task["batch"]
    texts = [Text(task["model_dir"], False, task["threads"]) for _ in range(task["sessions"])]
    turn = itertools.count()  # next() is atomic under the GIL: threads share the turns
    looped = stream + stream[:window]

    def one(text: Text) -> None:
        start = (next(turn) * window) % len(stream)
        text.sorted_texts(looped[start : start + window], batch)

    fns = [partial(one, texts[i % len(texts)]) for i in range(task["concurrent"])]
    stats = timed_together(fns, task["seconds"], task["runs"])
    outputs[f"{task['name']}#check"] = texts[0].sorted_texts(task["check"], batch)
    stats["items"] = window
    return stats


def run_task(task: dict[str, Any], inputs: Any, outputs: dict[str, Any]) -> dict[str, Any]:
    """One contender timed. ``concurrent`` runs at once (default 1) over ``sessions``
    sessions (default 1), each of ``threads`` intra-op threads: the limit's settings."""
    kind, seconds, runs, threads = task["kind"], task["seconds"], task["runs"], task["threads"]
    concurrent = task.get("concurrent", 1)
    if kind == "embeds":  # our model.onnx / model_attn.onnx on inputs_embeds
        sessions = [ort_session(task["graph"], threads) for _ in range(task.get("sessions", 1))]
        embeds = inputs[task["embeds"]]
        mask = inputs[task["mask"]]
        feeds = {"inputs_embeds": embeds, "attention_mask": mask}
        fns = [partial(sessions[i % len(sessions)].run, None, feeds) for i in range(concurrent)]
        stats = timed_together(fns, seconds, runs)
        stats["items"] = int(mask.sum())
        return stats
    if kind == "text-limit":  # our graphs behind the tokenizer, length-sorted batches
        return text_limit(task, outputs)
    if kind in ("ids", "text"):  # our embeddings.onnx + model.onnx, or optimum's model.onnx
        text = Text(task["model_dir"], task["optimum"], threads)
        if kind == "ids":
            ids = inputs[task["ids"]]
            mask = np.ones_like(ids)
            stats = timed(lambda: text.ids(ids, mask), seconds, runs)
            stats["items"] = int(ids.size)
            return stats
        return timed_texts(task, text.texts, outputs, concurrent)
    if kind in ("st", "st-onnx"):  # sentence-transformers in-process, torch or ONNX backend
        model = sentence_transformer(task)

        def encode(texts: list[str]) -> np.ndarray:
            vectors: np.ndarray = model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
            return vectors

        return timed_texts(task, encode, outputs)
    raise ValueError(f"unknown task kind {kind!r}")


def timed_texts(
    task: dict[str, Any],
    encode: Callable[[list[str]], np.ndarray],
    outputs: dict[str, Any],
    concurrent: int = 1,
) -> dict[str, Any]:
    """The text batches encoded in turn (by ``concurrent`` threads at once), timed; then
    the answer of the texts to check (``check``), encoded together, for the check."""
    batches: list[list[str]] = task["texts"]
    turn = itertools.count()  # next() is atomic under the GIL: threads share the turns

    def one() -> None:
        encode(batches[next(turn) % len(batches)])

    stats = timed_together([one] * concurrent, task["seconds"], task["runs"])
    outputs[f"{task['name']}#check"] = np.asarray(encode(task["check"]), dtype=np.float32)
    stats["items"] = len(batches[0])
    return stats


def sentence_transformer(task: dict[str, Any]) -> Any:
    """sentence-transformers from the local weights (no hub): on torch (``st``, torch's
    threads set like everyone's), or on its ONNX backend (``st-onnx``, its own defaults:
    onnxruntime's CPU provider, the graph it exports with optimum, saved once to
    ``cache_dir`` so later rounds load it instead of exporting again)."""
    from sentence_transformers import SentenceTransformer

    if task["kind"] == "st":
        import torch

        torch.set_num_threads(task["threads"])
        return SentenceTransformer(task["model_dir"], device="cpu")
    cache = Path(task["cache_dir"])
    if (cache / "onnx" / "model.onnx").exists():
        return SentenceTransformer(str(cache), device="cpu", backend="onnx")
    model = SentenceTransformer(task["model_dir"], device="cpu", backend="onnx")
    partial = cache.with_name(cache.name + ".tmp")  # the export, made once, kept whole
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    partial.rename(cache)
    return model


def main() -> int:
    job_path = Path(sys.argv[1])
    job = json.loads(job_path.read_text())
    inputs = np.load(job["inputs"]) if job.get("inputs") else {}
    outputs: dict[str, Any] = {}  # name -> array (np.savez takes them as keywords)
    results: dict[str, Any] = {}
    for task in job["tasks"]:
        try:
            results[task["name"]] = run_task(task, inputs, outputs)
        except Exception as exc:  # one failing contender must not hide the others
            results[task["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
    np.savez(job["outputs"], **outputs)
    Path(job["results"]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
