"""Attention at scale: what compact attention answers cost, in bytes and in server memory.

For each model (MiniLM and a base-size model, 12 layers × 12 heads) and each length
(128 and 512 tokens: a text cut to that many), one request per answer form:

- ``full``: every map, float32 [L, H, n, n] (the full graph);
- ``fp16``: every map, float16 (the selected-maps graph casts each layer's);
- ``layer``: the last layer's maps, every head, float32 (the selected-maps graph);
- ``top8`` / ``top32``: each row's 8 / 32 largest weights and their keys, every layer
  and head (the compact graph);
- ``summaries``: the six per-head summaries [L, H], no maps (the compact graph);
- ``top8+summaries``: both (the compact graph, one run).

Each form goes over ``/v2`` binary, ``/v1/encode`` base64 and ``/v1/encode`` JSON; the
table reports the answer's bytes on the wire and, for the binary form, the server's
peak RSS during the request over its RSS before it (``VmHWM`` after resetting it
through ``/proc/PID/clear_refs``), with the server's default settings (memory budget
included: a refused request says so). A last table runs each attention graph alone,
in a fresh process (onnxruntime, no arena, 2 threads, weights not pre-packed, as the
service runs them), on one 512-token sequence of the base model: its peak RSS over
the RSS before the run, where the server's numbers come from.

    .venv/bin/python -m bench.attention_scale --base /path/to/mpnet-base [--minilm models/minilm-l6]

Writes ``bench/out/attention_scale.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from bench.lib.server import running_repository
from model_export import graph_io
from model_export.quantize_sentences import sentences

MiB = 1024 * 1024
FORMS: dict[str, dict[str, Any]] = {
    "full": {},
    "fp16": {"dtype": "float16"},
    "layer": {"layers": [-1]},
    "top8": {"top_k": 8},
    "top32": {"top_k": 32},
    "summaries": {"maps": False, "summaries": list(graph_io.SUMMARIES)},
    "top8+summaries": {"top_k": 8, "summaries": list(graph_io.SUMMARIES)},
}
V2_PARAMETERS: dict[str, dict[str, Any]] = {
    "full": {},
    "fp16": {"attention_dtype": "FP16"},
    "layer": {"attention_layers": "-1"},
    "top8": {"attention_top_k": 8},
    "top32": {"attention_top_k": 32},
    "summaries": {"attention_summaries": ",".join(graph_io.SUMMARIES)},
    "top8+summaries": {"attention_top_k": 8, "attention_summaries": ",".join(graph_io.SUMMARIES)},
}


def text_of(model_dir: Path, tokens: int) -> str:
    """A text of exactly ``tokens`` tokens, special tokens included."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_truncation()  # a tokenizer.json may carry its own (MiniLM's: 128)
    words = " ".join(sentences(400, seed=3))
    assert len(tokenizer.encode(words).ids) > tokens
    tokenizer.enable_truncation(tokens)
    ids = tokenizer.encode(words).ids
    text = tokenizer.decode(ids, skip_special_tokens=True)
    tokenizer.no_truncation()
    assert len(tokenizer.encode(text).ids) >= tokens  # the request truncates to ``tokens``
    return text


def peak_rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def v2_outputs(form: str) -> list[dict[str, Any]]:
    names = {
        "summaries": ["attention_summaries"],
        "top8+summaries": ["attentions", "attention_indices", "attention_summaries"],
    }.get(form, ["attentions", "attention_indices"] if form.startswith("top") else ["attentions"])
    return [{"name": n, "parameters": {"binary_data": True}} for n in names]


def one(url: str, pid: int, model: str, text: str, form: str, fmt: str) -> dict[str, Any]:
    """One request: its status, bytes and seconds, and the server's peak RSS during it
    (VmHWM reset to the current RSS first) over its RSS before it."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before, _ = peak_rss(pid)
    start = time.perf_counter()
    if fmt == "binary":
        header = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
            "outputs": v2_outputs(form),
            "parameters": {"truncate": True, **V2_PARAMETERS[form]},
        }
        r = httpx.post(f"{url}/v2/models/{model}/infer", json=header, timeout=600)
    else:
        body = {
            "model": model,
            "inputs": [text],
            "truncate": True,
            "return_attention": True,
            "attention": FORMS[form],
            "return_embeddings": False,
            "encoding_format": fmt,
        }
        r = httpx.post(f"{url}/v1/encode", json=body, timeout=600)
    seconds = time.perf_counter() - start
    _, peak = peak_rss(pid)
    return {
        "model": model,
        "form": form,
        "format": fmt,
        "status": r.status_code,
        "error": None if r.status_code == 200 else r.text[:300],
        "bytes": len(r.content),
        "seconds": round(seconds, 3),
        "rss_before_mib": round(before / MiB, 1),
        "peak_over_before_mib": round((peak - before) / MiB, 1),
        "peak_mib": round(peak / MiB, 1),
    }


def link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def repository(root: Path, *model_dirs: Path) -> Path:
    """A model repository of ``model_dirs`` (hard links: a symlink would resolve outside)."""
    for model_dir in model_dirs:
        if not (root / model_dir.name).exists():
            shutil.copytree(model_dir, root / model_dir.name, copy_function=link_or_copy)
    return root


def sizes(repo: Path, model_dirs: list[Path]) -> list[dict[str, Any]]:
    """Every form in every format at 128 and 512 tokens, on one server (defaults)."""
    rows = []
    with running_repository(repo) as served:
        for model_dir in model_dirs:
            for length in (128, 512):
                text = text_of(model_dir, length)
                for form in FORMS:
                    for fmt in ("binary", "base64", "float"):
                        row = one(served.url, served.pid, model_dir.name, text, form, fmt)
                        rows.append({"measure": "size", "tokens": length, **row})
                        print(json.dumps(rows[-1]), flush=True)
    return rows


def peaks(repo: Path, model_dir: Path, rounds: int) -> list[dict[str, Any]]:
    """A 512-token text over /v2 binary, one form per fresh server (defaults; nothing
    an earlier request left in its heap hides the peak), ``rounds`` times each."""
    rows = []
    text = text_of(model_dir, 512)
    for _ in range(rounds):
        for form in ("summaries", "top8+summaries", "top32", "layer", "fp16", "full"):
            with running_repository(repo) as served:
                row = one(served.url, served.pid, model_dir.name, text, form, "binary")
            rows.append({"measure": "peak", "tokens": 512, **row})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# (label, graph, layer marks, heads): "all" is every layer or head, "last" the last layer.
GRAPH_RUNS = (
    ("full maps, float32", graph_io.GRAPH_ATTENTION, None, None),
    ("top-8 rows + summaries", graph_io.GRAPH_COMPACT_ATTENTION, None, None),
    (
        "every map, float16",
        graph_io.GRAPH_SELECTED_ATTENTION,
        ("all", graph_io.LAYER_FLOAT16),
        "all",
    ),
    (
        "every map, float32",
        graph_io.GRAPH_SELECTED_ATTENTION,
        ("all", graph_io.LAYER_FLOAT32),
        "all",
    ),
    (
        "last layer, float32",
        graph_io.GRAPH_SELECTED_ATTENTION,
        ("last", graph_io.LAYER_FLOAT32),
        "all",
    ),
    (
        "last layer, one head",
        graph_io.GRAPH_SELECTED_ATTENTION,
        ("last", graph_io.LAYER_FLOAT32),
        "one",
    ),
    ("embeddings only", graph_io.GRAPH_EMBEDDINGS, None, None),
)


def graph_peak(model_dir: Path, run: int) -> dict[str, Any]:
    """GRAPH_RUNS[run] on one 512-token sequence, in this (fresh) process."""
    import numpy as np
    import onnxruntime as ort

    label, graph, marks, heads = GRAPH_RUNS[run]
    config = json.loads((model_dir / graph_io.CONFIG_FILE).read_text())["architecture"]
    layers, n_heads, width = config["n_layers"], config["n_heads"], config["d_model"]
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(str(model_dir / graph), options, ["CPUExecutionProvider"])
    tokens = 512
    embeds = np.random.default_rng(0).standard_normal((1, tokens, width), np.float32) * 0.1
    feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: np.ones((1, tokens), np.int64)}
    if graph == graph_io.GRAPH_COMPACT_ATTENTION:
        feeds[graph_io.INPUT_TOP_K] = np.zeros(8, np.int64)
    if marks is not None:
        which, mark = marks
        layer_marks = np.zeros(layers, np.int64)
        layer_marks[slice(None) if which == "all" else slice(-1, None)] = mark
        feeds[graph_io.INPUT_LAYERS] = layer_marks
        feeds[graph_io.INPUT_HEADS] = np.arange(n_heads if heads == "all" else 1, dtype=np.int64)
    small = {
        **feeds,
        graph_io.INPUT_EMBEDS: embeds[:, :8],
        graph_io.INPUT_MASK: feeds[graph_io.INPUT_MASK][:, :8],
    }
    session.run(None, small)  # the session's first run pays its own set-up
    Path("/proc/self/clear_refs").write_text("5")
    before, _ = peak_rss(os.getpid())
    outputs = session.run(None, feeds)
    _, peak = peak_rss(os.getpid())
    return {
        "measure": "graph",
        "form": label,
        "graph": graph,
        "outputs_mb": round(sum(o.nbytes for o in outputs) / 1e6, 1),
        "peak_over_before_mib": round((peak - before) / MiB, 1),
    }


def graph_peaks(model_dir: Path, rounds: int) -> list[dict[str, Any]]:
    """Every GRAPH_RUNS entry ``rounds`` times, each run in a fresh process (nothing freed
    earlier hides a peak; the allocator's reuse varies from run to run)."""
    rows = []
    command = [sys.executable, "-m", "bench.attention_scale", "--base", str(model_dir)]
    for _ in range(rounds):
        for run in range(len(GRAPH_RUNS)):
            done = subprocess.run(
                [*command, "--graph-run", str(run)], capture_output=True, text=True
            )
            if done.returncode != 0:
                raise RuntimeError(f"{GRAPH_RUNS[run][0]} failed:\n{done.stderr[-2000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def graph_table(rows: list[dict[str, Any]]) -> str:
    """docs/benchmarks.md's table of the graphs run alone (least–most over rounds)."""
    lines = [
        "| one 512-token sequence, run alone | graph | outputs | peak RSS over before |",
        "|---|---|---|---|",
    ]
    ran = [r for r in rows if r["measure"] == "graph"]
    for form in dict.fromkeys(r["form"] for r in ran):
        mine = [r for r in ran if r["form"] == form]
        least = min(r["peak_over_before_mib"] for r in mine)
        most = max(r["peak_over_before_mib"] for r in mine)
        lines.append(
            f"| {form} | `{mine[0]['graph']}` | {mine[0]['outputs_mb']} MB | "
            f"{least:.0f}–{most:.0f} MiB |"
        )
    return "\n".join(lines)


def megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


def size_table(rows: list[dict[str, Any]]) -> str:
    """docs/api.md's table: answer bytes per model, length and form, per wire format."""

    def cell(row: dict[str, Any]) -> str:
        if row["status"] == 413:  # "the response would be up to N bytes (...)"
            would = int(row["error"].split("up to ", 1)[1].split(" bytes", 1)[0].replace(",", ""))
            return f"413: ≤ {megabytes(would)}, over the limit"
        return megabytes(row["bytes"]) if row["status"] == 200 else str(row["status"])

    lines = [
        "| model | tokens | answer | /v2 binary | base64 | JSON |",
        "|---|---|---|---|---|---|",
    ]
    sized = [r for r in rows if r["measure"] == "size"]
    keys = dict.fromkeys((r["model"], r["tokens"], r["form"]) for r in sized)
    for model, tokens, form in keys:
        cells = {
            r["format"]: cell(r)
            for r in sized
            if (r["model"], r["tokens"], r["form"]) == (model, tokens, form)
        }
        lines.append(
            f"| {model} | {tokens} | {form} | {cells['binary']} | {cells['base64']} | "
            f"{cells['float']} |"
        )
    return "\n".join(lines)


def peak_table(rows: list[dict[str, Any]]) -> str:
    """docs/benchmarks.md's table: the server's peak RSS per form (min over rounds)."""
    lines = [
        "| answer (512 tokens, /v2 binary) | status | answer | peak RSS over idle | peak RSS |",
        "|---|---|---|---|---|",
    ]
    peaked = [r for r in rows if r["measure"] == "peak"]
    for form in dict.fromkeys(r["form"] for r in peaked):
        mine = [r for r in peaked if r["form"] == form]
        best = min(mine, key=lambda r: r["peak_over_before_mib"])
        worst = max(r["peak_over_before_mib"] for r in mine)
        lines.append(
            f"| {form} | {best['status']} | {megabytes(best['bytes'])} | "
            f"{best['peak_over_before_mib']:.0f}–{worst:.0f} MiB | {best['peak_mib']:.0f} MiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="a base-size model directory")
    parser.add_argument("--minilm", type=Path, default=Path("models/minilm-l6"))
    parser.add_argument("--rounds", type=int, default=2, help="fresh servers per peak form")
    parser.add_argument("--out", type=Path, default=Path("bench/out/attention_scale.json"))
    parser.add_argument("--render", action="store_true", help="print the tables of --out")
    parser.add_argument("--graph-run", type=int, help=argparse.SUPPRESS)  # one graph_peak
    parser.add_argument("--graphs-only", action="store_true", help="only the graphs run alone")
    args = parser.parse_args(argv)
    if args.graph_run is not None:
        print(json.dumps(graph_peak(args.base, args.graph_run)))
        return 0
    if args.render:
        rows = json.loads(args.out.read_text())
        print(size_table(rows), peak_table(rows), graph_table(rows), sep="\n\n")
        return 0
    if args.graphs_only:
        print(graph_table(graph_peaks(args.base, args.rounds)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        both = repository(Path(tmp) / "both", args.minilm, args.base)
        rows = sizes(both, [args.minilm, args.base])
        rows += peaks(repository(Path(tmp) / "base", args.base), args.base, args.rounds)
    rows += graph_peaks(args.base, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(size_table(rows), peak_table(rows), graph_table(rows), sep="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
