"""The in-process contenders: the limit every ratio divides by, and text in-process.

Each runs in a worker process of its own (``workers/inproc_worker.py``): our venv's
onnxruntime on our graphs (the limit: each workload's request batched as a server
at best could, at every thread and concurrency setting of ``bench.peers.limit``) and
on the optimum export of the same weights; the optimum venv's sentence-transformers
on torch and on its ONNX backend.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers.checks import (
    WrongAnswer,
    check_answers,
    checked_calls,
    fail_round,
    record_round,
)
from bench.peers.common import OUT_PEERS, THREADS, VENVS, WORKERS, Bench
from bench.peers.limit import (
    OUR_GRAPHS,
    batch_sizes,
    limit_name,
    settings,
    text_batch_sizes,
    text_window,
)
from bench.peers.workloads import WORKLOADS, Workload, padded, text_batches


def run_inprocess(bench: Bench, w: Workload, optimum_dir: Path | None, st: bool) -> None:
    """The in-process limit of one workload, in a worker process of its own.

    For text (T1) also: onnxruntime on the optimum export, the graph-against-graph
    comparison on token ids, and sentence-transformers in the optimum venv.
    """
    work = Path(tempfile.mkdtemp(prefix="peers-inproc-"))
    try:
        arrays: dict[str, Any] = {}  # name -> array (np.savez takes them as keywords)
        tasks: list[dict[str, Any]] = []
        base = {"seconds": bench.seconds, "runs": bench.runs, "threads": THREADS}
        if not w.text:
            graph = str(bench.model_dir / ("model_attn.onnx" if w.attention else "model.onnx"))
            seqs = bench.inputs.seqs[w.key]
            for s in settings(w):
                for k in batch_sizes(w, s):
                    if f"{w.key}x{k}_e" not in arrays:  # the request merged k-fold
                        embeds, mask = padded(seqs * k)
                        arrays[f"{w.key}x{k}_e"], arrays[f"{w.key}x{k}_m"] = embeds, mask
                    tasks.append(
                        base
                        | s.task
                        | {"name": f"{w.key} limit|{limit_name(k, s)}", "kind": "embeds"}
                        | {"graph": graph, "embeds": f"{w.key}x{k}_e", "mask": f"{w.key}x{k}_m"}
                    )
        else:
            tasks += text_tasks(bench, w, base, optimum_dir)
            if w.key == "T1":
                tasks += graph_tasks(bench, base, arrays, optimum_dir)
        results = _worker(Path(sys.executable), work, "ours", tasks, arrays)
        if st and w.text and bench.hf_dir is not None:  # on torch and its ONNX backend
            requests, check = request_texts(bench, w)
            st_base = base | {"texts": requests, "check": check, "model_dir": str(bench.hf_dir)}
            st_tasks: list[dict[str, Any]] = [
                st_base | {"name": f"{w.key} sentence-transformers", "kind": "st"},
                st_base
                | {"name": f"{w.key} sentence-transformers ONNX", "kind": "st-onnx"}
                | {"cache_dir": str(OUT_PEERS / f"{bench.results.name}-st-onnx")},
            ]
            try:
                results |= _worker(VENVS / "optimum" / "bin" / "python", work, "st", st_tasks, {})
            except (subprocess.SubprocessError, OSError) as exc:  # not the limit's round too
                reason = f"its worker failed: {type(exc).__name__}: {exc}"
                results |= {task["name"]: {"error": reason} for task in st_tasks}
        _record_inprocess(bench, results, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def request_texts(bench: Bench, w: Workload) -> tuple[list[list[str]], list[str]]:
    """What an in-process text contender (not the limit) encodes in turn: T1's request
    batches, or T2's query texts ``c`` at a time (the requests in flight, as one batch;
    T2L: one); and the texts whose answers are checked (every checked call's, in order)."""
    calls = text_batches(bench.inputs, w)
    check = [t for i in checked_calls(w, len(calls)) for t in calls[i]]
    if w.key == "T1":
        return calls, check
    queries, window = bench.inputs.queries, w.concurrency
    requests = [queries[i : i + window] for i in range(0, min(len(queries), 64 * window), window)]
    return requests, check


def text_tasks(
    bench: Bench, w: Workload, base: dict[str, Any], optimum_dir: Path | None
) -> list[dict[str, Any]]:
    """A text workload's in-process tasks: the limit (our graphs behind the tokenizer,
    length-sorted batches, at every setting and batch size), and the optimum export run
    as our server runs a graph."""
    requests, check = request_texts(bench, w)
    stream = [t for batch in text_batches(bench.inputs, w) for t in batch]
    tasks = [
        base
        | s.task
        | {"name": f"{w.key} {OUR_GRAPHS}, {limit_name(k, s)}", "kind": "text-limit"}
        | {"texts": stream, "window": text_window(w, s), "batch": k, "check": check}
        | {"model_dir": str(bench.model_dir)}
        for s in settings(w)
        for k in text_batch_sizes(w, s)
    ]
    if optimum_dir is not None:  # the optimum export, as our server runs a graph
        tasks.append(
            base
            | {"name": f"{w.key} onnxruntime, optimum export", "kind": "text"}
            | {"texts": requests, "check": check, "model_dir": str(optimum_dir)}
            | {"optimum": True}
        )
    return tasks


def graph_tasks(
    bench: Bench, base: dict[str, Any], arrays: dict[str, Any], optimum_dir: Path | None
) -> list[dict[str, Any]]:
    """Our graphs against the optimum export on the same token ids (tokenizer excluded)."""
    tasks = []
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
    return tasks


def _worker(
    python: Path, work: Path, tag: str, tasks: list[dict[str, Any]], arrays: dict[str, Any]
) -> dict[str, Any]:
    inputs = work / f"{tag}-inputs.npz"
    np.savez(inputs, **arrays)
    job: dict[str, Any] = {
        "tasks": tasks,
        "inputs": str(inputs),
        "outputs": str(work / f"{tag}-outputs.npz"),
        "results": str(work / f"{tag}-results.json"),
    }
    (work / f"{tag}.json").write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    timeout = 120 + 60 * len(tasks)  # a hung worker must not hang the benchmark
    subprocess.run(
        [str(python), str(WORKERS / "inproc_worker.py"), str(work / f"{tag}.json")],
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
    texts = {w.key: w for w in WORKLOADS if w.text}
    for name, stats in results.items():
        stats["round"] = bench.round
        key, _, contender = name.partition(" ")
        if "error" in stats:
            if key in texts:
                fail_round(bench, texts[key], contender, stats["error"])
            else:  # a limit's run: the round has no limit, every ratio of it is dropped
                what = name.replace("|", " ")
                bench.note(f"✗ in-process {what}: round {bench.round} failed: {stats['error']}")
            continue
        stats["items_per_s"] = stats["items"] * stats["runs"] / stats["wall_s"]
        if key == "graph":
            bench.row("graph", contender).rounds.append(stats)
        elif key in texts:
            w = texts[key]
            try:
                stats |= check_answers(bench, w, checked_answers(bench, w, outputs, name))
            except WrongAnswer as exc:
                fail_round(bench, w, contender, f"wrong answer: {exc}")
                continue
            record_round(bench, w, contender, stats)
        else:
            workload, contender = name.split("|")
            bench.row(workload, contender).rounds.append(stats)
    print("  in-process done", flush=True)


def checked_answers(
    bench: Bench, w: Workload, outputs: dict[str, np.ndarray], name: str
) -> list[tuple[int, dict[str, list[np.ndarray]]]]:
    """A text contender's answer to the checked calls' texts, split back into calls."""
    if f"{name}#check" not in outputs:
        return []
    vectors, calls = list(outputs[f"{name}#check"]), text_batches(bench.inputs, w)
    answers = []
    for i in checked_calls(w, len(calls)):
        answers.append((i, {"pooled": vectors[: len(calls[i])]}))
        vectors = vectors[len(calls[i]) :]
    return answers


def optimum_export(bench: Bench) -> Path | None:
    """The standard export of the same weights (cached under bench/out/peers)."""
    if bench.hf_dir is None:
        bench.note("optimum export: skipped (the model has no Hugging Face folder)")
        return None
    target = OUT_PEERS / f"{bench.results.name}-optimum"
    if (target / "model.onnx").exists():
        return target
    cli = VENVS / "optimum" / "bin" / "optimum-cli"
    if not cli.exists():
        bench.note("optimum export: skipped (no venv: run bench/peers/setup_optimum.sh)")
        return None
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [str(cli), "export", "onnx", "--model", str(bench.hf_dir), "--task"]
    cmd += ["feature-extraction", "--library-name", "transformers", str(tmp)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    print("exporting the optimum graph …", flush=True)
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=600)
    tmp.rename(target)
    return target
