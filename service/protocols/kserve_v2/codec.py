"""Open Inference Protocol bodies <-> the engine's types, with the binary tensor extension.

Request framing: a JSON header, then (binary extension) the raw little-endian
bytes of every input that declares ``parameters.binary_data_size``, in input
order; the header's length is the ``Inference-Header-Content-Length`` header
(absent: the whole body is JSON). Content-Type is never consulted: tritonclient's
sync client sends none, its async one ``application/octet-stream`` even for JSON.

Inputs: ``inputs_embeds`` FP32 [batch, seq, d_model] with an optional
``attention_mask`` (INT64, INT32 or BOOL [batch, seq], ones then zeros per row;
all ones when absent), or ``text`` BYTES [batch] for models with a tokenizer.
The engine un-pads the rows (so they batch with other requests by length) and
this codec re-pads the answer to the request's seq (to the longest text for
text input) with zeros.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi.responses import Response

from model_export.manifest import graph_io
from service.engine import (
    ArrayInput,
    AttentionSpec,
    EncodeRequest,
    EncodeResult,
    InputItem,
    WireCost,
)
from service.engine.padding import lengths_of, repad
from service.errors import InvalidInput, quoted
from service.protocols import wire
from service.runtime import ModelInfo

HEADER_LENGTH = "inference-header-content-length"
INPUT_TEXT = "text"
OUTPUT_POOLED = "pooled"
OUTPUT_MASK = graph_io.INPUT_MASK  # the mask the answer is padded by (for text input)
NUMERIC = {"FP32": "<f4", "INT64": "<i8", "INT32": "<i4", "BOOL": "|b1"}
MASK_TYPES = ("INT64", "INT32", "BOOL")
POOLINGS = ("mean", "cls", "max")
# Upper bounds of an answer: raw float32 bytes, or flat JSON data lists; each output's
# header entry; the envelope once.
COST = {
    True: WireCost(per_float=4.0, per_array=0.0, per_sequence=0.0, fixed=1024.0),
    False: WireCost(per_float=17.0, per_sequence=20.0 * 8, fixed=1024.0),
}


@dataclass(frozen=True)
class Reply:
    """What the answer needs from the request: names, framing and padding."""

    model: str
    version: str
    request_id: str | None
    outputs: dict[str, bool]  # requested output -> as raw bytes
    lengths: list[int] | None  # real lengths of embeds rows (None for text: from the result)
    pad_to: int  # the request's seq (0 for text: the longest)


def available_outputs(info: ModelInfo) -> list[tuple[str, str, list[int]]]:
    """(name, datatype, shape) of every output this model can answer; -1: dynamic."""
    cfg = info.config
    outputs = [
        (graph_io.OUTPUT_HIDDEN, "FP32", [-1, -1, cfg.d_model]),
        (graph_io.OUTPUT_ATTENTIONS, "FP32", [-1, cfg.n_layers, cfg.n_heads, -1, -1]),
    ]
    if info.manifest.has_hidden_states:
        outputs.append(
            (graph_io.OUTPUT_HIDDEN_STATES, "FP32", [-1, cfg.n_layers + 1, -1, cfg.d_model])
        )
    outputs += [(OUTPUT_POOLED, "FP32", [-1, cfg.d_model]), (OUTPUT_MASK, "INT64", [-1, -1])]
    return outputs


def model_inputs(info: ModelInfo) -> list[tuple[str, str, list[int]]]:
    inputs = [
        (graph_io.INPUT_EMBEDS, "FP32", [-1, -1, info.config.d_model]),
        (graph_io.INPUT_MASK, "INT64", [-1, -1]),
    ]
    if info.has_tokenizer:
        inputs.append((INPUT_TEXT, "BYTES", [-1]))
    return inputs


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """The JSON header and the binary section that follows it."""
    if header_length is None:
        return wire.parse_json_object(body), memoryview(b"")
    if not header_length.strip().isdigit():
        raise InvalidInput(
            f"Inference-Header-Content-Length {quoted(header_length)} is not a number"
        )
    size = int(header_length)
    if size > len(body):
        raise InvalidInput(
            f"Inference-Header-Content-Length {size:,} is beyond the body's {len(body):,} bytes"
        )
    return wire.parse_json_object(body[:size]), memoryview(body)[size:]


def infer_request(
    body: bytes, header_length: str | None, info: ModelInfo, version: str
) -> tuple[EncodeRequest, Reply]:
    """An infer body -> (EncodeRequest, what the answer needs)."""
    header, binary = split_body(body, header_length)
    params = _dict(header.get("parameters"), "parameters")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    allowed = {name: dtype for name, dtype, _ in model_inputs(info)}
    tensors: dict[str, np.ndarray | list[bytes]] = {}
    offset = 0
    for spec in raw_inputs:
        name, tensor, offset = _input_tensor(_dict(spec, "inputs[]"), binary, offset, allowed)
        if name in tensors:
            raise InvalidInput(f"input {quoted(name)} is given twice")
        tensors[name] = tensor
    if offset != len(binary):
        raise InvalidInput(
            f"{len(binary) - offset:,} trailing bytes after the binary inputs (the inputs' "
            "binary_data_size sum to less than the body holds)"
        )
    outputs = _requested_outputs(header.get("outputs"), params, info)
    pooling = params.get("pooling", "none")
    if pooling != "none" and pooling not in POOLINGS:
        raise InvalidInput(f"parameters.pooling must be one of {POOLINGS}, got {quoted(pooling)}")
    if OUTPUT_POOLED in outputs and pooling == "none":
        raise InvalidInput("output 'pooled' needs parameters.pooling (mean, cls or max)")
    if INPUT_TEXT in tensors:
        if len(tensors) > 1:
            raise InvalidInput("send either 'text' or 'inputs_embeds' (with attention_mask)")
        inputs: Sequence[InputItem] = _texts(tensors[INPUT_TEXT])
        lengths, pad_to = None, 0
    else:
        embeds = tensors.get(graph_io.INPUT_EMBEDS)
        if not isinstance(embeds, np.ndarray):
            raise InvalidInput(f"input {graph_io.INPUT_EMBEDS!r} (or 'text') is required")
        if embeds.ndim != 3:
            raise InvalidInput(
                f"input {graph_io.INPUT_EMBEDS!r} must be [batch, seq, d_model], got shape "
                f"{list(embeds.shape)}"
            )
        mask = tensors.get(graph_io.INPUT_MASK)
        if mask is None:
            mask = np.ones(embeds.shape[:2], dtype=np.int64)
        assert isinstance(mask, np.ndarray)
        if mask.shape != embeds.shape[:2]:
            raise InvalidInput(
                f"input {graph_io.INPUT_MASK!r} has shape {list(mask.shape)}; "
                f"{graph_io.INPUT_EMBEDS!r} needs {list(embeds.shape[:2])}"
            )
        lengths, pad_to = lengths_of(mask), int(embeds.shape[1])
        inputs = wire.LazyItems(
            lengths, lambda i, n: ArrayInput(rows=n, decode=lambda: embeds[i, :n])
        )
    binary_answer = all(outputs.values())
    request = EncodeRequest(
        inputs=inputs,
        wire_cost=COST[binary_answer],
        model=info.name,
        return_attention=graph_io.OUTPUT_ATTENTIONS in outputs,
        attention=AttentionSpec(),
        return_hidden_states=graph_io.OUTPUT_HIDDEN_STATES in outputs,
        pooling=pooling,
        normalize=_bool(params.get("normalize", False), "parameters.normalize"),
        return_embeddings=graph_io.OUTPUT_HIDDEN in outputs,
        truncate=_bool(params.get("truncate", False), "parameters.truncate"),
        pad_to=pad_to,
    )
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return request, Reply(info.name, version, request_id, outputs, lengths, pad_to)


def _dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{where} must be true or false")
    return value


def _shape(spec: dict[str, Any], name: str) -> list[int]:
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidInput(f"input {quoted(name)}: 'shape' must be a list of non-negative integers")
    return shape


def _input_tensor(
    spec: dict[str, Any], binary: memoryview, offset: int, allowed: dict[str, str]
) -> tuple[str, np.ndarray | list[bytes], int]:
    """One input -> (name, its tensor, the binary offset after it)."""
    name = spec.get("name")
    if not isinstance(name, str) or name not in allowed:
        raise InvalidInput(f"unknown input {quoted(name)}: this model takes {sorted(allowed)}")
    datatype = spec.get("datatype")
    wanted = MASK_TYPES if name == graph_io.INPUT_MASK else (allowed[name],)
    if not isinstance(datatype, str) or datatype not in wanted:
        raise InvalidInput(
            f"input {quoted(name)} must have datatype {' or '.join(wanted)}, got {quoted(datatype)}"
        )
    shape = _shape(spec, name)
    count = math.prod(shape)
    params = _dict(spec.get("parameters"), f"input {quoted(name)} parameters")
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidInput(
                f"input {quoted(name)}: binary_data_size must be a non-negative integer"
            )
        if offset + size > len(binary):
            raise InvalidInput(
                f"input {quoted(name)}: binary_data_size {size:,} goes beyond the body "
                f"({len(binary) - offset:,} bytes remain after the header)"
            )
        raw = binary[offset : offset + size]
        if datatype == "BYTES":
            return name, _bytes_elements(raw, count, name), offset + size
        dtype = np.dtype(NUMERIC[datatype])
        if size != count * dtype.itemsize:
            raise InvalidInput(
                f"input {quoted(name)}: binary_data_size {size:,} does not match shape {shape} of "
                f"{datatype} ({count * dtype.itemsize:,} bytes)"
            )
        return name, np.frombuffer(raw, dtype=dtype).reshape(shape), offset + size
    if "data" not in spec:
        raise InvalidInput(f"input {quoted(name)} has neither 'data' nor binary_data_size")
    data = spec["data"]
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != count or not all(isinstance(x, str) for x in flat):
            raise InvalidInput(
                f"input {quoted(name)}: 'data' must hold {count} strings for shape {shape}"
            )
        return name, [x.encode() for x in flat], offset
    if datatype == "BOOL":
        try:
            array = np.asarray(data)
        except (ValueError, TypeError):
            array = np.asarray([object()])
    else:
        parsed = wire.numbers(data)
        array = np.asarray([object()]) if parsed is None else parsed
    kinds = "b" if datatype == "BOOL" else "iu" if datatype.startswith("INT") else "fiu"
    if array.dtype.kind not in kinds or array.size != count:
        raise InvalidInput(
            f"input {quoted(name)}: 'data' must be {count} {datatype} values (flat or nested, "
            f"row-major) for shape {shape}"
        )
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused as such
        return name, array.astype(NUMERIC[datatype]).reshape(shape), offset


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    return [x for item in data for x in _flatten(item)]


def _bytes_elements(raw: memoryview, count: int, name: str) -> list[bytes]:
    """Triton's BYTES serialisation: each element a 4-byte little-endian length, then bytes."""
    elements, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidInput(f"input {quoted(name)}: a BYTES element's length is cut short")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise InvalidInput(f"input {quoted(name)}: a BYTES element runs past binary_data_size")
        elements.append(bytes(raw[offset : offset + size]))
        offset += size
    if len(elements) != count:
        raise InvalidInput(
            f"input {quoted(name)}: {len(elements)} BYTES elements for {count} in its shape"
        )
    return elements


def _texts(tensor: np.ndarray | list[bytes]) -> list[str]:
    assert isinstance(tensor, list)
    try:
        return [t.decode("utf-8") for t in tensor]
    except UnicodeDecodeError:
        raise InvalidInput("input 'text': elements must be UTF-8") from None


def _requested_outputs(raw: Any, params: dict[str, Any], info: ModelInfo) -> dict[str, bool]:
    """Output name -> binary, in the order asked (every output when none is named)."""
    known = [name for name, _, _ in available_outputs(info)]
    binary_all = _bool(params.get("binary_data_output", False), "parameters.binary_data_output")
    if raw is None:
        names = [n for n in known if n != OUTPUT_POOLED or params.get("pooling", "none") != "none"]
        return dict.fromkeys(names, binary_all)
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("'outputs' must be a non-empty list (or absent, for every output)")
    outputs: dict[str, bool] = {}
    for spec in raw:
        spec = _dict(spec, "outputs[]")
        name = spec.get("name")
        if name not in known:
            raise InvalidInput(f"unknown output {quoted(name)}: this model answers {known}")
        if name in outputs:
            raise InvalidInput(f"output {quoted(name)} is asked for twice")
        out_params = _dict(spec.get("parameters"), f"output {quoted(name)} parameters")
        outputs[name] = _bool(
            out_params.get("binary_data", binary_all), f"output {quoted(name)} binary_data"
        )
    return outputs


def infer_response(result: EncodeResult, reply: Reply) -> Response:
    """The answer: JSON header, then the raw bytes of the binary outputs, in order."""
    lengths = reply.lengths if reply.lengths is not None else [o.length for o in result.outputs]
    length = max(reply.pad_to, *lengths)
    entries, blobs = [], []
    for name, binary in reply.outputs.items():
        array = _output(result, name, lengths, length)
        entry: dict[str, Any] = {
            "name": name,
            "datatype": "INT64" if name == OUTPUT_MASK else "FP32",
            "shape": list(array.shape),
        }
        if binary:
            raw = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array.ravel()
        entries.append(entry)
    header: dict[str, Any] = {"model_name": reply.model, "model_version": reply.version}
    if reply.request_id is not None:
        header["id"] = reply.request_id
    header["outputs"] = entries
    content = wire.dumps(header)
    if not blobs:
        return Response(content, media_type="application/json")
    return Response(
        b"".join([content, *blobs]),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(content))},
    )


def _output(result: EncodeResult, name: str, lengths: list[int], length: int) -> np.ndarray:
    outs = result.outputs
    if name == OUTPUT_MASK:
        return (np.arange(length)[None, :] < np.array(lengths)[:, None]).astype("<i8")
    if name == OUTPUT_POOLED:
        return wire.float32_le(np.stack([o.pooled for o in outs if o.pooled is not None]))
    field, axes = {
        graph_io.OUTPUT_HIDDEN: ("embeddings", (0,)),
        graph_io.OUTPUT_ATTENTIONS: ("attention", (2, 3)),
        graph_io.OUTPUT_HIDDEN_STATES: ("hidden_states", (1,)),
    }[name]
    arrays = [getattr(o, field) for o in outs]
    return wire.float32_le(repad(arrays, length, axes))
