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

import json
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def timed(fn: Callable[[], Any], seconds: float, runs: int) -> dict[str, float]:
    """p50/p99 ms, runs, wall and CPU cores of ``fn`` repeated (after one warm-up)."""
    fn()
    times: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while len(times) < runs and time.perf_counter() - wall0 < seconds:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    wall = time.perf_counter() - wall0
    times.sort()
    return {
        "runs": len(times),
        "wall_s": wall,
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[max(0, int(len(times) * 0.99) - 1)],
        "cores": (time.process_time() - cpu0) / wall,
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


def run_task(task: dict[str, Any], inputs: Any, outputs: dict[str, Any]) -> dict[str, Any]:
    kind, seconds, runs, threads = task["kind"], task["seconds"], task["runs"], task["threads"]
    if kind == "embeds":  # our model.onnx / model_attn.onnx on inputs_embeds
        session = ort_session(task["graph"], threads)
        embeds = inputs[task["embeds"]]
        mask = inputs[task["mask"]]
        feeds = {"inputs_embeds": embeds, "attention_mask": mask}
        stats = timed(lambda: session.run(None, feeds), seconds, runs)
        stats["items"] = int(mask.sum())
        return stats
    if kind in ("ids", "text"):  # our embeddings.onnx + model.onnx, or optimum's model.onnx
        text = Text(task["model_dir"], task["optimum"], threads)
        if kind == "ids":
            ids = inputs[task["ids"]]
            mask = np.ones_like(ids)
            stats = timed(lambda: text.ids(ids, mask), seconds, runs)
            stats["items"] = int(ids.size)
            return stats
        return timed_texts(task, text.texts, outputs)
    if kind in ("st", "st-onnx"):  # sentence-transformers in-process, torch or ONNX backend
        model = sentence_transformer(task)

        def encode(texts: list[str]) -> np.ndarray:
            vectors: np.ndarray = model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
            return vectors

        return timed_texts(task, encode, outputs)
    raise ValueError(f"unknown task kind {kind!r}")


def timed_texts(
    task: dict[str, Any], encode: Callable[[list[str]], np.ndarray], outputs: dict[str, Any]
) -> dict[str, Any]:
    """The text batches encoded in turn, timed; then every batch's answer, for the check."""
    batches: list[list[str]] = task["texts"]
    turn = iter(range(10**9))
    stats = timed(lambda: encode(batches[next(turn) % len(batches)]), task["seconds"], task["runs"])
    for j, batch in enumerate(batches):
        outputs[f"{task['name']}#{j}"] = np.asarray(encode(batch), dtype=np.float32)
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
