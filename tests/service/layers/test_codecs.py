"""Codecs: native arrays (base64 and nested floats), ``wire.base64_float32`` and OpenAI inputs.

Round trips are bit-exact (tolerance 0): base64 carries the float32 bytes
themselves, and a float32 written as its shortest JSON decimal parses back
to the same float32. Errors name the offending item as ``("inputs", i)``.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from service.engine import ArrayInput, EncodeRequest, TokenIds
from service.errors import InvalidInput
from service.protocols import wire
from service.protocols.native import codec
from service.protocols.openai import codec as openai_codec
from service.protocols.openai.codec import embeddings_request
from tests.support.tiny import D_MODEL, MODEL

# derandomize and no database: the same examples every run, nothing written to disk.
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None)

# Rank-2 [rows, width] shapes as the native codec accepts them (empty rows included: the
# codec decodes them, the engine's limits refuse them).
MATRIX_SHAPES = hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=6)
# Every float32 bit pattern: NaN payloads, infinities, -0.0, subnormals, extremes.
ANY_BITS = hnp.arrays(np.uint32, MATRIX_SHAPES).map(lambda a: a.view(np.float32))
# hypothesis' own float32 strategy favours the edge values (-0.0, subnormals, max, min).
FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
FINITE = hnp.arrays(np.float32, MATRIX_SHAPES, elements=FLOAT32)
EDGES = np.array(
    [[-0.0, 0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754944e-38], [3.4028235e38, -3.4028235e38,
     1.0, -1.0, 1 / 3, 6.3184107e-06]],
    dtype=np.float32,
)  # fmt: skip


def bits(array: np.ndarray) -> np.ndarray:
    """The float32 bit patterns: equality of these is bit-exact (and -0.0 != 0.0)."""
    return np.ascontiguousarray(array, dtype="<f4").view("<u4")


def native_items(inputs: list[Any]) -> EncodeRequest:
    request, encoding_format = codec.encode_request(orjson.dumps({"inputs": inputs}))
    assert encoding_format == "float"
    return request


def decode_one(wire_item: Any) -> np.ndarray:
    item = native_items([wire_item]).inputs[0]
    assert isinstance(item, ArrayInput)
    decoded = item.decode()
    assert decoded.dtype == np.float32
    return decoded


# -- native: base64 arrays ----------------------------------------------------------------


@PROPERTY
@given(array=st.one_of(ANY_BITS, FINITE))
@example(array=EDGES)
def test_base64_array_round_trip_is_bit_exact(array: np.ndarray) -> None:
    wire_item = written(codec.encode_array(array, "base64"))
    assert wire_item["shape"] == list(array.shape) and wire_item["dtype"] == "float32"
    item = native_items([wire_item]).inputs[0]
    assert isinstance(item, ArrayInput)
    assert item.rows == array.shape[0]  # declared before decoding, for the early limits
    decoded = item.decode()
    assert decoded.dtype == np.float32 and decoded.shape == array.shape
    np.testing.assert_array_equal(bits(decoded), bits(array))


def test_base64_input_without_dtype_is_float32() -> None:
    array = EDGES
    wire_item = {"shape": list(array.shape), "data": written(wire.base64_float32(array))}
    np.testing.assert_array_equal(bits(decode_one(wire_item)), bits(array))


# -- native: nested float lists ----------------------------------------------------------


@PROPERTY
@given(array=FINITE)
@example(array=EDGES)
def test_nested_float_input_of_float32_values_is_exact(array: np.ndarray) -> None:
    """float32 values written as JSON (their exact float64 repr) decode to the same bits."""
    nested = array.tolist()
    decoded = decode_one(nested)
    assert decoded.shape == array.shape or array.shape[0] == 0  # [] has no width to keep
    if array.shape[0]:
        np.testing.assert_array_equal(bits(decoded), bits(array))


@PROPERTY
@given(array=FINITE)
@example(array=EDGES)
def test_float_answer_parses_back_to_the_same_float32(array: np.ndarray) -> None:
    """The answer path: orjson writes float32 shortest decimals; parsed as float32 they are
    the same bits (tolerance 0; checked on 8M random bit patterns while writing this test)."""
    written = wire.dumps({"x": codec.encode_array(array, "float")})
    parsed = np.asarray(orjson.loads(written)["x"], dtype=np.float32).reshape(array.shape)
    np.testing.assert_array_equal(bits(parsed), bits(array))


def test_integer_lists_are_numbers_and_overflow_becomes_inf() -> None:
    np.testing.assert_array_equal(decode_one([[1, -2], [3, 4]]), [[1, -2], [3, 4]])
    decoded = decode_one([[1e39, -1e39]])  # beyond float32: inf, which check_array refuses
    assert np.isposinf(decoded[0, 0]) and np.isneginf(decoded[0, 1])


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def written(value: Any) -> Any:
    """``value`` as an answer writes it and a client reads it back (JSON bytes, parsed)."""
    return orjson.loads(wire.dumps(value))


GOOD = written(codec.encode_array(np.ones((2, D_MODEL), dtype=np.float32), "base64"))
BAD_ITEMS = {
    "not-base64": {"shape": [1, 1], "data": "!!!!"},
    "bad-padding": {"shape": [1, 1], "data": "AAAAAA"},
    "too-few-bytes": {"shape": [1, 1], "data": _b64(b"\0\0\0")},
    "too-many-bytes": {"shape": [1, 1], "data": _b64(b"\0" * 8)},
    "bytes-for-another-shape": {"shape": [2, D_MODEL], "data": GOOD["data"][:-8]},
    "float64": {"shape": [1, 1], "data": _b64(b"\0" * 8), "dtype": "float64"},
    "dtype-none": {"shape": [1, 1], "data": _b64(b"\0" * 4), "dtype": None},
    "rank-1-shape": {"shape": [4], "data": _b64(b"\0" * 16)},
    "negative-shape": {"shape": [1, -1], "data": ""},
    "bool-shape": {"shape": [True, 1], "data": _b64(b"\0" * 4)},
    "shape-not-list": {"shape": "1x1", "data": _b64(b"\0" * 4)},
    "data-not-string": {"shape": [1, 1], "data": 0},
    "unknown-key": {"shape": [1, 1], "data": _b64(b"\0" * 4), "order": "C"},
    "strings": [["a", "b"]],
    "booleans": [[True, False]],
    "ragged": [[1.0], [1.0, 2.0]],
    "number": 5,
    "null": None,
}


@pytest.mark.parametrize("bad", list(BAD_ITEMS.values()), ids=list(BAD_ITEMS))
@pytest.mark.parametrize("index", [0, 2])
def test_bad_array_is_invalid_input_naming_its_index(bad: Any, index: int) -> None:
    inputs: list[Any] = [GOOD, GOOD, GOOD]
    inputs[index] = bad
    request = native_items(inputs)  # parsing reads no item...
    for i in range(len(request.inputs)):
        if i == index:
            with pytest.raises(InvalidInput) as info:
                item = request.inputs[i]  # ...reading one checks its form (cheap)...
                item.decode()  # ...or decoding it does (a nested list's numbers)
            assert info.value.field == ("inputs", index)
        else:
            item = request.inputs[i]
            assert isinstance(item, ArrayInput) and item.decode().shape == (2, D_MODEL)


@pytest.mark.parametrize(
    ("wire_item", "rows"),
    [
        ([[0.0] * D_MODEL] * 3, 3),
        ({"shape": [5, D_MODEL], "data": ""}, 5),
        (7, None),  # not an array: found out on decode
    ],
)
def test_declared_rows_are_read_without_decoding(wire_item: Any, rows: int | None) -> None:
    item = native_items([wire_item]).inputs[0]
    assert isinstance(item, ArrayInput) and item.rows == rows


@pytest.mark.parametrize("shape", [[True, D_MODEL], "5", [], [5]])
def test_a_malformed_base64_object_is_refused_when_read_before_any_length(shape: Any) -> None:
    """Its form is checked when the engine reads the item, before lengths are judged: a
    wrong dtype with a huge shape is a 422, not a 413 about its length."""
    items = native_items([{"shape": shape, "data": ""}]).inputs
    with pytest.raises(InvalidInput) as info:
        items[0]
    assert info.value.field == ("inputs", 0)
    huge = native_items([{"shape": [10**9, D_MODEL], "data": "", "dtype": "float16"}]).inputs
    with pytest.raises(InvalidInput, match="dtype"):
        huge[0]


def test_text_items_stay_texts() -> None:
    text, array = native_items(["a text", GOOD]).inputs
    assert text == "a text" and isinstance(array, ArrayInput)


# -- wire.base64_float32 -------------------------------------------------------------------

ANY_SHAPE = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)


@PROPERTY
@given(
    array=st.one_of(
        hnp.arrays(np.uint32, ANY_SHAPE).map(lambda a: a.view(np.float32)),
        hnp.arrays(np.dtype(">f4"), ANY_SHAPE),  # big-endian in: little-endian out
        hnp.arrays(np.float64, ANY_SHAPE),  # wider in: float32 out (may overflow to inf)
        hnp.arrays(np.float32, ANY_SHAPE).map(lambda a: a.T),  # not C-contiguous
    )
)
def test_base64_float32_is_little_endian_row_major(array: np.ndarray) -> None:
    with np.errstate(over="ignore"):  # float64 beyond float32 range: inf, on both sides
        raw = base64.b64decode(written(wire.base64_float32(array)), validate=True)
        expected = np.asarray(array, dtype=np.float32).ravel(order="C")
    decoded = np.frombuffer(raw, dtype="<f4")
    np.testing.assert_array_equal(bits(decoded), bits(expected))


# -- OpenAI: input -> engine inputs ------------------------------------------------------


def openai(value: Any, *, truncate: bool = False, **options: Any) -> EncodeRequest:
    body = orjson.dumps({"model": MODEL, "input": value, **options})
    request, _ = embeddings_request(body, truncate=truncate)
    return request


TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20)
IDS = st.lists(st.integers(-(2**31), 2**31), max_size=8)
OPENAI_INPUT = st.one_of(
    TEXT,
    st.lists(TEXT, min_size=1, max_size=8),
    IDS.filter(bool),
    st.lists(IDS, min_size=1, max_size=8),
)


def expected_items(value: Any) -> list[Any]:
    """What each OpenAI input form means, written out independently of the codec."""
    if isinstance(value, str):
        return [value]
    if all(isinstance(v, int) for v in value):
        return [TokenIds(value)]
    return [TokenIds(v) if isinstance(v, list) else v for v in value]


@PROPERTY
@given(value=OPENAI_INPUT)
@example(value="hello")
@example(value=["a", "b"])
@example(value=[101, 7592, 102])
@example(value=[[101, 102], [101, 7592, 102]])
@example(value=[[]])  # an empty id list reaches the engine, which names it
def test_openai_input_forms(value: Any) -> None:
    request = openai(value)
    assert list(request.inputs) == expected_items(value)
    assert len(request.inputs) == len(expected_items(value))


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
@pytest.mark.parametrize("truncate", [False, True])
def test_openai_request_options(encoding_format: str, truncate: bool) -> None:
    request = openai("x", truncate=truncate, encoding_format=encoding_format, dimensions=8)
    assert request.model == MODEL
    assert request.pooling == "model" and request.normalize
    assert not request.return_embeddings and not request.return_attention
    assert request.dimensions == 8 and request.truncate is truncate
    assert request.wire_cost == openai_codec.COST[encoding_format]


@pytest.mark.parametrize(
    ("value", "index"),
    [
        ("", 0),
        (["a", "", "b"], 1),  # empty string
        (["a", 1], 1),  # mixed: text then id
        ([1, "a"], 0),  # mixed: ids then text (one id list, not all ints)
        ([1, 2.0], 0),  # a float among ids
        ([1, True], 0),  # a bool is not an id
        ([True], 0),
        ([1.5], 0),
        ([[1, 2], [3, "4"]], 1),
        ([[1, 2], [3, 4.5]], 1),
        ([[1], [True]], 1),
        ([[1], 2], 1),  # an id where a list was due
        ([[1], None], 1),
        (["a", {"text": "b"}], 1),
    ],
)
def test_openai_rejects_bad_items_naming_them(value: Any, index: int) -> None:
    with pytest.raises(InvalidInput) as info:
        list(openai(value).inputs)  # either at parse time or on conversion of the item
    assert info.value.field == ("inputs", index)


@pytest.mark.parametrize("value", [None, 5, {"input": "x"}, True])
def test_openai_rejects_a_bad_input_field(value: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        openai(value)
    assert info.value.field == ("inputs",)


def test_openai_requires_input() -> None:
    with pytest.raises(InvalidInput) as info:
        embeddings_request(orjson.dumps({"model": MODEL}), truncate=False)
    assert info.value.field == ("inputs",)


@PROPERTY
@given(texts=st.lists(TEXT, min_size=1, max_size=8), data=st.data())
def test_openai_names_the_first_bad_item_of_a_text_list(texts: list[str], data: Any) -> None:
    position = data.draw(st.integers(1, len(texts)), label="position")
    bad = data.draw(st.sampled_from(["", 7, 1.5, None, [1, "x"]]), label="bad")
    value: list[Any] = [*texts[:position], bad, *texts[position:]]
    with pytest.raises(InvalidInput) as info:
        list(openai(value).inputs)
    assert info.value.field == ("inputs", position)


@PROPERTY
@given(ids=st.lists(IDS, min_size=1, max_size=8), data=st.data())
def test_openai_names_the_bad_id_list(ids: list[list[int]], data: Any) -> None:
    row = data.draw(st.integers(0, len(ids) - 1), label="row")
    bad = data.draw(st.sampled_from(["1", 1.0, True, None, [1]]), label="bad")
    value = [list(r) for r in ids]
    value[row].insert(data.draw(st.integers(0, len(value[row])), label="at"), bad)
    with pytest.raises(InvalidInput) as info:
        list(openai(value).inputs)
    assert info.value.field == ("inputs", row)


# -- wire.float32_numbers ------------------------------------------------------------------


def _through_float64(data: Any) -> np.ndarray | None:
    """The reading ``float32_numbers`` replaces: a float64 array, then float32."""
    parsed = wire.numbers(data)
    if parsed is None:
        return None
    with np.errstate(over="ignore"):
        return parsed.astype(np.float32)


@PROPERTY
@given(array=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=6)))
def test_float32_numbers_are_the_bits_read_through_float64(array: np.ndarray) -> None:
    """Any float64 (inf and nan too, which JSON cannot carry but Python lists can), each
    rounded once to float32 either way: tolerance 0."""
    got, want = wire.float32_numbers(array.tolist()), _through_float64(array.tolist())
    assert got is not None and want is not None and got.dtype == np.float32
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize(
    "data",
    [
        [[1, -2], [3, 4]],
        [[1e39, -1e39, 3.5]],
        [[10**400]],  # beyond float64: no number
        [[1.0, 2.0], [3.0]],  # ragged
        [[1.0, True]],
        [[1.0, "2"]],
        [[1.0, None]],
        [[[1.0], [2.0]]],  # another rank
        [1.0, 2.0],
        [],
        [[]],
        2.5,  # a scalar: numbers' answer, not a TypeError
        "12",
    ],
)
def test_float32_numbers_take_and_refuse_what_numbers_does(data: Any) -> None:
    got, want = wire.float32_numbers(data), _through_float64(data)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(bits(got), bits(want))


# -- wire.dumps: base64 joined into the answer ---------------------------------------------


def test_dumps_joins_base64_as_the_str_writer_would() -> None:
    """Large arrays (64 KiB and more) are joined as bytes, small ones written as str;
    strings that look like the marker (a control character, then hex) stay strings."""
    big = np.arange(wire.SPLICED_BYTES // 4 + 3, dtype=np.float32)
    small = np.arange(5, dtype=np.float32)
    answer: dict[str, Any] = {
        "\x1f00": "\x1f0123456789abcdef",
        "a": [wire.base64_float32(big), wire.base64_float32(small), "\x1f"],
        "b": {"c": wire.base64_float32(big[::-1]), "d": np.ones(2, np.float32)},
    }
    as_str = {
        "\x1f00": "\x1f0123456789abcdef",
        "a": [_b64(big.tobytes()), _b64(small.tobytes()), "\x1f"],
        "b": {"c": _b64(big[::-1].tobytes()), "d": np.ones(2, np.float32)},
    }
    assert isinstance(answer["a"][0], wire.Base64) and isinstance(answer["a"][1], str)
    assert wire.dumps(answer) == orjson.dumps(as_str, option=orjson.OPT_SERIALIZE_NUMPY)
    with pytest.raises(TypeError):
        wire.dumps({"x": object()})
