"""The Engine in-process on the real runtime: models, limits before decoding, numerics,
what tiny cannot do, and dropping the work of a caller that went away.

Tolerance: the engine runs the same ONNX graphs as a direct onnxruntime session,
padded differently by the batcher, so outputs match to float32 noise: ATOL_ORT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import onnxruntime as ort
import pytest

from service.engine import (
    ArrayInput,
    AttentionSpec,
    EncodeRequest,
    EncodeResult,
    Engine,
    InputItem,
    TokenIds,
    TokenizeRequest,
)
from service.errors import (
    ClientClosedRequest,
    InvalidInput,
    ModelNotFound,
    NotReady,
    PayloadTooLarge,
    SequenceTooLong,
    UnsupportedByModel,
)
from service.metrics import Metrics
from service.protocols.native.codec import ENCODE_COST
from service.runtime import ModelRuntime
from service.settings import Settings
from tests.service.helpers import (
    D_MODEL,
    MODEL,
    MODEL_MAX_SEQ_LEN,
    N_HEADS,
    N_LAYERS,
    ort_encode,
    sequences,
)
from tests.service.layers.conftest import layer_settings, loaded_engine, with_started_engine

COST = ENCODE_COST["float"]

ATOL_ORT = 1e-5  # same graph, possibly other padding: float32 noise (observed: identical)
ATOL_UNIT = 1e-6  # norm of a normalised float32 vector

RAGGED = (9, 4, 1, 17)


def arrays(seqs: list[np.ndarray]) -> list[InputItem]:
    return [ArrayInput(len(s), lambda s=s: s) for s in seqs]


def request_of(inputs: Sequence[InputItem], **options: Any) -> EncodeRequest:
    return EncodeRequest(inputs=inputs, wire_cost=COST, **options)


def never_decoded(rows: int | None) -> ArrayInput:
    """An array whose decoding fails the test: the engine must refuse before reading it."""

    def decode() -> np.ndarray:
        raise AssertionError("decoded although a limit had already failed")

    return ArrayInput(rows, decode)


class Unreadable(Sequence[InputItem]):
    """A long list whose items must not be read: only its length may be."""

    def __init__(self, length: int) -> None:
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> InputItem: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[InputItem]: ...
    def __getitem__(self, index: int | slice) -> InputItem | Sequence[InputItem]:
        raise AssertionError("an item was read before the count was checked")


# -- models -------------------------------------------------------------------------------


def test_default_model_resolves(engine: Engine, runtimes: dict[str, ModelRuntime]) -> None:
    assert engine.model(None) is runtimes[MODEL].info
    assert engine.model(MODEL) is runtimes[MODEL].info
    assert [m.name for m in engine.models()] == [MODEL]


def test_unknown_model_is_model_not_found(engine: Engine) -> None:
    with pytest.raises(ModelNotFound) as info:
        engine.model("no-such-model")
    assert info.value.field == ("model",)
    assert MODEL in info.value.message  # names what is served
    with pytest.raises(ModelNotFound) as info:
        engine.prepare(request_of([never_decoded(1)], model="no-such-model"))
    assert info.value.field == ("model",)


def test_engine_without_models_is_not_ready(settings: Settings) -> None:
    engine = Engine(settings, Metrics())
    with pytest.raises(NotReady):
        engine.model(None)
    with pytest.raises(NotReady):
        engine.require_ready()


# -- limits come before decoding ----------------------------------------------------------


def test_empty_inputs_are_refused(engine: Engine) -> None:
    with pytest.raises(InvalidInput) as info:
        engine.prepare(request_of([]))
    assert info.value.field == ("inputs",)


@pytest.fixture
def strict_engine(model_repository: Path, runtimes: dict[str, ModelRuntime]) -> Engine:
    """An engine with small limits: 3 sequences, 100 tokens."""
    return loaded_engine(
        layer_settings(model_repository, max_sequences=3, max_tokens=100), runtimes
    )


def test_count_is_checked_before_any_item_is_read(strict_engine: Engine) -> None:
    with pytest.raises(PayloadTooLarge) as info:
        strict_engine.prepare(request_of(Unreadable(1_000_000)))
    assert "1000000 sequences" in info.value.message
    with pytest.raises(PayloadTooLarge):
        strict_engine.prepare(request_of([never_decoded(1)] * 4))


def test_declared_length_beyond_the_model_is_refused_undecoded(strict_engine: Engine) -> None:
    inputs = [never_decoded(2), never_decoded(MODEL_MAX_SEQ_LEN + 1), never_decoded(2)]
    with pytest.raises(SequenceTooLong) as info:
        strict_engine.prepare(request_of(inputs))
    assert info.value.field == ("inputs", 1)


def test_declared_total_beyond_max_tokens_is_refused_undecoded(strict_engine: Engine) -> None:
    with pytest.raises(PayloadTooLarge) as info:
        strict_engine.prepare(request_of([never_decoded(60), never_decoded(41)]))
    assert type(info.value) is PayloadTooLarge and "101 tokens" in info.value.message


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"attention": AttentionSpec(layers=[N_LAYERS])}, ("attention", "layers")),
        ({"attention": AttentionSpec(heads=[-N_HEADS - 1])}, ("attention", "heads")),
        ({"normalize": True}, ("normalize",)),
        ({"pooling": "mean", "dimensions": 8}, ("dimensions",)),
    ],
)
def test_bad_options_are_refused_undecoded(
    engine: Engine, options: dict[str, Any], field: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidInput) as info:
        engine.prepare(request_of([never_decoded(3)], **options))
    assert info.value.field == field


def test_decoded_arrays_are_checked_with_their_index(engine: Engine) -> None:
    good, wide = np.ones((2, D_MODEL), np.float32), np.ones((2, D_MODEL + 1), np.float32)
    with pytest.raises(InvalidInput) as info:
        engine.prepare(request_of(arrays([good, wide])))
    assert info.value.field == ("inputs", 1)


@pytest.mark.parametrize("rows", [None, 1])
def test_decoded_length_is_checked_too(strict_engine: Engine, rows: int | None) -> None:
    """A protocol may not know (or misdeclare) a length before decoding: checked again after."""
    long = np.ones((MODEL_MAX_SEQ_LEN + 1, D_MODEL), np.float32)  # also beyond max_tokens
    with pytest.raises(PayloadTooLarge):
        strict_engine.prepare(request_of([ArrayInput(rows, lambda: long)]))


def test_response_size_is_refused_before_running(
    model_repository: Path, runtimes: dict[str, ModelRuntime]
) -> None:
    engine = loaded_engine(layer_settings(model_repository, max_response_bytes=4096), runtimes)
    (seq,) = sequences((MODEL_MAX_SEQ_LEN,), seed=1)
    with pytest.raises(PayloadTooLarge) as info:
        engine.prepare(request_of(arrays([seq]), return_attention=True))
    assert "attention" in info.value.message


# -- what tiny cannot do ------------------------------------------------------------------


@pytest.mark.parametrize("item", ["a text", TokenIds([1, 2, 3])], ids=["text", "token-ids"])
def test_text_and_token_ids_are_unsupported_by_tiny(engine: Engine, item: InputItem) -> None:
    (seq,) = sequences((3,), seed=0)
    with pytest.raises(UnsupportedByModel) as info:
        engine.prepare(request_of([*arrays([seq]), item]))
    assert "tokenizer" in info.value.message


def test_tokenize_is_unsupported_by_tiny(engine: Engine) -> None:
    with pytest.raises(UnsupportedByModel):
        engine.tokenize_now(TokenizeRequest(["a text"], COST))
    with pytest.raises(InvalidInput) as info:
        engine.tokenize_now(TokenizeRequest([], COST))
    assert info.value.field == ("texts",)


def test_dimensions_are_invalid_for_tiny(engine: Engine) -> None:
    """tiny's manifest declares no Matryoshka dimensions: any value is refused."""
    assert not engine.model(None).manifest.matryoshka_dimensions
    for dimensions in (1, 8, D_MODEL):
        request = request_of(arrays(sequences((2,), 0)), pooling="mean", dimensions=dimensions)
        with pytest.raises(InvalidInput) as info:
            engine.prepare(request)
        assert type(info.value) is InvalidInput and info.value.field == ("dimensions",)


def test_model_pooling_defaults_to_mean_for_tiny(engine: Engine) -> None:
    assert engine.model(None).manifest.pooling is None
    prepared = engine.prepare(request_of(arrays(sequences((2,), 0)), pooling="model"))
    assert prepared.pooling == "mean"


# -- numerics through the batcher ---------------------------------------------------------


def test_embeddings_match_a_direct_onnxruntime_run(
    settings: Settings, embeddings_session: ort.InferenceSession
) -> None:
    seqs = sequences(RAGGED, seed=21)

    async def body(engine: Engine) -> tuple[EncodeResult, str]:
        # The protocols' path: parse (here: a ready request) and prepare off the loop, run.
        return await engine.encode(lambda: (request_of(arrays(seqs)), "float"))

    result, wire_format = with_started_engine(settings, body)
    assert wire_format == "float" and result.model == MODEL
    assert result.tokens == sum(RAGGED)
    for out, (hidden, _), seq in zip(
        result.outputs, ort_encode(embeddings_session, seqs), seqs, strict=True
    ):
        assert out.length == len(seq) and out.tokens is None
        assert out.attention is None and out.pooled is None
        assert out.embeddings is not None and out.embeddings.shape == (len(seq), D_MODEL)
        np.testing.assert_allclose(out.embeddings, hidden, rtol=0, atol=ATOL_ORT)


def test_concurrent_requests_with_attention_and_pooling_match_onnxruntime(
    settings: Settings, attention_session: ort.InferenceSession
) -> None:
    """Three requests queued together (the batcher mixes and re-sorts their sequences)."""
    groups = [sequences(RAGGED, seed=31), sequences((5, 30), seed=32), sequences((2,), seed=33)]
    requests = [
        request_of(arrays(groups[0]), return_attention=True),
        request_of(arrays(groups[1]), return_attention=True, pooling="mean", normalize=True),
        request_of(arrays(groups[2]), pooling="max"),
    ]

    async def body(engine: Engine) -> list[EncodeResult]:
        prepared = [engine.prepare(r) for r in requests]
        return list(await asyncio.gather(*(engine.run(p) for p in prepared)))

    results = with_started_engine(settings, body)
    for request, seqs, result in zip(requests, groups, results, strict=True):
        expected = ort_encode(attention_session, seqs)
        for out, (hidden, attn) in zip(result.outputs, expected, strict=True):
            assert attn is not None
            if request.return_embeddings:
                assert out.embeddings is not None
                np.testing.assert_allclose(out.embeddings, hidden, rtol=0, atol=ATOL_ORT)
            if request.return_attention:
                assert out.attention is not None
                assert out.attention.shape == (N_LAYERS, N_HEADS, len(hidden), len(hidden))
                np.testing.assert_allclose(out.attention, attn, rtol=0, atol=ATOL_ORT)
            else:
                assert out.attention is None
            if request.pooling == "mean":
                vector = hidden.astype(np.float64).mean(axis=0)
                assert out.pooled is not None
                np.testing.assert_allclose(
                    out.pooled, vector / np.linalg.norm(vector), rtol=0, atol=ATOL_ORT
                )
                assert abs(float(np.linalg.norm(out.pooled)) - 1.0) <= ATOL_UNIT
            elif request.pooling == "max":
                assert out.pooled is not None
                np.testing.assert_allclose(out.pooled, hidden.max(axis=0), rtol=0, atol=ATOL_ORT)


def test_finish_refuses_non_finite_outputs(engine: Engine) -> None:
    seqs = sequences((3, 2), seed=4)
    prepared = engine.prepare(request_of(arrays(seqs)))
    hidden = [s.copy() for s in seqs]
    hidden[1][0, 0] = np.nan
    with pytest.raises(InvalidInput) as info:
        engine.finish(prepared, [(h, None) for h in hidden])
    assert info.value.field == ("inputs", 1)


# -- the caller going away ----------------------------------------------------------------


def test_until_returning_first_raises_client_closed_and_the_engine_serves_on(
    settings: Settings, embeddings_session: ort.InferenceSession
) -> None:
    seqs = sequences((6, 3), seed=41)

    async def gone() -> None:
        return None

    async def still_there() -> None:
        await asyncio.Event().wait()  # never set: the caller stays

    async def body(engine: Engine) -> EncodeResult:
        with pytest.raises(ClientClosedRequest):
            await engine.run(engine.prepare(request_of(arrays(seqs))), until=gone)
        return await engine.run(engine.prepare(request_of(arrays(seqs))), until=still_there)

    result = with_started_engine(settings, body)
    for out, (hidden, _) in zip(result.outputs, ort_encode(embeddings_session, seqs), strict=True):
        assert out.embeddings is not None
        np.testing.assert_allclose(out.embeddings, hidden, rtol=0, atol=ATOL_ORT)
