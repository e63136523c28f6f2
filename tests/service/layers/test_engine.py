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

from model_export import graph_io
from service.engine import (
    ENCODE,
    ArrayInput,
    AttentionSpec,
    EncodeRequest,
    EncodeResult,
    Engine,
    InputItem,
    TokenIds,
    TokenizeRequest,
)
from service.engine.finish import finish
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
from service.runtime import ModelRuntime, load_repository
from service.settings import Settings
from tests.service.layers.conftest import (
    layer_settings,
    loaded_engine,
    tokenize_texts,
    with_started_engine,
    work_scope,
)
from tests.support.inputs import sequences
from tests.support.onnx_runs import ort_encode, ort_outputs
from tests.support.tiny import D_MODEL, MODEL, MODEL_MAX_SEQ_LEN, N_HEADS, N_LAYERS

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


def test_a_request_its_protocol_resolved_runs_on_that_version(
    settings: Settings, runtimes: dict[str, ModelRuntime]
) -> None:
    """A protocol whose URL names the model resolves it before parsing (the Open Inference
    Protocol): the engine runs the request there, even if another version was swapped in
    meanwhile, and never resolves it a second time."""
    engine = loaded_engine(settings, runtimes)
    old = runtimes[MODEL]
    engine.registry.hold(old)
    newer = load_repository(settings, [MODEL])[MODEL]  # another load: what a swap serves
    engine.registry.hold(newer)
    engine.registry.runtimes = {MODEL: newer}
    (seq,) = sequences((3,), seed=0)
    resolved = request_of(arrays([seq]), model=MODEL, resolved=old.info)
    assert engine.prepare(resolved).runtime is old
    # The control: by name, the request goes to the version serving now.
    assert engine.prepare(request_of(arrays([seq]), model=MODEL)).runtime is newer


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
        # Hidden states: L + 1 of them (the input embeddings, then each layer's output).
        ({"hidden_layers": [N_LAYERS + 1]}, ("hidden_states", "layers")),
        (
            {"return_hidden_states": True, "hidden_layers": [-N_LAYERS - 2]},
            ("hidden_states", "layers"),
        ),
        ({"return_hidden_states": True, "hidden_layers": []}, ("hidden_states", "layers")),
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


@pytest.mark.parametrize(
    ("options", "graph"),
    [
        ({}, graph_io.GRAPH_EMBEDDINGS),
        ({"pooling": "mean", "return_embeddings": False}, graph_io.GRAPH_EMBEDDINGS),
        ({"return_hidden_states": True}, graph_io.GRAPH_HIDDEN_STATES),
        ({"hidden_layers": [0]}, graph_io.GRAPH_EMBEDDINGS),  # not asked for: not run
        ({"return_attention": True}, graph_io.GRAPH_ATTENTION),
        ({"return_attention": True, "return_hidden_states": True}, graph_io.GRAPH_ATTENTION),
    ],
)
def test_each_request_runs_the_lightest_graph_with_its_outputs(
    engine: Engine, options: dict[str, Any], graph: str
) -> None:
    prepared = engine.prepare(request_of(arrays(sequences((3,), seed=0)), **options))
    assert prepared.graph == graph
    assert set(prepared.model.manifest.graphs[graph].outputs) >= (
        {graph_io.OUTPUT_HIDDEN}
        | ({graph_io.OUTPUT_HIDDEN_STATES} if options.get("return_hidden_states") else set())
        | ({graph_io.OUTPUT_ATTENTIONS} if options.get("return_attention") else set())
    )


def test_hidden_layers_index_the_layers_plus_one_states(engine: Engine) -> None:
    seqs = arrays(sequences((3,), seed=0))
    every = engine.prepare(request_of(seqs, return_hidden_states=True))
    assert every.hidden_layers == list(range(N_LAYERS + 1))
    chosen = engine.prepare(
        request_of(seqs, return_hidden_states=True, hidden_layers=[-1, 1, -(N_LAYERS + 1)])
    )
    assert chosen.hidden_layers == [N_LAYERS, 1, 0]  # order kept


def test_hidden_states_count_in_the_response_size(
    model_repository: Path, runtimes: dict[str, ModelRuntime]
) -> None:
    (seq,) = sequences((MODEL_MAX_SEQ_LEN,), seed=1)
    without = loaded_engine(layer_settings(model_repository), runtimes).prepare(
        request_of(arrays([seq]))
    )
    # A budget the embeddings fit in but not the embeddings and L + 1 hidden states.
    budget = int(2 * without.response_bytes)
    engine = loaded_engine(layer_settings(model_repository, max_response_bytes=budget), runtimes)
    assert engine.prepare(request_of(arrays([seq]))).response_bytes == without.response_bytes
    with pytest.raises(PayloadTooLarge):
        engine.prepare(request_of(arrays([seq]), return_hidden_states=True))
    one = engine.prepare(request_of(arrays([seq]), return_hidden_states=True, hidden_layers=[-1]))
    # One state more than the embeddings alone: about twice their floats, within the budget.
    assert without.response_bytes < one.response_bytes <= budget


# -- what tiny cannot do ------------------------------------------------------------------


@pytest.mark.parametrize("item", ["a text", TokenIds([1, 2, 3])], ids=["text", "token-ids"])
def test_text_and_token_ids_are_unsupported_by_tiny(engine: Engine, item: InputItem) -> None:
    (seq,) = sequences((3,), seed=0)
    with pytest.raises(UnsupportedByModel) as info:
        engine.prepare(request_of([*arrays([seq]), item]))
    assert "tokenizer" in info.value.message


def test_tokenize_is_unsupported_by_tiny(engine: Engine) -> None:
    with pytest.raises(UnsupportedByModel):
        tokenize_texts(engine, TokenizeRequest(["a text"], COST))
    with pytest.raises(InvalidInput) as info:
        tokenize_texts(engine, TokenizeRequest([], COST))
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
        with work_scope(engine) as scope:
            return await engine.handle(ENCODE, lambda: (request_of(arrays(seqs)), "float"), scope)

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


def test_concurrent_requests_with_hidden_states_match_onnxruntime(
    settings: Settings,
    hidden_session: ort.InferenceSession,
    attention_session: ort.InferenceSession,
) -> None:
    """Requests for each graph queued together: the batcher runs one group per graph and
    trims every output of every sequence to that sequence's own length."""
    groups = [sequences(RAGGED, seed=51), sequences((5, 30), seed=52), sequences((2, 7), seed=53)]
    requests = [
        request_of(arrays(groups[0]), return_hidden_states=True),
        request_of(
            arrays(groups[1]),
            return_hidden_states=True,
            hidden_layers=[-1, 0],
            return_attention=True,
            return_embeddings=False,
        ),
        request_of(arrays(groups[2])),
    ]

    async def body(engine: Engine) -> list[EncodeResult]:
        prepared = [engine.prepare(r) for r in requests]
        return list(await asyncio.gather(*(engine.run(p) for p in prepared)))

    results = with_started_engine(settings, body)
    # request 0: model_hidden.onnx, every state
    for out, want in zip(results[0].outputs, ort_outputs(hidden_session, groups[0]), strict=True):
        n = out.length
        assert out.attention is None
        assert out.hidden_states is not None
        assert out.hidden_states.shape == (N_LAYERS + 1, n, D_MODEL)
        np.testing.assert_allclose(
            out.hidden_states, want[graph_io.OUTPUT_HIDDEN_STATES], rtol=0, atol=ATOL_ORT
        )
        assert out.embeddings is not None
        np.testing.assert_allclose(out.embeddings, out.hidden_states[-1], rtol=0, atol=ATOL_ORT)
    # request 1: model_attn.onnx, the last state then the input embeddings
    for seq, out, want in zip(
        groups[1], results[1].outputs, ort_outputs(attention_session, groups[1]), strict=True
    ):
        n = len(seq)
        assert out.embeddings is None and out.attention is not None
        assert out.hidden_states is not None and out.hidden_states.shape == (2, n, D_MODEL)
        states = want[graph_io.OUTPUT_HIDDEN_STATES]
        np.testing.assert_allclose(out.hidden_states[0], states[-1], rtol=0, atol=ATOL_ORT)
        np.testing.assert_allclose(out.hidden_states[1], seq, rtol=0, atol=ATOL_ORT)
        np.testing.assert_allclose(
            out.attention, want[graph_io.OUTPUT_ATTENTIONS], rtol=0, atol=ATOL_ORT
        )
    # request 2: model.onnx, no hidden states
    assert all(out.hidden_states is None for out in results[2].outputs)


@pytest.mark.parametrize("output", [graph_io.OUTPUT_HIDDEN, graph_io.OUTPUT_HIDDEN_STATES])
def test_finish_refuses_non_finite_outputs(engine: Engine, output: str) -> None:
    seqs = sequences((3, 2), seed=4)
    prepared = engine.prepare(request_of(arrays(seqs), return_hidden_states=True))
    # What model_hidden.onnx gives per sequence: last_hidden_state [n, d], hidden_states
    # [L + 1, n, d]; one value of one sequence's ``output`` is NaN.
    results = [
        {
            graph_io.OUTPUT_HIDDEN: s.copy(),
            graph_io.OUTPUT_HIDDEN_STATES: np.stack([s] * (N_LAYERS + 1)),
        }
        for s in seqs
    ]
    results[1][output][0, 0] = np.nan
    with pytest.raises(InvalidInput) as info:
        finish(prepared, results)
    assert info.value.field == ("inputs", 1)


# -- the caller going away ----------------------------------------------------------------


def test_until_returning_first_raises_client_closed_and_the_engine_serves_on(
    settings: Settings, embeddings_session: ort.InferenceSession
) -> None:
    # Over UNWATCHED_TOKENS: a request big enough to matter is always watched.
    seqs = sequences((120, 100, 90), seed=41)

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


def test_a_small_request_on_an_idle_engine_runs_without_a_watcher(settings: Settings) -> None:
    # Nothing queued ahead and one run: it would run at once anyway, so no watcher task
    # is started (a task and a wake-up per request) and ``until`` is never awaited.
    seqs = sequences((6, 3), seed=42)
    awaited = []

    async def gone() -> None:
        awaited.append(True)

    async def body(engine: Engine) -> EncodeResult:
        return await engine.run(engine.prepare(request_of(arrays(seqs))), until=gone)

    result = with_started_engine(settings, body)
    assert len(result.outputs) == 2
    assert awaited == []
