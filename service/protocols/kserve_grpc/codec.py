"""``ModelInferRequest`` <-> the Open Inference Protocol tensors of ``open_inference.tensors``.

Inputs arrive as ``raw_input_contents`` (one little-endian buffer per input, in
input order, as tritonclient sends them) or as typed ``contents``; outputs are
always sent as ``raw_output_contents``, each output's own buffer (no copy into a
joined body). What the tensors mean (inputs a model takes, shapes, padding) is
``open_inference/tensors.py``'s, shared with the HTTP ``/v2``, so both answer the same
numbers.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

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
from service.protocols.open_inference import classify, multi_vector, rerank, tensors
from service.protocols.open_inference.attention import AttentionParameters
from service.protocols.open_inference.tensors import InputTensor, Options, Reply

# The typed contents field of each datatype.
CONTENTS = {
    "FP32": "fp32_contents",
    "INT64": "int64_contents",
    "INT32": "int_contents",
    "BOOL": "bool_contents",
    "BYTES": "bytes_contents",
}


def parameter(value: pb.InferParameter) -> Any:
    """An InferParameter's value, whichever of its fields is set (None: none is)."""
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def infer_request(
    request: pb.ModelInferRequest, info: ModelInfo, version: str | None
) -> tuple[EncodeRequest, Reply]:
    """A ModelInferRequest -> (EncodeRequest, what the answer needs)."""
    params = {key: parameter(value) for key, value in request.parameters.items()}
    inputs = _inputs(request)
    outputs = _requested_outputs([o.name for o in request.outputs], params, info, inputs)
    options = Options(
        pooling=_typed(params.get("pooling", "none"), str, "pooling"),
        normalize=_typed(params.get("normalize", False), bool, "normalize"),
        truncate=_typed(params.get("truncate", False), bool, "truncate"),
        attention=AttentionParameters.of(params),
        embedding_type=_typed(params.get("embedding_type", "float"), str, "embedding_type"),
    )
    return tensors.encode_request(inputs, outputs, options, info, version, request.id or None)


def _inputs(request: pb.ModelInferRequest) -> list[InputTensor]:
    """The request's input tensors, each with its raw buffer if they come raw."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"raw_input_contents holds {len(raw)} buffers for {len(request.inputs)} inputs "
            "(one per input, in order)"
        )
    return [
        _input(tensor, memoryview(raw[i]) if raw else None)
        for i, tensor in enumerate(request.inputs)
    ]


def _input(tensor: pb.ModelInferRequest.InferInputTensor, raw: memoryview | None) -> InputTensor:
    shape = list(tensor.shape)
    if raw is not None:
        return InputTensor(tensor.name, tensor.datatype, shape, raw=raw)
    field = CONTENTS.get(tensor.datatype)
    if field is None or not tensor.HasField("contents"):
        raise InvalidInput(
            f"input {quoted(tensor.name)} has neither contents nor raw_input_contents"
            if field is not None
            else f"input {quoted(tensor.name)}: datatype {quoted(tensor.datatype)} is not "
            f"one this model takes"
        )
    values = getattr(tensor.contents, field)
    if tensor.datatype == "BYTES":  # framed as the binary extension frames BYTES
        framed = b"".join(struct.pack("<I", len(v)) + v for v in values)
        return InputTensor(tensor.name, tensor.datatype, shape, raw=memoryview(framed))
    return InputTensor(tensor.name, tensor.datatype, shape, data=list(values), has_data=True)


def _typed(value: Any, kind: type, name: str) -> Any:
    if not isinstance(value, kind):
        raise InvalidInput(f"parameter {quoted(name)} must be a {kind.__name__}_param")
    return value


def _requested_outputs(
    names: list[str], params: dict[str, Any], info: ModelInfo, inputs: list[InputTensor]
) -> dict[str, bool]:
    """Output name -> True (raw), in the order asked; every output when none is named."""
    known = [name for name, _, _ in tensors.available_outputs(info)]
    if not names:
        input_names = [spec.name for spec in inputs]
        return dict.fromkeys(tensors.default_outputs(info, params, input_names), True)
    outputs: dict[str, bool] = {}
    for name in names:
        if name not in known:
            raise InvalidInput(f"unknown output {quoted(name)}: this model answers {known}")
        if name in outputs:
            raise InvalidInput(f"output {quoted(name)} is asked for twice")
        outputs[name] = True
    return outputs


def infer_response(result: EncodeResult, reply: Reply) -> pb.ModelInferResponse:
    """Every requested output as raw little-endian bytes, in the order asked."""
    response = pb.ModelInferResponse(
        model_name=reply.model, model_version=result.version, id=reply.request_id or ""
    )
    for name, datatype, array in tensors.output_arrays(result, reply):
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
    return response


def rerank_request(request: pb.ModelInferRequest, info: ModelInfo) -> RerankRequest:
    """A ModelInferRequest for a reranker -> its request (``open_inference/rerank.py``)."""
    params = {key: parameter(value) for key, value in request.parameters.items()}
    inputs = _inputs(request)
    _requested_outputs([o.name for o in request.outputs], params, info, inputs)
    return rerank.rerank_request(inputs, params, info)


def rerank_response(
    result: RerankResult, request: pb.ModelInferRequest, version: str
) -> pb.ModelInferResponse:
    """The scores as raw little-endian FP32, in the documents' order."""
    response = pb.ModelInferResponse(
        model_name=result.model, model_version=version, id=request.id or ""
    )
    array = rerank.scores(result)
    response.outputs.add(name=rerank.OUTPUT_SCORES, datatype="FP32", shape=[len(array)])
    response.raw_output_contents.append(array.tobytes())
    return response


def classify_request(
    request: pb.ModelInferRequest, info: ModelInfo
) -> tuple[ClassifyRequest, list[str]]:
    """A ModelInferRequest for a classifier -> its request and the outputs asked
    (``open_inference/classify.py``)."""
    params = {key: parameter(value) for key, value in request.parameters.items()}
    inputs = _inputs(request)
    outputs = _requested_outputs([o.name for o in request.outputs], params, info, inputs)
    return classify.classify_request(inputs, params, info), list(outputs)


def classify_response(
    result: ClassifyResult, outputs: list[str], request: pb.ModelInferRequest, version: str
) -> pb.ModelInferResponse:
    """The scores [n, labels] as raw little-endian FP32, the labels as raw BYTES."""
    response = pb.ModelInferResponse(
        model_name=result.model, model_version=version, id=request.id or ""
    )
    for name, datatype, array in classify.output_arrays(result, outputs):
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        raw = classify.serialized(array) if datatype == "BYTES" else array.tobytes()
        response.raw_output_contents.append(raw)
    return response


def multi_vector_request(
    request: pb.ModelInferRequest, info: ModelInfo
) -> tuple[multi_vector.Request, list[str]]:
    """A ModelInferRequest for a late-interaction model -> its texts' request (or, for a
    query and documents, a rerank request) and the outputs asked
    (``open_inference/multi_vector.py``)."""
    params = {key: parameter(value) for key, value in request.parameters.items()}
    inputs = _inputs(request)
    outputs = _requested_outputs([o.name for o in request.outputs], params, info, inputs)
    return multi_vector.request(inputs, params, outputs, info), list(outputs)


def multi_vector_response(
    result: MultiVectorResult, outputs: list[str], request: pb.ModelInferRequest, version: str
) -> pb.ModelInferResponse:
    """Every requested output as raw little-endian bytes, in the order asked."""
    response = pb.ModelInferResponse(
        model_name=result.model, model_version=version, id=request.id or ""
    )
    for name, datatype, array in multi_vector.output_arrays(result, outputs):
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(array.tobytes())
    return response
