"""Classifiers over the Open Inference Protocol (HTTP ``/v2`` and gRPC alike).

A classifier's ``/v2`` model takes ``text`` BYTES [n] and answers ``scores`` FP32
[n, labels] (column k is label k, the head's id order) and ``labels`` BYTES [labels]
(their names): the scores ``/v1/classify`` gives (the model's score function;
``parameters.raw_scores`` for the logits), each text refused past the model's window
unless ``parameters.truncate`` is true. Pairs are ``/v1/classify``'s.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from service.engine import ClassifyRequest, ClassifyResult, ModelInfo
from service.errors import InvalidInput
from service.protocols.open_inference.tensors import (
    CLASSIFY_INPUTS,
    OUTPUT_LABELS,
    OUTPUT_SCORES,
    InputTensor,
    decode_input,
)


def is_classifier(info: ModelInfo) -> bool:
    return info.manifest.task == "classify"


def classify_request(
    inputs: list[InputTensor], params: dict[str, Any], info: ModelInfo
) -> ClassifyRequest:
    """The ``text`` tensor and parameters -> the engine's request."""
    allowed = {name: dtype for name, dtype, _ in CLASSIFY_INPUTS}
    if len(inputs) != 1:
        raise InvalidInput(f"a classifier takes one input, {sorted(allowed)}: got {len(inputs)}")
    _, texts = decode_input(inputs[0], allowed)
    for key in ("raw_scores", "truncate"):
        if not isinstance(params.get(key, False), bool):
            raise InvalidInput(f"parameters.{key} must be true or false")
    return ClassifyRequest(
        # Read lazily: the engine checks their count before any is decoded.
        inputs=cast(Sequence[str], texts),  # type: ignore[arg-type]
        model=info.name,
        raw_scores=params.get("raw_scores", False),
        truncate=params.get("truncate", False),
    )


def output_arrays(result: ClassifyResult, names: Sequence[str]) -> list[tuple[str, str, Any]]:
    """(name, datatype, array) of each requested output: ``scores`` FP32 little-endian,
    ``labels`` an object array of UTF-8 bytes."""
    arrays = {
        OUTPUT_SCORES: ("FP32", np.ascontiguousarray(result.scores, dtype="<f4")),
        OUTPUT_LABELS: ("BYTES", np.array([x.encode() for x in result.labels], dtype=object)),
    }
    return [(name, *arrays[name]) for name in names]


def serialized(array: np.ndarray) -> bytes:
    """A BYTES tensor's raw form (Triton's): each element's 4-byte little-endian length,
    then its bytes."""
    return b"".join(struct.pack("<I", len(x)) + x for x in array.ravel())


def texts_of(array: np.ndarray) -> list[str]:
    """A BYTES output's elements as JSON strings."""
    return [x.decode() for x in array.ravel()]
