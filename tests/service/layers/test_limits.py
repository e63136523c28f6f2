"""``service.engine.limits``: counts, lengths, arrays and the answer-size estimate.

The estimate is checked against real answers: requests run through the real
engine (prepare -> batcher -> onnxruntime -> finish) and the native codec
writes the bytes a client would get.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest

from model_export.config import EncoderConfig
from service.engine import ArrayInput, AttentionSpec, EncodeRequest, Engine, limits
from service.engine.types import AnswerShape, Pooling, Reduce, WireCost
from service.errors import InvalidInput, PayloadTooLarge, SequenceTooLong
from service.model_info import ModelInfo, read_model_info
from service.protocols import wire
from service.protocols.native import codec
from service.settings import Settings
from tests.service.layers.conftest import layer_settings, with_started_engine
from tests.support.inputs import sequences
from tests.support.tiny import D_MODEL, MODEL_MAX_SEQ_LEN, N_HEADS, N_LAYERS

# -- counts and lengths -------------------------------------------------------------------


def test_sequence_count_limit_is_inclusive(model_repository: Path) -> None:
    settings = layer_settings(model_repository, max_sequences=4, max_pooled_sequences=6)
    limits.check_sequence_count(4, settings, pooled_only=False)
    with pytest.raises(PayloadTooLarge) as info:
        limits.check_sequence_count(5, settings, pooled_only=False)
    assert type(info.value) is PayloadTooLarge
    assert "5 sequences" in info.value.message and "limit is 4" in info.value.message
    assert "6 when only pooled vectors are asked for" in info.value.message
    limits.check_sequence_count(6, settings, pooled_only=True)  # a small answer: more
    with pytest.raises(PayloadTooLarge) as info:
        limits.check_sequence_count(7, settings, pooled_only=True)
    assert "limit is 6" in info.value.message


def test_lengths_at_the_model_limit_pass(tiny_info: ModelInfo, settings: Settings) -> None:
    assert tiny_info.max_seq_len == MODEL_MAX_SEQ_LEN
    limits.check_lengths([MODEL_MAX_SEQ_LEN, 1, None], tiny_info, settings, "inputs")


@pytest.mark.parametrize("field", ["inputs", "texts"])
def test_one_token_beyond_the_model_names_the_sequence(
    tiny_info: ModelInfo, settings: Settings, field: str
) -> None:
    lengths: list[int | None] = [3, None, MODEL_MAX_SEQ_LEN + 1, 5]
    with pytest.raises(SequenceTooLong) as info:
        limits.check_lengths(lengths, tiny_info, settings, field)
    assert info.value.field == (field, 2)
    assert f"{MODEL_MAX_SEQ_LEN + 1} tokens" in info.value.message


def test_server_max_seq_len_caps_the_model(tiny_model_dir: Path, model_repository: Path) -> None:
    capped = layer_settings(model_repository, max_seq_len=16)
    info = read_model_info(tiny_model_dir, capped)
    assert info.max_seq_len == 16
    limits.check_lengths([16], info, capped, "inputs")
    with pytest.raises(SequenceTooLong) as exc:
        limits.check_lengths([16, 17], info, capped, "inputs")
    assert exc.value.field == ("inputs", 1)


def test_total_tokens_limit_is_inclusive(tiny_info: ModelInfo, model_repository: Path) -> None:
    settings = layer_settings(model_repository, max_tokens=200)
    limits.check_lengths([100, None, 100], tiny_info, settings, "inputs")  # unknown: not counted
    with pytest.raises(PayloadTooLarge) as info:
        limits.check_lengths([100, 101], tiny_info, settings, "inputs")
    assert type(info.value) is PayloadTooLarge  # the sum, not one sequence
    assert info.value.field is None
    assert "201 tokens" in info.value.message


# -- arrays -------------------------------------------------------------------------------

WHERE = ("inputs", 7)


def _with(value: float) -> np.ndarray:
    array = np.ones((3, D_MODEL), dtype=np.float32)
    array[1, 5] = value
    return array


@pytest.mark.parametrize(
    ("array", "words"),
    [
        (np.ones(D_MODEL, dtype=np.float32), "rank 2"),
        (np.ones((1, 2, D_MODEL), dtype=np.float32), "rank 2"),
        (np.ones((0, D_MODEL), dtype=np.float32), "empty"),
        (np.ones((3, D_MODEL - 1), dtype=np.float32), "width"),
        (np.ones((3, D_MODEL + 1), dtype=np.float32), "width"),
        (_with(np.nan), "NaN"),
        (_with(np.inf), "NaN or Inf"),
        (_with(-np.inf), "NaN or Inf"),
    ],
    ids=["rank1", "rank3", "empty", "narrow", "wide", "nan", "inf", "-inf"],
)
def test_check_array_rejects_with_the_field(array: np.ndarray, words: str) -> None:
    with pytest.raises(InvalidInput) as info:
        limits.check_array(array, WHERE, D_MODEL)
    assert info.value.field == WHERE
    assert words in info.value.message


def test_check_array_passes_a_good_array_through() -> None:
    array = _with(float(np.finfo(np.float32).max))  # large but finite
    assert limits.check_array(array, WHERE, D_MODEL) is array


# -- the answer-size estimate -------------------------------------------------------------


def test_answer_shape_counts_compact_attention() -> None:
    """Rows cut to k keys hold k values and k indices; summaries [L', H'] (or per token)."""
    shape = limits.answer_shape(
        [3, 5],
        D_MODEL,
        attention=(2, 4),
        embeddings=False,
        pooled_width=None,
        attention_keys=[2, 3],
        summaries=(3, 2, 4),
    )
    assert shape.arrays == [(2, 4, 3, 2)] * 2 + [(2, 4)] * 3 + [(2, 4, 5, 3)] * 2 + [(2, 4)] * 3
    assert shape.attention_floats == 2 * 8 * (3 * 2 + 5 * 3) + 2 * 3 * 8
    per_token = limits.answer_shape(
        [3], D_MODEL, attention=None, embeddings=False, pooled_width=None,
        summaries=(2, 2, 4), summaries_per_token=True,
    )  # fmt: skip
    assert per_token.arrays == [(2, 4, 3)] * 2
    half = limits.answer_shape(
        [3], D_MODEL, attention=(2, 4), embeddings=False, pooled_width=None,
        attention_keys=[2], half_maps=True,
    )  # fmt: skip
    assert half.half_floats == 2 * 4 * 3 * 2  # the values; their int32 keys are not
    binary = WireCost(per_float=4.0, per_half=2.0)
    assert binary.bytes(half, "") == 4.0 * half.floats - 2.0 * half.half_floats


def test_work_bytes_price_the_compact_graph_by_what_it_holds(tiny_config: EncoderConfig) -> None:
    """The compact graph keeps 2k + 6 numbers per row, not n: far below the full maps'
    n per row at length, and sorting full maps in numpy counts its scratch."""
    cfg = tiny_config
    empty = limits.answer_shape([512], D_MODEL, attention=None, embeddings=False, pooled_width=None)
    full = limits.work_bytes([512], cfg, True, False, empty, 0.0)
    compact = limits.work_bytes([512], cfg, True, False, empty, 0.0, compact_keys=8)
    sorted_full = limits.work_bytes([512], cfg, True, False, empty, 0.0, sorts_maps=True)
    rows = cfg.n_layers * cfg.n_heads * 512
    assert compact - limits.work_bytes([512], cfg, False, False, empty, 0.0) == 4 * rows * 22
    assert full - compact == 4 * (rows * (512 - 22) + (cfg.n_layers + 1) * 512 * cfg.d_model)
    assert sorted_full - full == 4 * 2 * rows * 512


def test_work_bytes_price_the_selected_graph_by_what_it_holds(tiny_config: EncoderConfig) -> None:
    """The selected-maps graph returns its maps only (a float16 one counts half), no
    hidden states: one map of the full graph's L · H, and nothing for the L + 1 states."""
    cfg = tiny_config
    empty = limits.answer_shape([512], D_MODEL, attention=None, embeddings=False, pooled_width=None)
    plain = limits.work_bytes([512], cfg, False, False, empty, 0.0)
    one = limits.work_bytes([512], cfg, True, False, empty, 0.0, selected_maps=1.0)
    half = limits.work_bytes([512], cfg, True, False, empty, 0.0, selected_maps=0.5)
    assert one - plain == 4 * 512 * 512 and half - plain == 2 * 512 * 512


def test_answer_shape_counts_each_part() -> None:
    shape = limits.answer_shape(
        [3, 5],
        D_MODEL,
        attention=(2, 1),
        embeddings=True,
        pooled_width=16,
        tokens=[["[CLS]", "hi", "[SEP]"], None],
    )
    assert shape.arrays == [(3, D_MODEL), (2, 1, 3, 3), (16,), (5, D_MODEL), (2, 1, 5, 5), (16,)]
    assert shape.attention_floats == 2 * (3 * 3 + 5 * 5)
    assert shape.floats == (3 + 5) * D_MODEL + shape.attention_floats + 2 * 16
    assert shape.rows == 3 + 2 * 3 + 1 + 5 + 2 * 5 + 1
    assert (shape.token_strings, shape.token_chars) == (3, 12)
    empty = limits.answer_shape(
        [3, 5], D_MODEL, attention=None, embeddings=False, pooled_width=None
    )
    assert (empty.floats, empty.arrays, empty.sequences) == (0, [], 2)


@pytest.mark.parametrize(
    ("reduce", "maps"),
    [("none", (2, 3)), ("mean", (2, 1)), ("max", (2, 1)), ("rollout", (1, 1))],
)
def test_attention_maps_per_sequence(reduce: Reduce, maps: tuple[int, int]) -> None:
    assert limits.attention_maps(AttentionSpec(reduce=reduce), 2, 3) == maps


def test_response_size_limit_is_inclusive(model_repository: Path) -> None:
    settings = layer_settings(model_repository, max_response_bytes=1024)
    cost = WireCost(per_float=2.0)
    assert limits.check_response_size(AnswerShape([(512,)], 1), cost, "", settings) == 1024.0
    with pytest.raises(PayloadTooLarge) as plain:
        limits.check_response_size(AnswerShape([(513,)], 1), cost, "", settings)
    assert "attention layers" not in plain.value.message  # no attention asked: no attention hint
    with pytest.raises(PayloadTooLarge) as attention:
        shape = AnswerShape([(113,), (1, 1, 20, 20)], 1, attention_floats=400)
        limits.check_response_size(shape, cost, "", settings)
    assert "attention layers" in attention.value.message


@dataclass(frozen=True)
class Shape:
    """One request shape whose real answer is measured against the engine's estimate."""

    fmt: str  # native encoding_format: "float" or "base64"
    lengths: tuple[int, ...]
    reduce: Reduce | None  # None: no attention
    pooling: Pooling = "none"
    embeddings: bool = True
    compact: tuple[tuple[str, object], ...] = ()  # AttentionSpec's compact options

    @property
    def arrays(self) -> int:
        """Arrays in the answer: per sequence embeddings, attention and pooled, as asked."""
        per_sequence = self.embeddings + (self.reduce is not None) + (self.pooling != "none")
        return per_sequence * len(self.lengths)


@dataclass(frozen=True)
class Measured:
    real: int  # bytes the native codec wrote
    estimate: float  # PreparedEncode.response_bytes


RAGGED = (3, 17, 40)
SUMMARIES = ("entropy", "first", "self", "previous", "next", "distance")
FULL = (MODEL_MAX_SEQ_LEN,) * 8

SHAPES = {
    "float-embeddings-64": Shape("float", (64,), None),
    "float-embeddings-8x128": Shape("float", FULL, None),
    "float-attention-none-ragged": Shape("float", RAGGED, "none"),
    "float-attention-mean-pooled": Shape("float", (MODEL_MAX_SEQ_LEN,), "mean", "mean"),
    "float-rollout-cls-only": Shape("float", (5, 17, 128), "rollout", "cls", embeddings=False),
    "float-pooled-only-1": Shape("float", (1,), None, "mean", embeddings=False),
    "float-pooled-only-8": Shape("float", (1, 2, 3, 4, 5, 6, 7, 8), None, "mean", embeddings=False),
    "float-attention-1-token": Shape("float", (1,), "none"),
    "base64-embeddings-128": Shape("base64", (MODEL_MAX_SEQ_LEN,), None),
    "base64-embeddings-8x128": Shape("base64", FULL, None),
    "base64-attention-none-ragged": Shape("base64", RAGGED, "none"),
    "base64-rollout-mean": Shape("base64", RAGGED, "rollout", "mean"),
    "base64-pooled-only-1": Shape("base64", (1,), None, "cls", embeddings=False),
    # Compact attention: top-k, thresholds, float16 and summaries (attention_answer.py).
    "float-top-k-ragged": Shape("float", RAGGED, "none", compact=(("top_k", 3),)),
    "base64-float16-maps-full": Shape("base64", FULL, "none", compact=(("dtype", "float16"),)),
    "base64-threshold-ragged": Shape("base64", RAGGED, "none", compact=(("threshold", 0.05),)),
    "base64-top-k-of-mean-float16": Shape(
        "base64", RAGGED, "mean", compact=(("top_k", 2), ("dtype", "float16"))
    ),
    "float-summaries-per-token-only": Shape(
        "float",
        RAGGED,
        "none",
        embeddings=False,
        compact=(("maps", False), ("summaries", SUMMARIES), ("summaries_per_token", True)),
    ),
    "base64-top-k-and-summaries": Shape(
        "base64", FULL, "none", compact=(("top_k", 8), ("summaries", SUMMARIES))
    ),
    # The selected-maps graph: one layer and head; fewer heads in float16.
    "base64-one-layer-head": Shape(
        "base64", FULL, "none", compact=(("layers", [-1]), ("heads", [1]))
    ),
    "float-heads-float16-ragged": Shape(
        "float", RAGGED, "none", compact=(("heads", [1, 0]), ("dtype", "float16"))
    ),
}

# Tightness, measured on this model (float32 LayerNorm outputs ~N(0, 1) and softmax
# weights): JSON floats cost 11..12.5 bytes each against the bound's 17 (+ 12 per row of
# 32), so the estimate is ~1.4..1.6x the real answer; 2x leaves margin and still catches
# a doubled count.
FLOAT_SLACK = 2.0
# base64 is exact per float; with >= 10k floats the wrappers are < 1% of the answer.
# 1.05x still catches an array or attention map counted twice.
BASE64_SLACK = 1.05
LARGE = 10_000  # floats: the threshold of "large" above


@pytest.fixture(scope="module")
def measured(settings: Settings) -> dict[str, Measured]:
    """Every shape run once through the started engine and written by the native codec."""

    async def measure(engine: Engine) -> dict[str, Measured]:
        out = {}
        for seed, (name, shape) in enumerate(SHAPES.items()):
            arrays = sequences(shape.lengths, seed=seed)
            request = EncodeRequest(
                inputs=[ArrayInput(len(a), lambda a=a: a) for a in arrays],
                wire_cost=codec.ENCODE_COST[shape.fmt],
                return_attention=shape.reduce is not None,
                attention=AttentionSpec(reduce=shape.reduce or "none", **dict(shape.compact)),
                pooling=shape.pooling,
                normalize=shape.pooling != "none",
                return_embeddings=shape.embeddings,
            )
            prepared = engine.prepare(request)
            result = await engine.run(prepared)
            body = codec.encode_response(result, shape.fmt)
            assert result.response_bytes == prepared.response_bytes
            out[name] = Measured(len(body), prepared.response_bytes)
        return out

    return with_started_engine(settings, measure)


@pytest.mark.parametrize("name", list(SHAPES))
def test_estimate_is_an_upper_bound_of_the_real_answer(
    measured: dict[str, Measured], name: str
) -> None:
    m = measured[name]
    assert m.real <= m.estimate, f"{m.real} bytes written, {m.estimate:.0f} estimated"


def _large(shape: Shape) -> bool:
    """At least LARGE floats in the answer: there the arrays dominate."""
    answer = limits.answer_shape(
        list(shape.lengths),
        D_MODEL,
        attention=None
        if shape.reduce is None
        else limits.attention_maps(AttentionSpec(reduce=shape.reduce), N_LAYERS, N_HEADS),
        embeddings=shape.embeddings,
        pooled_width=None if shape.pooling == "none" else D_MODEL,
    )
    return answer.floats >= LARGE


# Cut rows and summaries are bounded by what rows keep at most (a threshold's 1/t): an
# upper bound, loose by design. float16 maps are priced at their 2 bytes: held to it.
@pytest.mark.parametrize(
    "name", [n for n, s in SHAPES.items() if _large(s) and set(dict(s.compact)) <= {"dtype"}]
)
def test_estimate_is_not_absurdly_loose(measured: dict[str, Measured], name: str) -> None:
    shape, m = SHAPES[name], measured[name]
    slack = FLOAT_SLACK if shape.fmt == "float" else BASE64_SLACK
    assert m.estimate <= slack * m.real, f"{m.estimate:.0f} estimated, {m.real} bytes written"


def test_json_float_bytes_bounds_every_float32() -> None:
    """orjson writes some float32 values in 16 characters: 17 bytes with the separator."""
    values = np.array([-6.3184107e-06, 1.1754944e-38, -3.4028235e38], dtype=np.float32)
    for value in values:
        written = wire.dumps(codec.encode_array(value[None], "float"))  # "[...]"
        assert len(written) - 2 + 1 <= wire.JSON_ARRAYS["per_float"], written  # + separator
    parsed = np.array(orjson.loads(wire.dumps(codec.encode_array(values, "float"))), np.float32)
    np.testing.assert_array_equal(parsed, values)  # shortest repr: exact back in float32
