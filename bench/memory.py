"""A served model's memory and disk against its weights (weights stored and held once).

For each model directory: its files on disk against its weights (parameters x 4
bytes, float32), and the server's memory once every graph has been loaded and
run (warm-up, then one request per kind of run: text embeddings, arrays,
hidden states, attention, BM42), for each ``ATTNSERVE_PREPACKED_GRAPHS`` asked.
Memory is read from /proc/PID/smaps_rollup as RSS and PSS: onnxruntime maps
``weights.bin`` once per session, and RSS counts a page once per mapping where
PSS counts it once. The runtime's fixed cost is the same server serving the
tiny preset (2 layers, 32 wide: ~0.1 MB of weights, no tokenizer), measured in
the same run. Targets: a directory at most 1.15x its weights; PSS at most 1.5x
the weights + the fixed cost.

    .venv/bin/python -m bench.memory --model-dir models/minilm-l6 \\
        --prepacked embeddings,attention --prepacked ''

Writes ``bench/out/memory.json`` and prints a report rendered from it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.models import DEFAULT_MODEL_DIR, OUT, TINY_SEED, model_config
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_server

MiB = 2**20
TEXTS = [f"sentence {i} about served encoders and the memory their weights take" for i in range(8)]
DIRECTORY_TARGET, MEMORY_TARGET = 1.15, 1.5


def weight_bytes(model_dir: Path) -> int:
    """float32 bytes of the model's parameters: encoder layers and token embeddings."""
    from model_export.manifest import Manifest

    manifest = Manifest.read(model_dir)
    return 4 * (manifest.architecture.parameters() + manifest.embedding_parameters())


def smaps(pid: int) -> dict[str, int]:
    """RSS and PSS of a process in bytes (smaps_rollup)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) * 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"]}


def exercise(url: str, model: str, d_model: int, has_text: bool, sparse: bool) -> None:
    """One request per kind of run, so every graph has run at a realistic size."""
    arrays = np.random.default_rng(0).standard_normal((3, 16, d_model)).astype(np.float32)
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/encode", {"inputs": arrays.tolist()}),
        ("/v1/encode", {"inputs": arrays.tolist(), "return_hidden_states": True}),
        ("/v1/encode", {"inputs": arrays.tolist(), "return_attention": True}),
    ]
    if has_text:
        bodies.append(("/v1/embeddings", {"model": model, "input": TEXTS}))
        bodies.append(("/v1/encode", {"inputs": TEXTS, "return_attention": True}))
    if sparse:
        bodies.append(("/v1/embed_sparse", {"inputs": TEXTS}))
    with httpx.Client(base_url=url, timeout=120) as client:
        for path, body in bodies:
            client.post(path, json=body).raise_for_status()


def measure(model_dir: Path, **settings: str) -> dict[str, int]:
    config = model_config(model_dir)
    text = config.get("text") or {}
    with running_server(model_dir, **settings) as served:
        exercise(
            served.url,
            config["name"],
            config["architecture"]["d_model"],
            bool(text),
            bool(text.get("sparse_graph")),
        )
        time.sleep(1)  # let freed buffers settle
        return smaps(served.pid)


def fixed_cost() -> dict[str, int]:
    """The server's memory with a model whose weights are negligible."""
    from model_export.config import preset
    from model_export.export import export_model
    from model_export.model import Encoder

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        export_model(
            Encoder(preset("tiny"), seed=TINY_SEED), model_dir, name="tiny", exporter="torchscript"
        )
        return measure(model_dir)


def run(model_dirs: list[Path], prepacked: list[str]) -> dict[str, Any]:
    fixed = fixed_cost()
    models = []
    for model_dir in model_dirs:
        weights = weight_bytes(model_dir)
        files = sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file())
        served = {labels: measure(model_dir, prepacked_graphs=labels) for labels in prepacked}
        models.append(
            {"model": model_dir.name, "weights": weights, "directory": files, "served": served}
        )
    return {"fixed": fixed, "models": models}


def report(result: dict[str, Any]) -> str:
    fixed = result["fixed"]
    lines = [
        f"Fixed cost (the tiny preset served): RSS {fixed['rss'] / MiB:.0f} MiB, "
        f"PSS {fixed['pss'] / MiB:.0f} MiB.",
        "",
    ]
    rows = []
    for model in result["models"]:
        weights = model["weights"]
        for labels, memory in model["served"].items():
            above = memory["pss"] - fixed["pss"]
            rows.append(
                [
                    model["model"],
                    f"{weights / MiB:.0f}",
                    f"{model['directory'] / MiB:.0f} ({model['directory'] / weights:.2f}x)",
                    labels or "(none)",
                    f"{memory['rss'] / MiB:.0f}",
                    f"{memory['pss'] / MiB:.0f}",
                    f"{above / weights:.2f}x",
                ]
            )
    header = [
        "model",
        "weights MiB",
        "directory MiB",
        "prepacked graphs",
        "RSS MiB",
        "PSS MiB",
        "(PSS - fixed) / weights",
    ]
    lines.append(table(header, rows))
    lines.append("")
    lines.append(
        f"Targets: directory <= {DIRECTORY_TARGET}x weights; "
        f"PSS - fixed <= {MEMORY_TARGET}x weights."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, action="append", help="default: models/minilm-l6")
    parser.add_argument(
        "--prepacked",
        action="append",
        help="an ATTNSERVE_PREPACKED_GRAPHS value to measure (repeatable; default: the default)",
    )
    args = parser.parse_args()
    result = run(args.model_dir or [DEFAULT_MODEL_DIR], args.prepacked or ["embeddings,attention"])
    write_json(OUT / "memory.json", result)
    print(report(result))


if __name__ == "__main__":
    main()
