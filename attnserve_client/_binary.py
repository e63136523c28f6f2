"""The binary transport: ``encode`` over the Open Inference Protocol's binary tensors.

Arrays travel as raw little-endian float32 after a small JSON header (no base64,
no JSON floats): the server's ``/v2/models/{model}/infer`` with the
``binary_tensor_data`` extension. Only requests the protocol can say are sent
this way: array inputs (no texts: their tokens come back only over JSON), every
attention map (no layer/head selection or reduction) and every hidden state;
everything else goes as JSON. Sans-IO: the clients send what this builds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from attnserve_client._exceptions import APIResponseError, status_error
from attnserve_client._types import EncodeResult, Usage

EXTENSION = "binary_tensor_data"
HEADER_LENGTH = "Inference-Header-Content-Length"
EMBEDS, MASK = "inputs_embeds", "attention_mask"
HIDDEN, ATTENTIONS, STATES, POOLED = "last_hidden_state", "attentions", "hidden_states", "pooled"
DTYPES: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8")}


@dataclass(frozen=True)
class Plan:
    """One encode request over the binary transport: what to send, how to read it."""

    body: bytes
    headers: dict[str, str]
    lengths: list[int]
    embeddings: bool

    def path(self, model: str) -> str:
        return f"/v2/models/{quote(model, safe='')}/infer"

    def result(self, response: httpx.Response) -> EncodeResult:
        name, outputs = infer_result(response)
        return encode_result(name, outputs, self.lengths, embeddings=self.embeddings)


def plan(inputs: list[Any], options: dict[str, Any]) -> Plan | None:
    """The binary form of an encode call, or None when only JSON can say it."""
    arrays = eligible(inputs, options)
    if arrays is None:
        return None
    pooling = options.get("pooling")
    embeddings = options.get("return_embeddings")
    if embeddings is None:
        embeddings = pooling in (None, "none")
    body, headers = infer_request(
        arrays,
        embeddings=embeddings,
        attention=bool(options.get("return_attention")),
        hidden_states=bool(options.get("return_hidden_states")),
        pooling=pooling,
        normalize=bool(options.get("normalize")),
    )
    return Plan(body, headers, [len(a) for a in arrays], embeddings)


def eligible(arrays: list[Any], options: dict[str, Any]) -> list[np.ndarray] | None:
    """The inputs as float32 arrays when the request can go binary, else None."""
    if any(isinstance(a, str) for a in arrays) or options.get("spans") is not None:
        return None
    if options.get("normalize") and options.get("pooling") in (None, "none"):
        return None  # JSON's 422 says what is wrong
    keys = ("layers", "heads", "hidden_layers", "attention_options")
    if any(options.get(k) is not None for k in keys):
        return None
    if options.get("reduce") not in (None, "none") or options.get("truncate"):
        return None
    out = [np.asarray(a, dtype=np.float32) for a in arrays]
    if not out or any(a.ndim != 2 or len(a) == 0 for a in out):
        return None  # let the server's JSON path explain what is wrong
    if len({a.shape[1] for a in out}) != 1:
        return None
    return out


def infer_request(
    arrays: list[np.ndarray],
    *,
    embeddings: bool,
    attention: bool,
    hidden_states: bool,
    pooling: str | None,
    normalize: bool,
) -> tuple[bytes, dict[str, str]]:
    """A right-padded [batch, seq, d] batch and its mask as binary inputs; binary outputs."""
    lengths = [len(a) for a in arrays]
    longest, width = max(lengths), arrays[0].shape[1]
    embeds = np.zeros((len(arrays), longest, width), dtype="<f4")  # (B, T, d)
    mask = np.zeros((len(arrays), longest), dtype="<i8")  # (B, T)
    for row, array in enumerate(arrays):
        embeds[row, : len(array)] = array
        mask[row, : len(array)] = 1
    outputs = [HIDDEN] if embeddings else []
    outputs += [ATTENTIONS] if attention else []
    outputs += [STATES] if hidden_states else []
    outputs += [POOLED] if pooling not in (None, "none") else []
    if not outputs:
        outputs = [HIDDEN]  # the protocol answers something; dropped again below
    parameters: dict[str, Any] = {}
    if pooling not in (None, "none"):
        parameters = {"pooling": pooling, "normalize": normalize}
    header = {
        "inputs": [
            {"name": EMBEDS, "shape": list(embeds.shape), "datatype": "FP32",
             "parameters": {"binary_data_size": embeds.nbytes}},
            {"name": MASK, "shape": list(mask.shape), "datatype": "INT64",
             "parameters": {"binary_data_size": mask.nbytes}},
        ],
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs],
        "parameters": parameters,
    }  # fmt: skip
    head = json.dumps(header).encode()
    return b"".join([head, embeds.tobytes(), mask.tobytes()]), {HEADER_LENGTH: str(len(head))}


def infer_result(response: httpx.Response) -> tuple[str, dict[str, np.ndarray]]:
    """(model, outputs by name) of an infer answer; typed errors as for every request."""
    if not response.is_success:
        raise status_error(response)
    try:
        content = response.content
        size = int(response.headers.get(HEADER_LENGTH, len(content)))
        header = json.loads(content[:size])
        offset, outputs = size, {}
        for out in header["outputs"]:
            dtype, shape = DTYPES[out["datatype"]], [int(d) for d in out["shape"]]
            nbytes = out["parameters"]["binary_data_size"]
            if nbytes != math.prod(shape) * dtype.itemsize or offset + nbytes > len(content):
                raise ValueError(f"output {out['name']!r}: {nbytes} bytes for shape {shape}")
            outputs[out["name"]] = np.frombuffer(content, dtype, math.prod(shape), offset).reshape(
                shape
            )
            offset += nbytes
        return str(header["model_name"]), outputs
    except (ValueError, KeyError, TypeError) as exc:
        raise APIResponseError(f"unreadable binary answer: {exc!r}") from exc


def encode_result(
    model: str,
    outputs: dict[str, np.ndarray],
    lengths: list[int],
    *,
    embeddings: bool,
) -> EncodeResult:
    """The same EncodeResult the JSON path gives: each sequence trimmed to its length."""

    def per_sequence(name: str, cut: Any) -> list[np.ndarray] | None:
        if name not in outputs:
            return None
        return [np.array(cut(outputs[name][row], n), np.float32) for row, n in enumerate(lengths)]

    return EncodeResult(
        model=model,
        embeddings=per_sequence(HIDDEN, lambda a, n: a[:n]) if embeddings else None,
        attention=per_sequence(ATTENTIONS, lambda a, n: a[:, :, :n, :n]),
        hidden_states=per_sequence(STATES, lambda a, n: a[:, :n]),
        pooled=per_sequence(POOLED, lambda a, n: a),
        tokens=[None] * len(lengths),
        usage=Usage(len(lengths), sum(lengths)),
    )
