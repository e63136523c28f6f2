"""The wire: each protocol's requests, built once and sent many times, and its answers
decoded into the reference's layout (real tokens only)."""

from __future__ import annotations

import base64
import json
import struct
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.lib.http import Request
from bench.lib.load import GRPC_OPTIONS
from bench.lib.workloads import encode_body
from bench.peers.workloads import Inputs, Workload, padded


@dataclass(frozen=True)
class Call:
    """One request, ready to send many times, and how to decode its answer: HTTP, or
    with ``grpc`` a serialised ModelInferRequest for ``path`` (the gRPC method)."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    grpc: bool = False

    @property
    def request(self) -> Request:
        """The HTTP request the load client sends."""
        return Request(self.path, self.body, self.headers)


def native_call(seqs: list[np.ndarray], encoding: str, attention: bool) -> Call:
    """Our /v1/encode: one item per sequence (ragged lengths need no padding)."""
    return Call("/v1/encode", encode_body(seqs, encoding, "none" if attention else None))


def v2_call(model: str, seqs: list[np.ndarray], attention: bool) -> Call:
    """Open Inference Protocol with the binary tensor extension (ours and Triton's)."""
    embeds, mask = padded(seqs)
    blobs = [embeds.astype("<f4").tobytes(), mask.astype("<i8").tobytes()]
    outputs = ["last_hidden_state", *(["attentions"] if attention else [])]
    header = {
        "inputs": [
            {
                "name": "inputs_embeds",
                "datatype": "FP32",
                "shape": list(embeds.shape),
                "parameters": {"binary_data_size": len(blobs[0])},
            },
            {
                "name": "attention_mask",
                "datatype": "INT64",
                "shape": list(mask.shape),
                "parameters": {"binary_data_size": len(blobs[1])},
            },
        ],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }
    raw = json.dumps(header).encode()
    return Call(
        f"/v2/models/{model}/infer",
        raw + b"".join(blobs),
        (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(raw))),
        ),
    )


GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


GRPC_WORKLOADS = ("W1", "W2", "W4")  # gRPC contenders take these (issue 24)


def grpc_call(model: str, seqs: list[np.ndarray], attention: bool) -> Call:
    """The Open Inference Protocol over gRPC: a ModelInferRequest with raw tensors, as
    tritonclient.grpc builds it, serialised once (ours and Triton's)."""
    from tritonclient.grpc import service_pb2 as pb

    embeds, mask = padded(seqs)
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="inputs_embeds", datatype="FP32", shape=list(embeds.shape))
    request.inputs.add(name="attention_mask", datatype="INT64", shape=list(mask.shape))
    request.raw_input_contents.extend(
        [embeds.astype("<f4").tobytes(), mask.astype("<i8").tobytes()]
    )
    for name in ["last_hidden_state", *(["attentions"] if attention else [])]:
        request.outputs.add(name=name)
    return Call(GRPC_INFER, request.SerializeToString(), headers=(), grpc=True)


def decode_grpc(body: bytes) -> dict[str, np.ndarray]:
    """A serialised ModelInferResponse's raw outputs by name."""
    from tritonclient.grpc import service_pb2 as pb

    answer = pb.ModelInferResponse.FromString(body)
    out = {}
    for entry, raw in zip(answer.outputs, answer.raw_output_contents, strict=True):
        dtype = "<i8" if entry.datatype == "INT64" else "<f4"
        out[entry.name] = np.frombuffer(raw, dtype=dtype).reshape(list(entry.shape))
    return out


def v2_text_call(model: str, texts: list[str]) -> Call:
    """Our /v2 infer on BYTES text, answering the pooled, normalised vectors as raw bytes."""
    raw_texts = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    header = {
        "inputs": [
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [len(texts)],
                "parameters": {"binary_data_size": len(raw_texts)},
            }
        ],
        "outputs": [{"name": "pooled", "parameters": {"binary_data": True}}],
        "parameters": {"pooling": "mean", "normalize": True},
    }
    raw = json.dumps(header).encode()
    return Call(
        f"/v2/models/{model}/infer",
        raw + raw_texts,
        (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(raw))),
        ),
    )


def native_text_call(texts: list[str], encoding: str) -> Call:
    """Our /v1/encode on texts, answering each text's mean-pooled, normalised vector."""
    body = {"inputs": texts, "pooling": "mean", "normalize": True, "encoding_format": encoding}
    return Call("/v1/encode", json.dumps(body).encode())


def openai_call(path: str, model: str, texts: list[str], encoding: str) -> Call:
    body = {"model": model, "input": texts, "encoding_format": encoding}
    return Call(path, json.dumps(body).encode())


def decode_array(value: Any, shape: list[int] | None = None) -> np.ndarray:
    if isinstance(value, dict):  # our Base64Array
        raw = np.frombuffer(base64.b64decode(value["data"]), dtype="<f4")
        return raw.reshape(value["shape"])
    if isinstance(value, str):  # OpenAI's base64 vector
        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    array = np.asarray(value, dtype=np.float32)
    return array.reshape(shape) if shape is not None else array


def decode_native(body: bytes) -> dict[str, list[np.ndarray]]:
    data = json.loads(body)["data"]
    out = {"hidden": [decode_array(item["embeddings"]) for item in data]}
    if data[0].get("attention") is not None:
        out["attention"] = [decode_array(item["attention"]) for item in data]
    return out


def decode_v2(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    size = header_length if header_length is not None else len(body)
    header = json.loads(body[:size])
    offset, out = size, {}
    for entry in header["outputs"]:
        if "data" in entry:
            out[entry["name"]] = np.asarray(entry["data"], dtype=np.float32).reshape(entry["shape"])
            continue
        n = entry["parameters"]["binary_data_size"]
        dtype = "<i8" if entry["datatype"] == "INT64" else "<f4"
        raw = np.frombuffer(body[offset : offset + n], dtype=dtype)
        out[entry["name"]] = raw.reshape(entry["shape"])
        offset += n
    return out


def decode_openai(body: bytes) -> np.ndarray:
    return np.stack([decode_array(item["embedding"]) for item in json.loads(body)["data"]])


def send_once(port: int, call: Call, timeout: float = 120) -> tuple[bytes, dict[str, str]]:
    """One blocking request (for the numerical check; not timed)."""
    if call.grpc:
        import grpc

        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            method: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(call.path)
            return method(call.body, timeout=timeout), {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{call.path}", data=call.body, headers=dict(call.headers)
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read(), {k.lower(): v for k, v in response.headers.items()}


def decode_answer(
    body: bytes, headers: dict[str, str], call: Call, w: Workload, inputs: Inputs
) -> dict[str, list[np.ndarray]]:
    """Decode one answer of any protocol into the reference's layout (real tokens only)."""
    if call.path.startswith("/v2/") or call.grpc:
        length = headers.get("inference-header-content-length")
        out = decode_grpc(body) if call.grpc else decode_v2(body, int(length) if length else None)
        if w.text:
            return {"pooled": list(out["pooled"])}
        lengths = [len(s) for s in inputs.seqs[w.key]]
        got = {"hidden": [out["last_hidden_state"][i, :n] for i, n in enumerate(lengths)]}
        if w.attention:
            got["attention"] = [out["attentions"][i, :, :, :n, :n] for i, n in enumerate(lengths)]
        return got
    if w.text:
        if call.path == "/v1/encode":
            return {"pooled": [decode_array(item["pooled"]) for item in json.loads(body)["data"]]}
        return {"pooled": list(decode_openai(body))}
    return decode_native(body)
