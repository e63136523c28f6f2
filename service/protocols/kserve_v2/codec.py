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
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, overload

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
# Dimensions a tensor may declare (ours have at most 3); data is nested no deeper.
MAX_RANK = 8
# Inference-Header-Content-Length: ASCII digits only ("²" passes str.isdigit, not int()).
DECIMAL = re.compile(r"[0-9]{1,15}")
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
    rows: Rows | None  # the embeds rows, whose lengths pad the answer (None for text)
    pad_to: int  # the request's seq (0 for text: the longest)


class Rows(Sequence[InputItem]):
    """The rows of ``inputs_embeds`` as lazy ArrayInputs, as many as its batch axis says.

    The mask is read (and each row's length found) only when the engine reads a row,
    after it has checked the batch size: a zero-size tensor declaring 2**40 rows is
    refused by that count, never scanned.
    """

    def __init__(self, embeds: np.ndarray, mask: np.ndarray | None) -> None:
        self._embeds, self._mask = embeds, mask

    def __len__(self) -> int:
        return int(self._embeds.shape[0])

    @cached_property
    def lengths(self) -> list[int]:
        if self._mask is None:
            return [int(self._embeds.shape[1])] * len(self)
        return lengths_of(self._mask)

    @overload
    def __getitem__(self, index: int) -> InputItem: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[InputItem]: ...
    def __getitem__(self, index: int | slice) -> InputItem | Sequence[InputItem]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        n = self.lengths[index]
        embeds = self._embeds
        return ArrayInput(rows=n, decode=lambda: embeds[index, :n])


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
    if not DECIMAL.fullmatch(header_length.strip()):
        raise InvalidInput(
            f"Inference-Header-Content-Length {quoted(header_length)} is not a number"
        )
    size = int(header_length.strip())
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
    tensors: dict[str, np.ndarray | Texts] = {}
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
        texts = tensors[INPUT_TEXT]
        assert isinstance(texts, Texts)
        inputs: Sequence[InputItem] = texts
        rows, pad_to = None, 0
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
        assert mask is None or isinstance(mask, np.ndarray)
        if mask is not None and mask.shape != embeds.shape[:2]:
            raise InvalidInput(
                f"input {graph_io.INPUT_MASK!r} has shape {list(mask.shape)}; "
                f"{graph_io.INPUT_EMBEDS!r} needs {list(embeds.shape[:2])}"
            )
        rows, pad_to = Rows(embeds, mask), int(embeds.shape[1])
        inputs = rows
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
    return request, Reply(info.name, version, request_id, outputs, rows, pad_to)


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
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise InvalidInput(
            f"input {quoted(name)}: 'shape' must be a list of at most {MAX_RANK} non-negative "
            "integers"
        )
    return shape


def _reshaped(array: np.ndarray, shape: list[int], name: str) -> np.ndarray:
    """``array`` in ``shape``; a zero-size tensor may declare dimensions numpy cannot hold."""
    try:
        return array.reshape(shape)
    except ValueError:
        raise InvalidInput(f"input {quoted(name)}: shape {shape} cannot be represented") from None


def _input_tensor(
    spec: dict[str, Any], binary: memoryview, offset: int, allowed: dict[str, str]
) -> tuple[str, np.ndarray | Texts, int]:
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
            return name, Texts(count, lambda: _bytes_elements(raw, count, name)), offset + size
        dtype = np.dtype(NUMERIC[datatype])
        if size != count * dtype.itemsize:
            raise InvalidInput(
                f"input {quoted(name)}: binary_data_size {size:,} does not match shape {shape} of "
                f"{datatype} ({count * dtype.itemsize:,} bytes)"
            )
        return name, _reshaped(np.frombuffer(raw, dtype=dtype), shape, name), offset + size
    if "data" not in spec:
        raise InvalidInput(f"input {quoted(name)} has neither 'data' nor binary_data_size")
    data = spec["data"]
    if datatype == "BYTES":
        flat = _flatten(data, max(len(shape), 1), count, name)
        if len(flat) != count or not all(isinstance(x, str) for x in flat):
            raise InvalidInput(
                f"input {quoted(name)}: 'data' must hold {count} strings for shape {shape}"
            )
        return name, Texts(count, lambda: [x.encode() for x in flat]), offset
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
        return name, _reshaped(array.astype(NUMERIC[datatype]), shape, name), offset


def _flatten(data: Any, depth: int, count: int, name: str) -> list[Any]:
    """Row-major elements of ``data`` nested at most ``depth`` deep; stops at the first
    element beyond ``count`` (iterative: a deep nesting must not reach the recursion limit)."""
    flat: list[Any] = []
    stack = [iter(data if isinstance(data, list) else [data])]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= depth:
                    raise InvalidInput(
                        f"input {quoted(name)}: 'data' is nested deeper than its {depth} "
                        "dimension(s)"
                    )
                stack.append(iter(item))
                break
            flat.append(item)
            if len(flat) > count:
                raise InvalidInput(
                    f"input {quoted(name)}: 'data' holds more than the {count} elements of its "
                    "shape"
                )
        else:
            stack.pop()
    return flat


def _bytes_elements(raw: memoryview, count: int, name: str) -> list[bytes]:
    """Triton's BYTES serialisation: each element a 4-byte little-endian length, then bytes.
    Stops at the first element beyond ``count``."""
    elements: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidInput(f"input {quoted(name)}: a BYTES element's length is cut short")
        if len(elements) == count:
            raise InvalidInput(
                f"input {quoted(name)}: more BYTES elements than the {count} of its shape"
            )
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


class Texts(Sequence[InputItem]):
    """The ``text`` tensor's elements as strings, as many as its shape declares.

    Its elements are parsed only when the engine first reads one, after it has
    checked their count: a body of millions of tiny elements is refused by its
    declared shape, not after millions of objects were built.
    """

    def __init__(self, count: int, load: Callable[[], list[bytes]]) -> None:
        self._count, self._load = count, load

    def __len__(self) -> int:
        return self._count

    @cached_property
    def _texts(self) -> list[str]:
        try:
            return [t.decode("utf-8") for t in self._load()]
        except UnicodeDecodeError:
            raise InvalidInput("input 'text': elements must be UTF-8") from None

    @overload
    def __getitem__(self, index: int) -> InputItem: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[InputItem]: ...
    def __getitem__(self, index: int | slice) -> InputItem | Sequence[InputItem]:
        return self._texts[index]


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
    lengths = reply.rows.lengths if reply.rows is not None else [o.length for o in result.outputs]
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
