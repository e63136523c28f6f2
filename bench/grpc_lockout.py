"""The gRPC lock-out probe of issue 37: silent calls held open on one connection.

One raw HTTP/2 connection (``tests/service/raw_h2.py``) opens ``--silent``
``ModelInfer`` streams that send their headers and never their message; while
they are held, a health ``Check`` and a normal ``ModelInfer`` (all-MiniLM-L6-v2,
one text) are made ``--probes`` times each on connections of their own. Reports
their status, median and worst latency, what the server did with the silent
streams (taken, refused with RST_STREAM and which code), and the same probes
with no silent calls for comparison. One real server on 127.0.0.1.

    .venv/bin/python -m bench.grpc_lockout --model-dir models/minilm-l6

Writes ``bench/out/grpc_lockout.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from bench.lib.models import DEFAULT_MODEL_DIR, OUT
from bench.lib.report import table
from bench.lib.results import write_json
from bench.lib.server import free_port, running_server
from tests.service.raw_h2 import RawH2  # the tests' raw HTTP/2 client (run from the checkout)

INFER = "/inference.GRPCInferenceService/ModelInfer"
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


def probe(address: str, model: str) -> dict[str, Any]:
    """One health Check and one ModelInfer, each on a fresh connection: status, ms."""
    out: dict[str, Any] = {}
    with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
        start = time.perf_counter()
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            answer = stub.Check(  # type: ignore[attr-defined]  # typeshed's stub lacks it
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
            out["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        except grpc.RpcError as exc:
            out["health"] = exc.code().name
        out["health_ms"] = (time.perf_counter() - start) * 1000
    request = pb.ModelInferRequest(model_name=model)
    text = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"A man is playing a guitar.")
    request.parameters["pooling"].string_param = "mean"
    with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
        start = time.perf_counter()
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
            out["infer"] = "OK"
        except grpc.RpcError as exc:
            out["infer"] = exc.code().name
        out["infer_ms"] = (time.perf_counter() - start) * 1000
    return out


def summary(probes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "health": dict(Counter(p["health"] for p in probes)),
        "infer": dict(Counter(p["infer"] for p in probes)),
        "health_ms_median": statistics.median(p["health_ms"] for p in probes),
        "health_ms_max": max(p["health_ms"] for p in probes),
        "infer_ms_median": statistics.median(p["infer_ms"] for p in probes),
        "infer_ms_max": max(p["infer_ms"] for p in probes),
    }


def render(result: dict[str, Any]) -> str:
    head = (
        f"silent calls: {result['silent_calls_sent']} sent on one connection, "
        f"{result['silent_not_reset']} not reset, "
        f"refused (RST_STREAM code: count) {result['silent_refused_by_rst_stream_code']}, "
        f"connection open: {result['connection_still_open']}"
    )
    rows = []
    for name in ("idle", "while_held"):
        s = result[name]
        rows.append(
            [
                name,
                s["health"],
                f"{s['health_ms_median']:.1f} / {s['health_ms_max']:.1f}",
                s["infer"],
                f"{s['infer_ms_median']:.1f} / {s['infer_ms_max']:.1f}",
            ]
        )
    header = ["", "health", "health ms (median / max)", "infer", "infer ms (median / max)"]
    return head + "\n" + table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--silent", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT / "grpc_lockout.json")
    args = parser.parse_args(argv)
    grpc_port = free_port()
    with running_server(args.model_dir, GRPC_PORT=str(grpc_port), BODY_TIMEOUT="30"):
        address = f"127.0.0.1:{grpc_port}"
        model = args.model_dir.name
        idle = summary([probe(address, model) for _ in range(args.probes)])
        silent = RawH2("127.0.0.1", grpc_port)
        try:
            for _ in range(args.silent):
                silent.open(INFER)
            time.sleep(0.5)  # the server has seen them
            held = summary([probe(address, model) for _ in range(args.probes)])
            refused = dict(Counter(silent.resets.values()))
            result = {
                "silent_calls_sent": args.silent,
                "silent_refused_by_rst_stream_code": refused,
                "silent_not_reset": args.silent - sum(refused.values()),
                "connection_still_open": not silent.closed.is_set(),
                "idle": idle,
                "while_held": held,
            }
        finally:
            silent.close()
    write_json(args.out, result)
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
