"""Bytes <-> numpy: JSON bodies, nested float lists and base64 float32 arrays.

Arrays never pass through pydantic or Python float lists on the way out:
orjson serialises numpy directly, and base64 is the raw little-endian bytes.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np
import orjson

from service.errors import InvalidInput, InvalidJSON

FLOAT32_LE = np.dtype("<f4")
# Bytes one float costs in a response, for the up-front size check: orjson
# writes a float32 in at most ~13 characters plus a separator; base64 is 4/3 x 4.
BYTES_PER_FLOAT = {"float": 14.0, "base64": 16.0 / 3.0}


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("request body must be a JSON object")
    return value


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def _decode_base64_array(item: dict[str, Any], where: str) -> np.ndarray:
    unknown = set(item) - {"shape", "data", "dtype"}
    if unknown:
        raise InvalidInput(f"{where}: unknown keys {sorted(unknown)}")
    shape, data = item.get("shape"), item.get("data")
    if item.get("dtype", "float32") != "float32":
        raise InvalidInput(f"{where}: dtype must be 'float32'")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):
        raise InvalidInput(
            f"{where}: 'shape' must be [seq_len, d_model]: rank 2, non-negative integers"
        )
    if not isinstance(data, str):
        raise InvalidInput(f"{where}: 'data' must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{where}: 'data' is not valid base64") from None
    expected = math.prod(shape) * FLOAT32_LE.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"{where}: 'data' holds {len(raw)} bytes but shape {shape} needs {expected}"
        )
    try:
        array = np.frombuffer(raw, dtype=FLOAT32_LE).reshape(shape)
    except ValueError:  # e.g. a dimension beyond what numpy can index
        raise InvalidInput(f"{where}: 'shape' {shape} cannot be represented") from None
    return array.astype(np.float32, copy=False)


def declared_length(item: Any) -> int | None:
    """Sequence length of an input item without decoding it (for early limit checks)."""
    if isinstance(item, list):
        return len(item)
    if isinstance(item, dict) and isinstance(item.get("shape"), list) and item["shape"]:
        first = item["shape"][0]
        return first if isinstance(first, int) else None
    return None


def decode_sequence(item: Any, index: int, d_model: int) -> np.ndarray:
    """One input item -> float32 [seq_len, d_model], or InvalidInput saying what is wrong."""
    where = f"inputs[{index}]"
    if isinstance(item, dict):
        array = _decode_base64_array(item, where)
    elif isinstance(item, list):
        try:
            parsed = np.asarray(item)  # no dtype: strings and booleans must not pass as numbers
        except (ValueError, TypeError):
            parsed = None
        if parsed is None or parsed.dtype.kind not in "fiu":
            raise InvalidInput(
                f"{where}: must be a rectangular [seq_len, {d_model}] array of numbers"
            )
        array = parsed.astype(np.float32)
    else:
        raise InvalidInput(
            f"{where}: must be a [seq_len, d_model] array or a {{shape, data}} base64 object"
        )
    if array.ndim != 2:
        raise InvalidInput(
            f"{where}: expected rank 2 [seq_len, {d_model}], got shape {list(array.shape)}"
        )
    if array.shape[0] == 0:
        raise InvalidInput(f"{where}: sequence is empty")
    if array.shape[1] != d_model:
        raise InvalidInput(f"{where}: width {array.shape[1]} does not match d_model {d_model}")
    if not np.isfinite(array).all():
        raise InvalidInput(f"{where}: contains NaN or Inf (or a value beyond float32 range)")
    return array


def encode_array(array: np.ndarray, encoding_format: str) -> Any:
    """Response form of an array: itself (orjson writes it) or a Base64Array dict."""
    array = np.ascontiguousarray(array, dtype=FLOAT32_LE)
    if encoding_format == "base64":
        return {
            "shape": list(array.shape),
            "dtype": "float32",
            "data": base64.b64encode(array.tobytes()).decode("ascii"),
        }
    return array
