"""The Open Inference Protocol's REST framing: JSON, with the binary tensor extension.

Request framing: a JSON header, then (binary extension) the raw little-endian
bytes of every input that declares ``parameters.binary_data_size``, in input
order; the header's length is the ``Inference-Header-Content-Length`` header
(absent: the whole body is JSON). Content-Type is never consulted: tritonclient's
sync client sends none, its async one ``application/octet-stream`` even for JSON.
What the tensors mean is ``open_inference/tensors.py``'s business; this module only frames them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.engine import (
    ClassifyRequest,
    ClassifyResult,
    EncodeRequest,
    EncodeResult,
    ModelInfo,
    MultiVectorResult,
    RerankRequest,
    RerankResult,
)
from service.errors import InvalidInput, quoted
from service.protocols import wire
from service.protocols.http import Answer
from service.protocols.open_inference import classify, multi_vector, rerank, tensors
from service.protocols.open_inference.attention import AttentionParameters
from service.protocols.open_inference.tensors import InputTensor, Options, Reply

HEADER_LENGTH = "inference-header-content-length"
# Inference-Header-Content-Length: ASCII digits only ("²" passes str.isdigit, not int()).
DECIMAL = re.compile(r"[0-9]{1,15}")


def json_prefix(header_length: str | None) -> int | None:
    """How many leading bytes of the body are JSON (None: all; 0 when the header is
    malformed, which parsing then refuses)."""
    if header_length is None:
        return None
    return int(header_length.strip()) if DECIMAL.fullmatch(header_length.strip()) else 0


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
    body: bytes, header_length: str | None, info: ModelInfo, version: str | None
) -> tuple[EncodeRequest, Reply]:
    """An infer body -> (EncodeRequest, what the answer needs)."""
    params, inputs, outputs, request_id = _parsed(body, header_length, info)
    options = Options(
        pooling=params.get("pooling", "none"),
        normalize=_bool(params.get("normalize", False), "parameters.normalize"),
        truncate=_bool(params.get("truncate", False), "parameters.truncate"),
        attention=AttentionParameters.of(params),
        embedding_type=params.get("embedding_type", "float"),
    )
    return tensors.encode_request(inputs, outputs, options, info, version, request_id)


def _parsed(
    body: bytes, header_length: str | None, info: ModelInfo
) -> tuple[dict[str, Any], list[InputTensor], dict[str, bool], str | None]:
    """An infer body's parameters, input tensors, requested outputs and id, checked."""
    header, binary = split_body(body, header_length)
    params = _dict(header.get("parameters"), "parameters")
    inputs = _inputs(header, binary)
    outputs = _requested_outputs(header.get("outputs"), params, info, inputs)
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return params, inputs, outputs, request_id


def _inputs(header: dict[str, Any], binary: memoryview) -> list[InputTensor]:
    """The header's input tensors, each with its share of the binary part (which they
    must take whole)."""
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    inputs, offset = [], 0
    for spec in raw_inputs:
        tensor, offset = _input(_dict(spec, "inputs[]"), binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidInput(
            f"{len(binary) - offset:,} trailing bytes after the binary inputs (the inputs' "
            "binary_data_size sum to less than the body holds)"
        )
    return inputs


def _input(spec: dict[str, Any], binary: memoryview, offset: int) -> tuple[InputTensor, int]:
    """One input's JSON entry -> (the tensor as framed, the binary offset after it)."""
    name = spec.get("name")
    params = _dict(spec.get("parameters"), f"input {quoted(name)} parameters")
    datatype, shape = spec.get("datatype"), spec.get("shape")
    if "binary_data_size" not in params:
        data, has_data = spec.get("data"), "data" in spec
        return InputTensor(name, datatype, shape, data=data, has_data=has_data), offset
    size = params["binary_data_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(f"input {quoted(name)}: binary_data_size must be a non-negative integer")
    if offset + size > len(binary):
        raise InvalidInput(
            f"input {quoted(name)}: binary_data_size {size:,} goes beyond the body "
            f"({len(binary) - offset:,} bytes remain after the header)"
        )
    return InputTensor(name, datatype, shape, raw=binary[offset : offset + size]), offset + size


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


def _requested_outputs(
    raw: Any, params: dict[str, Any], info: ModelInfo, inputs: list[InputTensor]
) -> dict[str, bool]:
    """Output name -> binary, in the order asked (every output when none is named)."""
    known = [name for name, _, _ in tensors.available_outputs(info)]
    binary_all = _bool(params.get("binary_data_output", False), "parameters.binary_data_output")
    if raw is None:
        names = [spec.name for spec in inputs]
        return dict.fromkeys(tensors.default_outputs(info, params, names), binary_all)
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


def infer_response(result: EncodeResult, reply: Reply) -> Answer:
    """The answer: JSON header, then the raw bytes of the binary outputs, in order."""
    outputs = [
        (name, datatype, array, reply.outputs[name])
        for name, datatype, array in tensors.output_arrays(result, reply)
    ]
    return _answer(reply.model, result.version, reply.request_id, outputs)


def _answer(
    model: str,
    version: str,
    request_id: str | None,
    outputs: list[tuple[str, str, np.ndarray, bool]],
) -> Answer:
    """(name, datatype, array, as raw bytes) outputs framed: a JSON header listing each,
    then the raw bytes of the binary ones, in order."""
    entries: list[dict[str, Any]] = []
    blobs: list[memoryview] = []
    for name, datatype, array, binary in outputs:
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if datatype == "BYTES":  # a classifier's labels
            raw = memoryview(classify.serialized(array))
            if binary:
                entry["parameters"] = {"binary_data_size": raw.nbytes}
                blobs.append(raw)
            else:
                entry["data"] = classify.texts_of(array)
        elif binary:
            raw = np.ascontiguousarray(array).data.cast("B")  # its own buffer: no copy
            entry["parameters"] = {"binary_data_size": raw.nbytes}
            blobs.append(raw)
        else:
            entry["data"] = array.ravel()
        entries.append(entry)
    header: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        header["id"] = request_id
    header["outputs"] = entries
    content = wire.dumps(header)
    if not blobs:
        return Answer([content])
    return Answer(
        [content, *blobs],
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(content))},
    )


def rerank_request(
    body: bytes, header_length: str | None, info: ModelInfo
) -> tuple[RerankRequest, RerankReply]:
    """An infer body for a reranker -> its request, and how to frame the scores."""
    params, inputs, outputs, request_id = _parsed(body, header_length, info)
    binary_out = next(iter(outputs.values()))
    return rerank.rerank_request(inputs, params, info), RerankReply(request_id, binary_out)


@dataclass(frozen=True)
class RerankReply:
    request_id: str | None
    binary: bool  # the scores as raw bytes


def rerank_response(result: RerankResult, reply: RerankReply, version: str) -> Answer:
    """The scores, in the documents' order, as JSON data or raw bytes."""
    scores = (rerank.OUTPUT_SCORES, "FP32", rerank.scores(result), reply.binary)
    return _answer(result.model, version, reply.request_id, [scores])


def classify_request(
    body: bytes, header_length: str | None, info: ModelInfo
) -> tuple[ClassifyRequest, tuple[str | None, dict[str, bool]]]:
    """An infer body for a classifier -> its request, and (id, the outputs asked)."""
    params, inputs, outputs, request_id = _parsed(body, header_length, info)
    return classify.classify_request(inputs, params, info), (request_id, outputs)


def classify_response(
    result: ClassifyResult, reply: tuple[str | None, dict[str, bool]], version: str
) -> Answer:
    """The scores [n, labels] and the labels' names, as JSON data or raw bytes."""
    request_id, outputs = reply
    arrays = classify.output_arrays(result, list(outputs))
    framed = [(name, datatype, array, outputs[name]) for name, datatype, array in arrays]
    return _answer(result.model, version, request_id, framed)


@dataclass(frozen=True)
class MultiVectorReply:
    request_id: str | None
    outputs: dict[str, bool]  # requested output -> as raw bytes
    version: str


def multi_vector_request(
    body: bytes, header_length: str | None, info: ModelInfo
) -> tuple[multi_vector.Request, MultiVectorReply]:
    """An infer body for a late-interaction model -> its texts' request (or, for a query
    and documents, a rerank request), and how to frame the answer."""
    params, inputs, outputs, request_id = _parsed(body, header_length, info)
    reply = MultiVectorReply(request_id, outputs, info.version)
    return multi_vector.request(inputs, params, outputs, info), reply


def multi_vector_response(result: MultiVectorResult, reply: MultiVectorReply) -> Answer:
    """The outputs asked (``open_inference/multi_vector.py``), as JSON data or raw bytes."""
    arrays = multi_vector.output_arrays(result, list(reply.outputs))
    framed = [(name, datatype, array, reply.outputs[name]) for name, datatype, array in arrays]
    return _answer(result.model, reply.version, reply.request_id, framed)


def maxsim_response(result: RerankResult, reply: MultiVectorReply) -> Answer:
    """A query and documents' scores on a late-interaction model (a reranker's answer)."""
    binary = reply.outputs[rerank.OUTPUT_SCORES]
    return rerank_response(result, RerankReply(reply.request_id, binary), reply.version)
