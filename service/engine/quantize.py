"""Quantized sentence embeddings: int8, uint8, binary and ubinary, per request.

sentence-transformers' ``quantize_embeddings`` semantics, bit for bit:

- ``int8``/``uint8``: per dimension, ``q = clip(floor((x - min) / step), 0, 255)`` with
  ``step = (max - min) / 255`` (1 where max = min); uint8 is ``q``, int8 ``q - 128``.
  The ranges ([2, width]: mins, maxes) are the caller's (``quantization_ranges``) or
  the model's, computed at export on calibration sentences and recorded in its
  manifest: those fit only its own sentence vectors (its pooling, L2-normalised,
  full width), so other vectors need the caller's.
- ``binary``/``ubinary``: ``x > 0`` packed 8 dimensions per byte, most significant
  bit first (``np.packbits``): uint8 for ubinary, minus 128 as int8 for binary;
  ceil(width / 8) bytes.

Applied to the pooled vector after pooling, normalisation and Matryoshka shortening.
"""

from __future__ import annotations

import math

import numpy as np

from service.errors import InvalidInput
from service.model_info import ModelInfo

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
# Each range: (mins, maxes), one per dimension of the answered vector.
Ranges = tuple[tuple[float, ...], tuple[float, ...]]


def ranges_for(
    info: ModelInfo, embedding_type: str, given: Ranges | None, width: int, own: bool
) -> np.ndarray | None:
    """The [2, width] float32 ranges an int8/uint8 answer uses (None for other types);
    the model's recorded ones only for ``own`` vectors (its pooling, normalised, full
    width: what they were computed on); 422 naming ``quantization_ranges`` when none fit."""
    if embedding_type not in EMBEDDING_TYPES:
        raise InvalidInput(
            f"must be one of {', '.join(EMBEDDING_TYPES)}, got {embedding_type!r}",
            field=("embedding_type",),
        )
    if embedding_type not in ("int8", "uint8"):
        if given is not None:
            raise InvalidInput(
                f"applies to int8 and uint8 only, not {embedding_type}",
                field=("quantization_ranges",),
            )
        return None
    if given is None:
        recorded = info.manifest.quantization_ranges
        if recorded is None or not own:
            why = (
                "the model's ranges are of its own sentence vectors (its pooling, "
                "L2-normalised, full width), which this request does not ask for"
                if recorded is not None
                else f"model {info.name!r} records no ranges"
            )
            raise InvalidInput(
                f"is needed for {embedding_type}: {why}; send [[min per dimension], "
                f"[max per dimension]] of {width} each",
                field=("quantization_ranges",),
            )
        given = recorded
    mins, maxes = given
    if len(mins) != width or len(maxes) != width:
        raise InvalidInput(
            f"must be two lists of {width} numbers (the answered vector's width), got "
            f"{len(mins)} and {len(maxes)}",
            field=("quantization_ranges",),
        )
    ranges = np.asarray([mins, maxes], dtype=np.float32)
    if not np.isfinite(ranges).all() or (ranges[1] < ranges[0]).any():
        raise InvalidInput(
            "must be finite, each max at least its min", field=("quantization_ranges",)
        )
    return ranges


def quantize(vector: np.ndarray, embedding_type: str, ranges: np.ndarray | None) -> np.ndarray:
    """A float32 [width] vector in ``embedding_type`` (``ranges`` for int8/uint8)."""
    if embedding_type == "float":
        return vector
    if embedding_type in ("binary", "ubinary"):
        packed = np.packbits(vector > 0)
        return (packed - 128).astype(np.int8) if embedding_type == "binary" else packed
    assert ranges is not None
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    q = np.clip(np.floor((vector.astype(np.float32) - starts) / steps), 0, 255)
    out: np.ndarray = q.astype(np.uint8) if embedding_type == "uint8" else (q - 128).astype(np.int8)
    return out


def width_of(embedding_type: str, width: int) -> int:
    """Values per answered vector: bytes for the packed types."""
    return math.ceil(width / 8) if embedding_type in ("binary", "ubinary") else width
