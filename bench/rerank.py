"""Rerank throughput: served ``/v1/rerank`` pairs per second against in-process onnxruntime.

The model is a MiniLM-sized cross-encoder: all-MiniLM-L6-v2's encoder with a random
one-logit head (``BertForSequenceClassification`` from its folder; realistic size,
not real relevance), exported by the CLI. Each request reranks ``--documents``
passages (40–60 words) against one query, ``--concurrency`` requests in flight.
The baseline is the same ``scores_model.onnx`` in this process on the same pairs,
tokenized beforehand, at its best of 1 run × 2 intra-op threads and 2 runs × 1
thread, each with one padded batch of every pair or length-sorted batches of 8,
in the same rounds, interleaved.

    .venv/bin/python -m bench.rerank --rounds 3

Prints pairs/s of each and the ratio served ÷ in-process (median of rounds).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from bench.lib.server import running_server
from model_export import graph_io
from model_export.quantize_sentences import sentences

QUERY = "How do the city council and local farmers plan for the river's floods?"


def passages(count: int) -> list[str]:
    """Passages of 3 sentences each (40–60 words), seeded."""
    drawn = sentences(3 * count, seed=11)
    return [" ".join(drawn[3 * i : 3 * i + 3]) for i in range(count)]


def build_model(root: Path) -> Path:
    """A MiniLM-sized cross-encoder exported into ``root / models``."""
    import torch
    from transformers import BertForSequenceClassification

    from model_export.cli import main
    from model_export.hf_import import minilm_l6_dir

    source = minilm_l6_dir()
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(str(source), num_labels=1)
    checkpoint = root / "checkpoint"
    model.save_pretrained(checkpoint)
    shutil.copyfile(source / "tokenizer.json", checkpoint / "tokenizer.json")
    out = root / "models" / "minilm-reranker"
    assert main(["--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    return out


def _batches(encoded: list[Encoding], size: int) -> list[dict[str, np.ndarray]]:
    """The pairs sorted by length, in batches of ``size``, each padded to its longest."""
    ordered = sorted(encoded, key=lambda e: len(e.ids))
    feeds = []
    for start in range(0, len(ordered), size):
        part = ordered[start : start + size]
        longest = max(len(e.ids) for e in part)
        ids = np.zeros((len(part), longest), dtype=np.int64)
        types, mask = np.zeros_like(ids), np.zeros_like(ids)
        for row, e in enumerate(part):
            n = len(e.ids)
            ids[row, :n], types[row, :n], mask[row, :n] = e.ids, e.type_ids, 1
        feeds.append({"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
    return feeds


def in_process(model_dir: Path, docs: list[str], seconds: float) -> tuple[float, str]:
    """Best pairs/s of the scores graph here over 1 run x 2 threads or 2 runs x 1 thread,
    and one padded batch of every pair or length-sorted batches of 8 (as a server
    groups by length)."""
    tokenizer = Tokenizer.from_file(str(model_dir / graph_io.TOKENIZER_FILE))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=256, strategy="only_second")
    encoded = tokenizer.encode_batch([(QUERY, d) for d in docs])
    best, setting = 0.0, ""
    for size in (len(docs), 8):
        batches = _batches(encoded, size)
        for threads, runs in ((2, 1), (1, 2)):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(str(model_dir / graph_io.GRAPH_SCORES), options)
            for feeds in batches:
                session.run(None, feeds)

            def all_batches(
                session: ort.InferenceSession = session,
                batches: list[dict[str, np.ndarray]] = batches,
            ) -> None:
                for feeds in batches:
                    session.run(None, feeds)

            done, start = 0, time.perf_counter()
            with ThreadPoolExecutor(runs) as pool:
                while time.perf_counter() - start < seconds:
                    list(pool.map(lambda _: all_batches(), range(runs)))
                    done += runs * len(docs)
            rate = done / (time.perf_counter() - start)
            if rate > best:
                best, setting = rate, f"{runs} run(s) x {threads} thread(s), batches of {size}"
    return best, setting


def served(url: str, docs: list[str], concurrency: int, seconds: float) -> float:
    body = {"query": QUERY, "documents": docs}
    with httpx.Client(timeout=60) as client:
        client.post(f"{url}/v1/rerank", json=body).raise_for_status()

        def loop(_: int) -> int:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                client.post(f"{url}/v1/rerank", json=body).raise_for_status()
                done += len(docs)
            return done

        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            total = sum(pool.map(loop, range(concurrency)))
        return total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    docs = passages(args.documents)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp))
        ratios, served_rates, local_rates, settings = [], [], [], []
        with running_server(model_dir, intra_op_threads="2") as server:
            url = server.url
            for _ in range(args.rounds):
                local, setting = in_process(model_dir, docs, args.seconds)
                remote = served(url, docs, args.concurrency, args.seconds)
                ratios.append(remote / local)
                served_rates.append(remote)
                local_rates.append(local)
                settings.append(setting)
    print(f"pairs/s served: {statistics.median(served_rates):.0f}")
    print(f"pairs/s in-process: {statistics.median(local_rates):.0f} (best: {settings})")
    print(
        f"served / in-process: {statistics.median(ratios):.2f} "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})"
    )


if __name__ == "__main__":
    main()
