"""A model load beside serving: a one-text request's latency with no load, during a
load of a second model, and during a load/unload storm (issue 44, item 2).

One real server (``python -m service``, ``ATTNSERVE_MODEL_CONTROL=explicit``) on a
temporary repository holding the default model and ``--storm`` renamed copies of
it. One client sends one-text ``/v1/embeddings`` requests to the default model
back to back throughout; meanwhile:

- ``baseline``: nothing else, for ``--seconds`` seconds;
- ``load``: ``--loads`` times, the copy ``copy-1`` is loaded (only the requests
  sent while the load call runs count), then unloaded;
- ``storm``: for ``--seconds`` seconds, ``--storm`` threads each load and unload
  their own copy in a loop (the issue's three concurrent loads).

p50/p99 of each phase and their ratios to the baseline's, and how many requests
each phase answered. Target: p99 during a load <= 2x the baseline's.

    .venv/bin/python -m bench.hardening.load --model-dir models/minilm-l6

Writes ``bench/out/hardening-load.json``. The machine is shared: compare the
ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.models import DEFAULT_MODEL_DIR, OUT, ROOT
from bench.lib.results import write_json
from bench.lib.server import running_checkout
from model_export import graph_io

TEXT = "A short sentence to embed."


def repository(model_dir: Path, root: Path, copies: int) -> tuple[Path, list[str]]:
    """``root/repo`` holding ``model_dir`` and ``copies`` copies named copy-1..n."""
    repo = root / "repo"
    shutil.copytree(model_dir, repo / model_dir.name)
    names = []
    for i in range(1, copies + 1):
        name = f"copy-{i}"
        shutil.copytree(model_dir, repo / name)
        config = repo / name / graph_io.CONFIG_FILE
        raw = json.loads(config.read_text())
        raw["name"] = name
        config.write_text(json.dumps(raw))
        names.append(name)
    return repo, names


class Requests:
    """One-text requests to ``model`` back to back on a thread: (start, seconds, status)."""

    def __init__(self, url: str, model: str) -> None:
        self.done: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, args=(url, model))

    def _send(self, url: str, model: str) -> None:
        body = {"model": model, "input": TEXT}
        with httpx.Client(base_url=url, timeout=300) as http:
            while not self._stop.is_set():
                start = time.monotonic()
                status = http.post("/v1/embeddings", json=body).status_code
                self.done.append((start, time.monotonic() - start, status))

    @contextmanager
    def running(self) -> Iterator[Requests]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()

    def within(self, windows: list[tuple[float, float]]) -> list[tuple[float, int]]:
        return [(s, status) for t, s, status in self.done if any(a <= t < b for a, b in windows)]


def stats(answers: list[tuple[float, int]], seconds: float) -> dict[str, Any]:
    latencies = np.array([s for s, _ in answers]) * 1000
    return {
        "requests": len(answers),
        "per_second": len(answers) / seconds if seconds else 0.0,
        "non_200": sum(status != 200 for _, status in answers),
        "p50_ms": float(np.percentile(latencies, 50)) if len(answers) else None,
        "p99_ms": float(np.percentile(latencies, 99)) if len(answers) else None,
        "max_ms": float(latencies.max()) if len(answers) else None,
    }


def timed(call: Callable[[], httpx.Response]) -> tuple[float, float, int]:
    start = time.monotonic()
    status = call().status_code
    return start, time.monotonic(), status


def run(service_root: Path, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``model_dir`` and its copies served by ``service_root``'s server; ``args``: seconds,
    loads, storm."""
    with tempfile.TemporaryDirectory() as tmp:
        repo, copies = repository(model_dir, Path(tmp), max(args.storm, 1))
        settings = {"MODEL_CONTROL": "explicit", "DEFAULT_MODEL": model_dir.name}
        with (
            running_checkout(service_root, repo, **settings) as server,
            httpx.Client(base_url=server.url, timeout=600) as admin,
        ):
            requests = Requests(server.url, model_dir.name)

            def load(name: str) -> httpx.Response:
                return admin.post(f"/v2/repository/models/{name}/load")

            def unload(name: str) -> httpx.Response:
                return admin.post(f"/v2/repository/models/{name}/unload")

            with requests.running():
                time.sleep(1.0)  # the client's connection made, the first requests run
                began = time.monotonic()
                time.sleep(args.seconds)
                baseline = [(began, time.monotonic())]
                loads, statuses = [], []
                for _ in range(args.loads):
                    start, end, status = timed(lambda: load(copies[0]))
                    loads.append((start, end))
                    statuses.append(status)
                    unload(copies[0])
                    time.sleep(0.5)
                storm_end = time.monotonic() + args.seconds
                storm_loads: list[int] = []

                def churn(name: str) -> None:
                    while time.monotonic() < storm_end:
                        storm_loads.append(load(name).status_code)
                        unload(name)

                storm_start = time.monotonic()
                threads = [threading.Thread(target=churn, args=(n,)) for n in copies[: args.storm]]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                storm = [(storm_start, time.monotonic())]
    phases = {
        "baseline": stats(requests.within(baseline), args.seconds),
        "load": stats(requests.within(loads), sum(b - a for a, b in loads)),
        "storm": stats(requests.within(storm), storm[0][1] - storm[0][0]),
    }
    base = phases["baseline"]
    for name in ("load", "storm"):
        phase = phases[name]
        for key in ("p50_ms", "p99_ms"):
            if phase[key] is not None and base[key]:
                phase[key.replace("_ms", "_ratio")] = phase[key] / base[key]
    return {
        "model": model_dir.name,
        "seconds": args.seconds,
        "load_seconds": [b - a for a, b in loads],
        "load_statuses": statuses,
        "storm_threads": args.storm,
        "storm_load_statuses": sorted(set(storm_loads)),
        "storm_loads": len(storm_loads),
        "phases": phases,
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        f"model {results['model']}; loads took "
        + ", ".join(f"{s:.1f}" for s in results["load_seconds"])
        + f" s; storm: {results['storm_loads']} loads by {results['storm_threads']} threads",
        "phase     requests  req/s   p50 ms  p99 ms  max ms  p50 x  p99 x",
    ]
    for name, p in results["phases"].items():
        if not p["requests"]:
            lines.append(f"{name:<9} 0")
            continue
        lines.append(
            f"{name:<9} {p['requests']:>8} {p['per_second']:>6.1f} {p['p50_ms']:>8.1f} "
            f"{p['p99_ms']:>7.1f} {p['max_ms']:>7.1f} {p.get('p50_ratio', 1.0):>6.2f} "
            f"{p.get('p99_ratio', 1.0):>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--seconds", type=float, default=15.0, help="baseline and storm")
    parser.add_argument("--loads", type=int, default=3, help="single loads measured")
    parser.add_argument("--storm", type=int, default=3, help="concurrent loaders")
    parser.add_argument("--out", type=Path, default=OUT / "hardening-load.json")
    args = parser.parse_args(argv)
    results = run(ROOT, args.model_dir, args)
    write_json(args.out, results)
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
