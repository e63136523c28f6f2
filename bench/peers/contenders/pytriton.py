"""PyTriton (Triton core, its dynamic batcher) serving our graphs, one server per setting
of its sweep (batching window, model instances), in its own venv."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.lib.models import ROOT
from bench.lib.server import free_port, peer_process
from bench.peers.common import (
    PYTRITON,
    PYTRITON_GRPC,
    THREADS,
    VENVS,
    WORKERS,
    Bench,
    Server,
)
from bench.peers.wire import GRPC_WORKLOADS, Call, grpc_call, v2_call
from bench.peers.workloads import Workload


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
            str(WORKERS / "pytriton_server.py"),
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
