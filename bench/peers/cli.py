"""``python -m bench.peers``: measure (writes the results JSON), then render the report
and the plot from that JSON; ``--from-json`` renders an earlier run's again."""

from __future__ import annotations

import argparse
import datetime
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import bench.peers
from bench.lib.models import DEFAULT_MODEL_DIR, OUT, ROOT, model_config
from bench.lib.results import read_json, write_json
from bench.peers.common import Bench, Results, hf_weights, venv_ready
from bench.peers.contenders.infinity import infinity
from bench.peers.contenders.inprocess import optimum_export
from bench.peers.contenders.ours import ours
from bench.peers.contenders.pytriton import TritonSetting, parse_triton_settings, pytriton
from bench.peers.measure import Starter, measure
from bench.peers.plot import plot
from bench.peers.ratios import ratios
from bench.peers.report import report, write_doc
from bench.peers.workloads import WORKLOADS, make_inputs
from bench.peers.wrk import WRK_WORKLOADS, wrk_binary

CONTENDERS = ("inproc", "ours", "pytriton", "infinity")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--smoke`` shrinks the run (1 round, 40 requests, 0.3 s)."""
    description = (bench.peers.__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=description)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=600, help="per run, at most")
    parser.add_argument("--seconds", type=float, default=4.0, help="per run, at most")
    parser.add_argument("--only", default="", help="comma list: " + ",".join(CONTENDERS))
    parser.add_argument("--workloads", default="", help="comma list, e.g. W1,W2,W4 (default: all)")
    parser.add_argument(
        "--pytriton-settings",
        default="0,500,2000,0x2",
        help="PyTriton's sweep: batching windows in µs, 'xN' for N model instances",
    )
    parser.add_argument(
        "--wrk-workloads",
        default=WRK_WORKLOADS,
        help="where wrk drives the servers too (rows ', wrk'); '' for none",
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
        if args.wrk_workloads == WRK_WORKLOADS:  # one workload shows the wrk rows work
            args.wrk_workloads = "W2"
    return args


def output_paths(args: argparse.Namespace, scratch: Path) -> tuple[Path, Path, Path]:
    """Where the report, the plot and the raw JSON go: docs/ and bench/out/, or, for a
    smoke run, the scratch directory (unless given)."""
    out_dir = scratch if args.smoke else None
    doc = args.doc or (out_dir / "benchmarks.md" if out_dir else ROOT / "docs" / "benchmarks.md")
    png = args.plot or (out_dir / "peers.png" if out_dir else ROOT / "docs" / "img" / "peers.png")
    raw = args.json or (out_dir / "peers.json" if out_dir else OUT / "peers.json")
    return doc, png, raw


def new_bench(args: argparse.Namespace, config: dict[str, Any]) -> Bench:
    """The run's state for the model ``config`` describes, its inputs made."""
    d_model = config["architecture"]["d_model"]
    max_seq = min(512, config["architecture"]["max_seq_len"])
    vocab = (config.get("text") or {}).get("vocab_size", 1000)
    results = Results(
        name=config["name"],
        d_model=d_model,
        max_seq=max_seq,
        rounds=args.rounds,
        requests=args.requests,
        seconds=args.seconds,
        fused=config.get("optimizations", {}).get("model.onnx"),
        date=datetime.date.today().isoformat(),
    )
    bench = Bench(
        model_dir=args.model_dir.resolve(),
        inputs=make_inputs(d_model, max_seq, vocab),
        runs=args.requests,
        text=config.get("text") is not None and not args.smoke,
        results=results,
        hf_dir=hf_weights(config),
    )
    if config.get("text") is None:
        bench.note(f"T1 and graph comparison: skipped ({results.name} has no tokenizer)")
    return bench


def server_starters(
    bench: Bench,
    only: set[str],
    scratch: Path,
    optimum_dir: Path | None,
    triton_settings: list[TritonSetting],
) -> list[Starter]:
    """The servers asked for whose venvs exist, each as (name, how to start it)."""
    starters: list[Starter] = []
    if "ours" in only:
        starters.append(("ours", lambda: ours(bench, scratch)))
    if "pytriton" in only and venv_ready(bench, "pytriton", "PyTriton"):
        for setting in triton_settings:
            starters.append(
                (f"PyTriton {setting.label}", partial(pytriton, bench, scratch, setting))
            )
    if "infinity" in only and bench.text and venv_ready(bench, "infinity", "infinity-emb"):
        hf_dir = optimum_dir or optimum_export(bench)
        if hf_dir is None:
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


def use_wrk(bench: Bench, workloads: str, chosen: set[str]) -> None:
    """wrk drives the servers on ``workloads`` too, if it is installed (else noted)."""
    bench.wrk_workloads = set(filter(None, workloads.split(","))) & chosen
    if not bench.wrk_workloads:
        return
    bench.wrk = wrk_binary()
    if bench.wrk is None:
        bench.note("wrk: skipped (not installed: run bench/peers/setup_wrk.sh)")


def run(args: argparse.Namespace, config: dict[str, Any], scratch: Path, raw: Path) -> None:
    """Every contender asked for, every round; the results written to ``raw``."""
    only = set(filter(None, args.only.split(","))) or set(CONTENDERS)
    bench = new_bench(args, config)
    optimum_dir = optimum_export(bench) if bench.text and "inproc" in only else None
    st = "inproc" in only and bench.text and venv_ready(bench, "optimum", "sentence-transformers")
    triton_settings = parse_triton_settings(args.pytriton_settings)
    starters = server_starters(bench, only, scratch, optimum_dir, triton_settings)
    chosen = set(filter(None, args.workloads.split(","))) or {w.key for w in WORKLOADS}
    workloads = [w for w in WORKLOADS if (bench.text or not w.text) and w.key in chosen]
    use_wrk(bench, args.wrk_workloads, chosen)
    settle = 0.2 if args.smoke else 2.0
    measure(bench, starters, workloads, settle, optimum_dir, st, "inproc" in only)
    results = bench.results
    write_json(raw, results.to_json(lambda w, row: ratios(results, w, row)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    doc, png, raw = output_paths(args, scratch)
    config = model_config(args.model_dir.resolve())
    if args.from_json is None:
        run(args, config, scratch, raw)
    results = Results.from_json(read_json(args.from_json or raw), config)
    block = report(results)
    write_doc(doc, block)
    plot(results, png)
    print(block)
    written = [doc, png] if args.from_json else [doc, png, raw]
    print(f"\nwrote {', '.join(map(str, written))}")
    if not any(p.resolve().is_relative_to(scratch.resolve()) for p in (doc, png, raw)):
        shutil.rmtree(scratch, ignore_errors=True)  # else the smoke run's output lives there
    return 0
