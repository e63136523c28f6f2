"""Our service: JSON floats, base64, binary /v2 and gRPC on every workload it can take."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.lib.server import free_port, running_server
from bench.peers.common import THREADS, Bench, Server
from bench.peers.wire import (
    GRPC_WORKLOADS,
    Call,
    grpc_call,
    native_call,
    native_text_call,
    openai_call,
    v2_call,
    v2_text_call,
)
from bench.peers.workloads import Workload, text_batches


@contextmanager
def ours(bench: Bench, scratch: Path) -> Iterator[Server]:
    """Our service serving the model alone (RSS is one model's), with gRPC on."""
    repo = scratch / "repo"
    repo.mkdir(exist_ok=True)
    link = repo / bench.model_dir.name
    if not link.exists():
        link.symlink_to(bench.model_dir)  # only this model: RSS is one model's
    grpc_port = free_port()
    settings = {
        "FOLLOW_SYMLINKS": "true",  # the link above leaves the repository: ours to allow
        "INTRA_OP_THREADS": str(THREADS),
        "LOG_LEVEL": "warning",
        "GRPC_PORT": str(grpc_port),
    }

    def calls(w: Workload) -> dict[str, list[Call]]:
        if w.text:
            if not bench.text:
                return {}
            texts = text_batches(bench.inputs, w)
            if w.key != "T1":  # one query text per request: the OpenAI route and ours
                return {
                    "ours OpenAI JSON floats": [
                        openai_call("/v1/embeddings", bench.results.name, t, "float") for t in texts
                    ],
                    "ours JSON floats": [native_text_call(t, "float") for t in texts],
                }
            return {
                "ours OpenAI JSON floats": [
                    openai_call("/v1/embeddings", bench.results.name, t, "float") for t in texts
                ],
                "ours OpenAI base64": [
                    openai_call("/v1/embeddings", bench.results.name, t, "base64") for t in texts
                ],
                "ours /v2 binary": [v2_text_call(bench.results.name, t) for t in texts],
            }
        seqs = bench.inputs.seqs[w.key]
        variants = {
            "ours JSON floats": [native_call(seqs, "float", w.attention)],
            "ours base64": [native_call(seqs, "base64", w.attention)],
            "ours /v2 binary": [v2_call(bench.results.name, seqs, w.attention)],
        }
        if w.attention:  # ~25 MB of JSON numbers per answer: not a way anyone uses it
            del variants["ours JSON floats"]
        if w.key in GRPC_WORKLOADS:
            variants["ours gRPC"] = [grpc_call(bench.results.name, seqs, w.attention)]
        return variants

    with running_server(link, **settings) as served:
        yield Server("ours", served.pid, served.port, calls, grpc_port)
