"""Long inputs: time and peak memory per 1k tokens at 512, 2k and 8k tokens.

One real server per row (``python -m service``, ``ATTNSERVE_MAX_SEQ_LEN`` at the length
measured) serves the model; per length, one text of exactly that many tokens is sent
as (a) a pooled embedding (``/v1/embeddings``: the embeddings graph) and (b) an encode
asking for every layer's attention cut to its top 8 keys per row (``/v1/encode``,
``attention.top_k``: the compact-attention graph, the way maps of long inputs are
served: full maps at 8k are L·h·64M floats). Time is the median of ``--repeats``
requests' wall time after an untimed first; peak memory is the server's peak RSS
during them above its RSS once ready (``/proc/PID/status`` VmHWM, reset through
``/proc/PID/clear_refs``): what one such request adds at its peak to a fresh server.
Run on a quiet machine; not a timed test.

    .venv/bin/python -m bench.long_inputs --model-dir DIR   # a model of >= 8192 positions

Writes ``bench/out/long_inputs.json`` and prints a report rendered from it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lib.models import OUT, model_config
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import running_server

MiB = 2**20
LENGTHS = (512, 2048, 8192)
TOP_K = 8


def status_bytes(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory field (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def text_of(tokens: int, tokenizer_file: Path) -> str:
    """A text that tokenizes to exactly ``tokens`` tokens, special tokens included."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    specials = len(tokenizer.encode("").ids)
    text = " ".join(["attention"] * (tokens - specials))
    got = len(tokenizer.encode(text).ids)
    if got != tokens:
        raise SystemExit(f"the probe text gives {got} tokens, not {tokens}")
    return text


def request(kind: str, model: str, text: str) -> tuple[str, dict[str, Any]]:
    if kind == "pooled":
        return "/v1/embeddings", {"model": model, "input": [text]}
    attention = {"top_k": TOP_K}
    body = {"model": model, "inputs": [text], "return_embeddings": False}
    return "/v1/encode", body | {"return_attention": True, "attention": attention}


def measure(model_dir: Path, tokens: int, kind: str, repeats: int) -> dict[str, float]:
    """One fresh server per row: its RSS once ready (warmed up at small shapes), then
    one untimed request and ``repeats`` timed ones; the peak is VmHWM above that RSS."""
    config = model_config(model_dir)
    path, body = request(kind, config["name"], text_of(tokens, model_dir / "tokenizer.json"))
    limits = {
        "max_seq_len": str(tokens),
        "max_tokens": str(tokens),
        "request_timeout": "900",
        "max_inflight_bytes": str(64 * 2**30),  # measured here, not bounded
    }
    with (
        running_server(model_dir, **limits) as served,
        httpx.Client(base_url=served.url, timeout=900) as client,
    ):
        ready = status_bytes(served.pid, "VmRSS")
        Path(f"/proc/{served.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        client.post(path, json=body).raise_for_status()  # first run: arena growth
        seconds = []
        for _ in range(repeats):
            began = time.perf_counter()
            client.post(path, json=body).raise_for_status()
            seconds.append(time.perf_counter() - began)
        peak = status_bytes(served.pid, "VmHWM")
    return {"seconds": statistics.median(seconds), "peak_above": peak - ready, "ready": ready}


def run(
    model_dir: Path, repeats: int, attention_up_to: int, lengths: tuple[int, ...] = LENGTHS
) -> dict[str, Any]:
    config = model_config(model_dir)
    rows = []
    for tokens in lengths:
        kinds = ["pooled"] + ([f"top-{TOP_K} attention"] if tokens <= attention_up_to else [])
        for kind in kinds:
            got = measure(model_dir, tokens, kind, repeats)
            rows.append({"tokens": tokens, "kind": kind, **got})
            print(f"{tokens} tokens, {kind}: {got}", flush=True)
    return {"model": config["name"], "architecture": config["architecture"], "rows": rows}


def report(result: dict[str, Any]) -> str:
    arch = result["architecture"]
    rows = [
        [
            str(row["tokens"]),
            row["kind"],
            f"{row['seconds'] * 1000:.0f}",
            f"{row['seconds'] * 1000 / (row['tokens'] / 1000):.0f}",
            f"{row['peak_above'] / MiB:.0f}",
            f"{row['peak_above'] / MiB / (row['tokens'] / 1000):.0f}",
            f"{row.get('ready', 0) / MiB:.0f}",
        ]
        for row in result["rows"]
    ]
    header = [
        "tokens",
        "request",
        "ms",
        "ms per 1k tokens",
        "peak MiB over ready",
        "per 1k tokens",
        "RSS ready MiB",
    ]
    title = (
        f"{result['model']}: {arch['n_layers']} layers, {arch['d_model']} wide, "
        f"{arch['n_heads']} heads"
    )
    return title + "\n\n" + table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated token counts"
    )
    parser.add_argument(
        "--attention-up-to",
        type=int,
        default=2048,
        help="the longest length whose top-k attention is measured (its peak grows as "
        "layers x heads x tokens^2: 8k on a base model needs more than 24 GiB)",
    )
    args = parser.parse_args()
    lengths = tuple(int(n) for n in args.lengths.split(","))
    result = run(args.model_dir, args.repeats, args.attention_up_to, lengths)
    write_json(OUT / "long_inputs.json", result)
    print(report(result))


if __name__ == "__main__":
    main()
