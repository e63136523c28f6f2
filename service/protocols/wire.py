"""Bytes <-> Python values every protocol shares: JSON objects, little-endian float32.

Arrays never pass through pydantic or Python float lists on the way out:
orjson serialises numpy directly, and base64 is the raw little-endian bytes.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from service.errors import InvalidInput, InvalidJSON

FLOAT32_LE = np.dtype("<f4")
# Upper bounds of what arrays cost in an answer, for the engine's up-front size
# check. orjson writes a float32 in at most 16 characters (-0.0000063184107; checked
# over 5 M random bit patterns) plus a separator; nested JSON adds at most 3 bytes
# ("[", "]", ",") per row at each of up to 4 levels; base64 is 4/3 x 4 bytes per float.
JSON_ARRAYS = dict(per_float=17.0, per_row=12.0, per_array=3.0)
# A sparse vector's nonzero in JSON: its index (a vocabulary id, or BM42's 32-bit hash:
# at most 10 digits) and its value (a float64, which orjson writes in at most 24
# characters: -2.2250738585072014e-308), each with a separator.
JSON_SPARSE_INDEX = 11.0
JSON_SPARSE_VALUE = 25.0
# {"shape":[..],"dtype":"float32","data":"..."} with up to 4 dimensions, and padding;
# float16 maps 2 bytes each.
BASE64_ARRAYS = dict(per_float=16.0 / 3.0, per_half=8.0 / 3.0, per_array=96.0)

# What parsing a JSON body costs at its peak, measured with tracemalloc (orjson, then
# numpy for arrays; bench/floods.py): orjson's parser reserves ~13 bytes per body
# byte while it runs, then each value becomes a Python object in a list slot (a float
# 24 + 8, and 8 more in a float64 array), each array or object an empty list or dict
# (56-64), each string ~48 + its text. 1.0-1.4x the measured peak of floats, ints,
# texts, empty lists and tiny strings (2.1x for small ints, which Python caches).
DECODED_PER_BYTE = 13
DECODED_PER_VALUE = 40
DECODED_PER_CONTAINER = 64
DECODED_PER_STRING = 48

# Arrays of this many bytes and more are joined into an answer as base64 bytes (dumps).
SPLICED_BYTES = 64 * 1024

Options = TypeVar("Options", bound=BaseModel)
T = TypeVar("T")


class JsonCost:
    """What a JSON body will cost to parse, counted from its bytes as they arrive.

    Commas bound the values, brackets the arrays and objects, quotes the strings
    (brackets, commas and quotes inside strings count too: an overestimate, never an
    underestimate). Counting a 64 KiB chunk takes ~0.3 ms, so a body is judged
    before it is parsed, and one built of millions of tiny elements is refused after
    its first chunks, not after seconds of parsing.
    """

    def __init__(self) -> None:
        self.bytes = self.commas = self.containers = self.quotes = 0

    def add(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        self.commas += chunk.count(b",")
        self.containers += chunk.count(b"[") + chunk.count(b"{")
        self.quotes += chunk.count(b'"')

    @property
    def items(self) -> int:
        """Arrays, objects and strings in the body, at most."""
        return self.containers + self.quotes // 2

    @property
    def decoded_bytes(self) -> int:
        """Memory its parse may take at its peak (the model above)."""
        return (
            DECODED_PER_BYTE * self.bytes
            + DECODED_PER_VALUE * (self.commas + 1)
            + DECODED_PER_CONTAINER * self.containers
            + DECODED_PER_STRING * (self.quotes // 2)
        )


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("request body must be a JSON object")
    return value


def dumps(obj: Any) -> bytes:
    """``obj`` as JSON bytes: numpy arrays as nested numbers, ``Base64`` values as
    base64 strings.

    Each ``Base64`` is written by orjson as a marker string (a control character, which
    orjson escapes, and a random number drawn for this answer: no text of the answer
    can spell it), and the answer is then joined around the markers with the base64
    bytes in their place: one copy of each into the answer, where a ``str`` costs a copy
    and orjson's scan of it, and orjson's growing output buffer its page faults (W4's
    4.9 MB answer: 2x the faults with ``orjson.Fragment``). The bytes are the same as
    writing each base64 as a ``str``."""
    blobs: list[bytes] = []
    markers: list[str] = []  # the marker, drawn at the first Base64 (none: no draw)

    def default(value: Any) -> str:
        if isinstance(value, Base64):
            if not markers:
                markers.append(f"\x1f{secrets.token_hex(8)}")
            blobs.append(base64.b64encode(value.raw))
            return markers[0]
        raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")

    written = orjson.dumps(obj, default=default, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return written
    parts = written.split(orjson.dumps(markers[0]))
    assert len(parts) == len(blobs) + 1, "a marker's count differs from the base64 values'"
    pieces = [parts[0]]
    for blob, after in zip(blobs, parts[1:], strict=True):
        pieces += (b'"', blob, b'"', after)
    return b"".join(pieces)


def parse_options(model: type[Options], payload: dict[str, Any]) -> Options:
    """Validate the small fields of a body; the first problem as InvalidInput on its field."""
    try:
        return model.model_validate(payload, strict=True)  # "yes" is no boolean, "0" no index
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InvalidInput(str(err["msg"]), field=tuple(err["loc"]) or None) from None


def numbers(data: Any) -> np.ndarray | None:
    """Nested JSON numbers as a numpy array; None if ragged, not numbers, or holding a
    boolean (numpy would read ``true`` as 1.0 among numbers)."""
    try:
        array = np.asarray(data)
    except (ValueError, TypeError):
        return None
    if array.dtype.kind not in "fiu" or _holds_bool(data):
        return None
    return array


def float32_numbers(data: Any) -> np.ndarray | None:
    """``numbers(data)`` as float32: a list of rows of JSON numbers is converted once,
    each float64 rounded straight to float32 (the same bits as through a float64 array,
    without that array: 1.6 against 1.9 ms per [128, 384] item); anything else (ragged,
    another rank, strings, booleans) goes through ``numbers``. Beyond float32 is inf."""
    rows = type(data) is list and data and all(type(row) is list for row in data)
    if rows and all(_NUMBER_TYPES.issuperset(map(type, row)) for row in data):
        try:
            with np.errstate(over="ignore"):
                return np.array(data, dtype=np.float32)
        except (ValueError, OverflowError):  # ragged rows; an int beyond float64
            pass
    parsed = numbers(data)
    if parsed is None:
        return None
    with np.errstate(over="ignore"):
        return parsed.astype(np.float32)


_NUMBER_TYPES = frozenset((float, int))  # bool is a type of its own, so not among them


def _holds_bool(value: Any) -> bool:
    if isinstance(value, list):
        if value and isinstance(value[0], list):
            return any(_holds_bool(item) for item in value)
        return bool in map(type, value)  # type by type in C: ~2 ms for 512 x 384
    return isinstance(value, bool)


def little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` contiguous in its own type, little-endian (base64 and binary answers)."""
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def float32_le(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=FLOAT32_LE)


def base64_float32(array: np.ndarray) -> str | Base64:
    """``base64_value`` of the array's little-endian float32 bytes, row-major."""
    return base64_value(float32_le(array).tobytes())


def base64_value(raw: bytes) -> str | Base64:
    """``raw`` as the base64 string ``dumps`` writes: a ``str`` below ``SPLICED_BYTES``
    (there the join in ``dumps`` costs more than it saves: ~4 us more for a [16, 384]
    answer), else a ``Base64``."""
    if len(raw) < SPLICED_BYTES:
        return base64.b64encode(raw).decode("ascii")
    return Base64(raw)


class Base64:
    """Bytes that ``dumps`` writes as a standard base64 JSON string, straight into the
    answer: no ``str`` is made of them and orjson never scans them (see ``dumps``)."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


class LazyItems(Sequence[T]):
    """A request's list, each item converted when the engine reads it.

    The engine checks the count first, so a body of a million tiny items is refused
    before a million domain objects are built.
    """

    def __init__(self, raw: list[Any], convert: Callable[[int, Any], T]) -> None:
        self._raw, self._convert = raw, convert

    def __len__(self) -> int:
        return len(self._raw)

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        return self._convert(index, self._raw[index])
