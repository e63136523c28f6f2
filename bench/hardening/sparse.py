"""Issue 44, item 1: a SPLADE answer against the response limit, the memory budget and
the deadline.

Exports a BERT SPLADE model with a random head (``tests.support.heads.bert_splade``: a
nonzero for nearly every vocabulary word, the hostile case), serves it, and sends
``POST /v1/embed_sparse`` with N one-word texts and ``return_text`` (the issue's
request: 2,048 texts, and 256). Reports, per request, the status, the answer's bytes,
the time to the answer, and the server's peak RSS meanwhile.

    .venv/bin/python -m bench.hardening.sparse [--texts 2048 256] [--timeout 180]

Writes ``bench/out/hardening_sparse.json`` and prints it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.hardening import checkout
from bench.lib.models import OUT, ROOT
from bench.lib.procs import Sampler
from bench.lib.results import write_json
from bench.lib.server import running_checkout

MB = 1e6
TEXTS = [2048, 256, 56]  # the two requests, and the most that fit the default limit
TIMEOUT = 180.0


def export_splade(service_root: Path, work: Path) -> Path:
    """The random-head SPLADE model, exported by ``service_root`` as the tests export it."""
    # The tests' model (run from the checkout); imported by name, so the type check of
    # bench does not take in the tests' untyped helpers.
    bert_splade = importlib.import_module("tests.support.heads").bert_splade

    source = work / "checkpoints" / "bert-splade"
    source.parent.mkdir(parents=True, exist_ok=True)
    bert_splade(source)
    out = work / "models" / "bert-splade"
    return checkout.export(
        service_root, out, "--checkpoint", str(source), "--exporter", "torchscript"
    )


def one_request(url: str, pid: int, texts: int, timeout: float) -> dict[str, Any]:
    """The issue's request with ``texts`` one-word texts: status, bytes, seconds, peak RSS."""
    body = {
        "model": "bert-splade",
        "inputs": [f"word{i}" for i in range(texts)],
        "return_text": True,
    }
    began = time.perf_counter()
    with Sampler(pid) as sampler:
        try:
            answer = httpx.post(f"{url}/v1/embed_sparse", json=body, timeout=timeout)
            status, size = answer.status_code, len(answer.content)
            said = answer.text[:240] if status != 200 else ""
        except httpx.TimeoutException:
            status, size, said = 0, 0, f"no answer within {timeout:.0f} s"
    return {
        "texts": texts,
        "status": status,
        "answer_bytes": size,
        "seconds": round(time.perf_counter() - began, 2),
        "peak_rss_mb": round(sampler.peak / MB, 1),
        "error": said,
    }


def run(service_root: Path, texts: list[int], timeout: float = TIMEOUT) -> dict[str, Any]:
    """Export and serve the model with ``service_root``'s code, send each request."""
    with tempfile.TemporaryDirectory() as tmp:
        model = export_splade(service_root, Path(tmp))
        with running_checkout(service_root, model.parent, DEFAULT_MODEL=model.name) as served:
            results = [one_request(served.url, served.pid, n, timeout) for n in texts]
    return {"requests": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, nargs="+", default=TEXTS)
    parser.add_argument("--timeout", type=float, default=TIMEOUT)
    parser.add_argument("--out", type=Path, default=OUT / "hardening_sparse.json")
    args = parser.parse_args()
    found = run(ROOT, args.texts, args.timeout)
    write_json(args.out, found)
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
