"""Quantized sentence embeddings on the wire, the same on every protocol that pools.

The request fields (``embedding_type``, ``quantization_ranges``; see
``service.engine.quantize`` for what they mean) and the answer's form of a pooled
vector: float32 as before; int8/uint8 (and the packed binary/ubinary bytes) as JSON
integers, or base64 of the raw bytes with their dtype.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from service.errors import InvalidInput
from service.protocols import wire

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]


class QuantizedOptions(BaseModel):
    """What a pooling route takes to answer quantized vectors."""

    embedding_type: EmbeddingType = Field(
        "float",
        description="float; int8/uint8: per dimension floor((x - min) / ((max - min) / 255)) "
        "clipped to 0..255 (int8: minus 128), sentence-transformers' quantize_embeddings; "
        "binary/ubinary: x > 0 packed 8 per byte (binary: minus 128 as int8).",
    )
    quantization_ranges: list[list[float]] | None = Field(
        None,
        description="int8/uint8: [[min per dimension], [max per dimension]] of the answered "
        "width; default: the model's own, computed at export on calibration sentences.",
    )

    def ranges(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        given = self.quantization_ranges
        if given is None:
            return None
        if len(given) != 2:
            raise InvalidInput(
                "must be [[min per dimension], [max per dimension]]",
                field=("quantization_ranges",),
            )
        return tuple(given[0]), tuple(given[1])


def pooled_array(array: np.ndarray, encoding_format: str) -> Any:
    """A pooled vector's answer form: float32 as the protocol writes floats (``None``:
    the caller's own float form), integers as themselves or base64 of their bytes."""
    if array.dtype == np.float32:
        return None
    if encoding_format == "base64":
        return {
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "data": wire.base64_value(np.ascontiguousarray(array).tobytes()),
        }
    return array  # orjson writes integers
