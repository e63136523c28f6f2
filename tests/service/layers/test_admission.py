"""What protects the node, in-process on the real engine, batcher and runtime (tiny).

- ``Admission``/``Ticket``: request slots and a byte budget; 429 (with the reason
  counted and a Retry-After) when the node lacks room now, 413 when one request
  alone needs more than all of it; every gauge back to 0 once released.
- ``limits.work_bytes``: what an admitted request holds at its peak, attention maps
  included even when the answer is reduced; repeated indices refused before any
  decoding; reductions equal to numpy references.
- ``limits.bound_text``: texts bounded by a prefix search on real tokens (truncation unchanged).
- ``Batcher``: deadlines (a job past its deadline never runs), run timings, a
  Retry-After computed from the backlog, a crashed worker restarted.

Nothing of ours is mocked. Gauges and counters are read from the Metrics registry.
Tolerances: see ATOL_MEAN and ATOL_ROLLOUT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from tokenizers import Tokenizer

from model_export import graph_io
from model_export.hf_import import minilm_l6_dir
from service import attention_scratch
from service.attention_scratch import attention_scratch_bytes
from service.batcher import Batcher
from service.condense import BoundedText
from service.engine import (
    ENCODE,
    ArrayInput,
    AttentionSpec,
    EncodeRequest,
    EncodeResult,
    Engine,
    limits,
)
from service.engine.admission import Admission
from service.engine.types import AnswerShape, Reduce, TokenizeRequest
from service.errors import (
    MAX_MESSAGE_CHARS,
    DeadlineExceeded,
    InvalidInput,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    SequenceTooLong,
    ShuttingDown,
    UnsupportedByModel,
)
from service.metrics import Metrics
from service.model_info import ModelInfo
from service.protocols.native import codec
from service.runtime import ModelRuntime
from service.settings import Settings
from service.timing import RunTiming
from service.tokenizer import TextFrontEnd
from tests.service.layers.conftest import (
    layer_settings,
    tokenize_texts,
    with_started_engine,
    work_scope,
)
from tests.service.layers.test_engine import COST, arrays, request_of
from tests.service.layers.test_postprocess import SHARP, reference_rollout
from tests.support.inputs import sequences
from tests.support.metrics import metric
from tests.support.tiny import D_MODEL, MODEL, MODEL_MAX_SEQ_LEN, N_HEADS, N_LAYERS

FLOAT32 = 4
MiB = 1024 * 1024
# The float32 mean of <= 4 values in [0, 1] against a float64 reference: rounding only.
ATOL_MEAN = 1e-6
# Rollout is float64 inside and float32 out (values in [0, 1]): see test_postprocess.
ATOL_ROLLOUT = 1e-6
EMBEDDINGS = graph_io.GRAPH_EMBEDDINGS


def in_flight(metrics: Metrics) -> tuple[float, float]:
    """The admission gauges: (requests, bytes)."""
    return (
        metric(metrics.registry, "attnserve_in_flight_requests"),
        metric(metrics.registry, "attnserve_in_flight_bytes"),
    )


def refusals(metrics: Metrics, reason: str) -> float:
    return metric(metrics.registry, "attnserve_refusals_total", reason=reason)


def runs(metrics: Metrics, graph: str) -> float:
    """onnxruntime runs of one of tiny's graphs (label as in the inference metric)."""
    return metric(metrics.registry, "attnserve_inference_seconds_count", model=MODEL, graph=graph)


def never_decoded(rows: int) -> ArrayInput:
    def decode() -> np.ndarray:
        raise AssertionError("decoded although the request had already failed")

    return ArrayInput(rows, decode)


# -- Admission and Ticket -----------------------------------------------------------------

SLOTS, BUDGET = 2, 1000
RETRY_AFTER = "7"


@pytest.fixture
def admission() -> Admission:
    """Two request slots and 1000 bytes; its Retry-After is whatever this callable says
    (the engine passes the batcher's estimate, tested below)."""
    return Admission(SLOTS, BUDGET, Metrics(), lambda: RETRY_AFTER)


def test_a_ticket_takes_a_slot_only_when_asked(admission: Admission) -> None:
    ticket = admission.ticket()
    assert (admission.requests, admission.bytes) == (0, 0)
    ticket.hold(100, "this request's body")  # a body arriving: bytes, no slot
    assert (admission.requests, admission.bytes) == (0, 100)
    assert in_flight(admission.metrics) == (0, 100)
    ticket.take_slot()
    ticket.take_slot()  # once per ticket
    assert (admission.requests, admission.bytes) == (1, 100)
    assert in_flight(admission.metrics) == (1, 100)


def test_a_ticket_only_grows(admission: Admission) -> None:
    ticket = admission.ticket()
    for asked, held in [(300, 300), (100, 300), (300, 300), (500, 500)]:
        ticket.hold(asked, "this request")
        assert ticket.bytes == admission.bytes == held
    assert in_flight(admission.metrics) == (0, 500)


def test_a_budget_short_of_bytes_is_429_memory(admission: Admission) -> None:
    first, second = admission.ticket(), admission.ticket()
    first.hold(800, "the first request")
    assert admission.saturated() is None
    with pytest.raises(Overloaded) as info:
        second.hold(201, "the second request")
    assert info.value.status_code == 429
    assert info.value.headers == {"Retry-After": RETRY_AFTER}
    assert "memory budget is spent" in info.value.message
    assert refusals(admission.metrics, "memory") == 1
    assert refusals(admission.metrics, "queue_full") == 0
    assert (second.bytes, admission.bytes) == (0, 800)  # a refused hold holds nothing
    second.hold(200, "the second request")  # the budget is inclusive
    assert admission.bytes == BUDGET
    assert admission.saturated() == "the memory budget (0 MB) is spent"


def test_one_request_beyond_the_whole_budget_is_413_not_429(admission: Admission) -> None:
    """Retrying cannot help it, so it is told so (413), even while others hold bytes, and
    it is no refusal of the node's (not counted)."""
    admission.ticket().hold(900, "another request")
    ticket = admission.ticket()
    with pytest.raises(PayloadTooLarge) as info:
        ticket.hold(BUDGET + 1, "this request")
    assert type(info.value) is PayloadTooLarge and info.value.status_code == 413
    assert info.value.message.startswith("this request needs about")
    assert refusals(admission.metrics, "memory") == 0
    assert (ticket.bytes, admission.bytes) == (0, 900)


def test_all_slots_taken_is_429_queue_full(admission: Admission) -> None:
    holders = [admission.ticket() for _ in range(SLOTS)]
    for ticket in holders:
        ticket.take_slot()
    assert admission.saturated() == f"all {SLOTS} request slots are taken"
    late = admission.ticket()
    with pytest.raises(Overloaded) as info:
        late.take_slot()
    assert info.value.headers == {"Retry-After": RETRY_AFTER}
    assert refusals(admission.metrics, "queue_full") == 1
    assert not late.slot and admission.requests == SLOTS
    late.hold(10, "a body arriving")  # a body still arriving needs no slot
    holders[0].release()
    assert admission.saturated() is None
    late.take_slot()
    assert admission.requests == SLOTS


def test_release_gives_everything_back(admission: Admission) -> None:
    with admission.ticket() as first, admission.ticket() as second:
        first.take_slot()
        first.hold(400, "the first request")
        second.take_slot()
        second.hold(600, "the second request")
        assert in_flight(admission.metrics) == (2, BUDGET)
        with pytest.raises(Overloaded):
            admission.ticket().hold(1, "a third")  # refused: held nothing, gives nothing
    assert (admission.requests, admission.bytes) == (0, 0)
    assert in_flight(admission.metrics) == (0, 0)
    first.release()  # twice: nothing more to give
    assert in_flight(admission.metrics) == (0, 0)
    assert (first.bytes, first.slot) == (0, False)


# -- the engine's admission ---------------------------------------------------------------

SMALL_BUDGET = 16 * MiB  # the least ATTNSERVE_MAX_INFLIGHT_BYTES allows


def attention_request(count: int) -> EncodeRequest:
    """``count`` sequences of 128 asking for the mean attention map of each layer, base64,
    without embeddings: an answer a fraction of the size of the maps it is reduced from."""
    (seq,) = sequences((128,), seed=2)
    return EncodeRequest(
        inputs=arrays([seq] * count),
        wire_cost=codec.ENCODE_COST["base64"],
        return_attention=True,
        attention=AttentionSpec(reduce="mean"),
        return_embeddings=False,
    )


def test_working_memory_of_attention_counts_in_the_budget(model_repository: Path) -> None:
    """40 sequences of 128 with reduce "mean": a 5 MB answer, but their maps [L, H, n, n]
    alone are 21 MB, more than the 16 MiB budget: 413 before running. A request that fits
    alone gets 429 while another holds one byte too many, and runs when exactly enough
    is left (the budget is inclusive). The gauges are 0 after each."""
    settings = layer_settings(model_repository, max_inflight_bytes=SMALL_BUDGET)
    too_big, fits = attention_request(40), attention_request(6)

    async def body(engine: Engine) -> EncodeResult:
        prepared = engine.prepare(too_big)
        maps = FLOAT32 * 40 * N_LAYERS * N_HEADS * 128 * 128
        assert prepared.response_bytes < SMALL_BUDGET < maps <= prepared.work_bytes
        with work_scope(engine) as scope, pytest.raises(PayloadTooLarge) as info:
            await engine.handle(ENCODE, lambda: (too_big, None), scope)
        assert info.value.message.startswith("this request needs about")
        assert in_flight(engine.metrics) == (0, 0)

        work = engine.prepare(fits).work_bytes
        assert work < SMALL_BUDGET
        with engine.ticket() as other:
            other.hold(SMALL_BUDGET - work + 1, "another request")
            with work_scope(engine) as scope, pytest.raises(Overloaded) as refused:
                await engine.handle(ENCODE, lambda: (fits, None), scope)
            assert refused.value.headers == {"Retry-After": "1"}  # nothing measured yet
            assert refusals(engine.metrics, "memory") == 1
            assert in_flight(engine.metrics) == (0, SMALL_BUDGET - work + 1)
        with engine.ticket() as other:
            other.hold(SMALL_BUDGET - work, "another request")  # exactly the rest: fits
            with work_scope(engine) as scope:
                result, _ = await engine.handle(ENCODE, lambda: (fits, None), scope)
                assert in_flight(engine.metrics) == (1, SMALL_BUDGET)
        assert in_flight(engine.metrics) == (0, 0)
        return result

    result = with_started_engine(settings, body)
    assert len(result.outputs) == 6


def test_readiness_tells_saturation_and_shutdown(model_repository: Path) -> None:
    settings = layer_settings(model_repository, max_queued_requests=1)

    async def body(engine: Engine) -> None:
        engine.check_ready()
        with engine.ticket() as ticket:
            ticket.take_slot()
            with pytest.raises(NotReady) as busy:
                engine.check_ready()
            assert type(busy.value) is NotReady and busy.value.status_code == 503
            assert busy.value.message == "saturated: all 1 request slots are taken"
            assert busy.value.headers == {"Retry-After": "1"}
        engine.check_ready()
        engine.begin_shutdown()
        for refused in (engine.check_ready, engine.ticket):
            with pytest.raises(ShuttingDown) as info:
                refused()
            assert info.value.headers is not None and "Retry-After" in info.value.headers

    with_started_engine(settings, body)


# -- work_bytes ---------------------------------------------------------------------------

LENGTHS = [3, 17, 40]


def test_work_bytes_counts_maps_only_with_attention_and_states_only_when_asked(
    tiny_info: ModelInfo,
) -> None:
    cfg = tiny_info.config
    tokens, squares = sum(LENGTHS), sum(n * n for n in LENGTHS)
    nothing = AnswerShape([], len(LENGTHS))

    def work(attention: bool, hidden: bool, shape: AnswerShape = nothing, sent: float = 0) -> int:
        return limits.work_bytes(LENGTHS, cfg, attention, hidden, shape, sent)

    inputs_and_last = FLOAT32 * 2 * tokens * D_MODEL
    states = FLOAT32 * (N_LAYERS + 1) * tokens * D_MODEL
    maps = FLOAT32 * N_LAYERS * N_HEADS * squares
    assert work(False, False) == inputs_and_last
    assert work(False, True) == inputs_and_last + states
    # The attention graph returns every hidden state too, asked for or not.
    assert work(True, False) == work(True, True) == inputs_and_last + states + maps
    # The answer's floats and its encoded bytes come on top.
    answer = AnswerShape([(5, D_MODEL), (7,)], 2)
    assert work(False, False, answer, 1234.5) == inputs_and_last + FLOAT32 * answer.floats + 1234


@pytest.mark.parametrize("reduce", ["none", "mean", "max", "rollout"])
def test_prepared_work_counts_every_map_whatever_the_reduction(
    engine: Engine, reduce: Reduce
) -> None:
    """Selection and reduction of the full graph's maps (norms need that graph) read
    every map: a small (reduced) answer does not make a small request. The selected-maps
    graph returns only the chosen heads' maps: the same request of weights counts those,
    and less than the full graph's."""
    seqs = sequences(tuple(LENGTHS), seed=3)
    maps = FLOAT32 * N_LAYERS * N_HEADS * sum(n * n for n in LENGTHS)
    plain = engine.prepare(request_of(arrays(seqs)))
    norms = AttentionSpec(heads=[1], reduce=reduce, measure="norms")
    prepared = engine.prepare(request_of(arrays(seqs), return_attention=True, attention=norms))
    assert prepared.graph == graph_io.GRAPH_ATTENTION
    assert prepared.work_bytes >= plain.work_bytes + maps
    weights = AttentionSpec(heads=[1], reduce=reduce)
    selected = engine.prepare(request_of(arrays(seqs), return_attention=True, attention=weights))
    assert selected.graph == graph_io.GRAPH_SELECTED_ATTENTION
    one_head = FLOAT32 * N_LAYERS * sum(n * n for n in LENGTHS)
    # The same answer's shape: only the run's outputs differ.
    assert plain.work_bytes + one_head <= selected.work_bytes < prepared.work_bytes


@pytest.mark.parametrize(
    "options",
    [
        {"return_attention": True, "attention": AttentionSpec(heads=[0] * 200_000, reduce="mean")},
        {"return_attention": True, "attention": AttentionSpec(layers=[0] * 200_000)},
        {"return_attention": True, "attention": AttentionSpec(layers=[1, -1], reduce="rollout")},
        {"return_hidden_states": True, "hidden_layers": [-1] * 200_000},
    ],
    ids=["heads-mean", "layers", "layers-rollout", "hidden-states"],
)
def test_repeated_indices_are_refused_before_any_decoding(
    engine: Engine, options: dict[str, Any]
) -> None:
    """Finding 1 of issue 10: 200,000 repeats of one head made numpy ask for 293 GiB.
    Now a plain 422 naming the field, in a short message, before any input is decoded."""
    with pytest.raises(InvalidInput) as info:
        engine.prepare(request_of([never_decoded(128)], **options))
    field = info.value.field
    assert field in (("attention", "heads"), ("attention", "layers"), ("hidden_states", "layers"))
    assert "repeated" in info.value.message
    assert len(info.value.message) < MAX_MESSAGE_CHARS


@pytest.mark.parametrize(
    ("layers", "heads"), [(None, None), ([1, 0], [3, 1]), ([-1], [2]), ([0], [0, 1, 2, 3])]
)
def test_reductions_through_the_engine_match_numpy(
    settings: Settings, layers: list[int] | None, heads: list[int] | None
) -> None:
    """One sequence asked four ways at once (one run of the attention graph): the full maps
    (reduce "none"), and mean / max / rollout of the chosen layers and heads, each against
    numpy on those full maps. Sharpened inputs, so wrong heads or layers would show."""
    (seq,) = sequences((23,), seed=9)
    sharp = SHARP * seq
    reductions: list[Reduce] = ["mean", "max", "rollout"]

    async def body(engine: Engine) -> list[EncodeResult]:
        full = engine.prepare(request_of(arrays([sharp]), return_attention=True))
        reduced = [
            engine.prepare(
                request_of(
                    arrays([sharp]),
                    return_attention=True,
                    attention=AttentionSpec(layers=layers, heads=heads, reduce=reduce),
                )
            )
            for reduce in reductions
        ]
        return list(await asyncio.gather(*(engine.run(p) for p in [full, *reduced])))

    full, mean, top, rolled = (r.outputs[0].attention for r in with_started_engine(settings, body))
    assert full is not None and mean is not None and top is not None and rolled is not None
    chosen_layers = list(range(N_LAYERS)) if layers is None else [i % N_LAYERS for i in layers]
    chosen_heads = list(range(N_HEADS)) if heads is None else heads
    chosen = full[np.ix_(chosen_layers, chosen_heads)]  # (L', H', n, n)
    np.testing.assert_allclose(
        mean, chosen.astype(np.float64).mean(axis=1, keepdims=True), rtol=0, atol=ATOL_MEAN
    )
    np.testing.assert_array_equal(top, chosen.max(axis=1, keepdims=True))
    # Rollout multiplies the chosen layers bottom-up, whatever order they were named in.
    bottom_up = full[np.ix_(sorted(chosen_layers), chosen_heads)]
    assert rolled.shape == (1, 1, 23, 23)
    np.testing.assert_allclose(
        rolled[0, 0], reference_rollout(bottom_up), rtol=0, atol=ATOL_ROLLOUT
    )


# -- bound_text ---------------------------------------------------------------------------


class _MiniLMPrefixes:
    """What ``bound_text`` asks of a front end, on the tokenizer minilm-l6 serves: its
    ``final_tokens``, and no condensing (a slice, as for a tokenizer not BERT's), so the
    prefix search itself is what is tested."""

    def __init__(self) -> None:
        self.tokenizer = Tokenizer.from_file(str(minilm_l6_dir() / graph_io.TOKENIZER_FILE))
        self.tokenizer.no_truncation()  # the file truncates at 128 itself; the runtime undoes it

    def condense(self, text: str, budget: int, *, from_end: bool = False) -> BoundedText:
        assert not from_end
        return BoundedText(text[:budget])

    def final_tokens(self, prefix: str, *, from_end: bool = False) -> int:
        assert not from_end
        encoded = self.tokenizer.encode(prefix, add_special_tokens=False)
        words = [w for w in encoded.word_ids if w is not None]
        return sum(1 for w in words if w < max(words)) if words else 0


def test_bound_text_searches_prefixes_on_real_tokens() -> None:
    """Whitespace-heavy text is cut where its prefix holds the model's length, not at a
    fixed count of characters; a text that fits is kept whole; too long is 413."""
    # tiny has no tokenizer (its texts are refused whole): stand in for a model with one.
    info = cast(ModelInfo, SimpleNamespace(name="m", max_seq_len=128, has_tokenizer=True))
    front_end = cast(TextFrontEnd, _MiniLMPrefixes())
    first = info.max_seq_len * limits.FIRST_PREFIX_CHARS_PER_TOKEN
    sparse = ("word" + " " * 200) * (4 * info.max_seq_len)
    cut = limits.bound_text(sparse, info, True, ("inputs", 0), front_end).text
    assert len(cut) == first * limits.PREFIX_GROWTH < len(sparse)
    assert front_end.final_tokens(cut) > info.max_seq_len
    fitting = ("word" + " " * 200) * (info.max_seq_len // 2)
    assert len(fitting) > first
    assert limits.bound_text(fitting, info, False, ("inputs", 0), front_end).text is fitting
    with pytest.raises(SequenceTooLong) as raised:
        limits.bound_text("word " * first, info, False, ("texts", 3), front_end)
    assert raised.value.field == ("texts", 3) and raised.value.status_code == 413
    assert f"whose first {first:,} already hold over {info.max_seq_len}" in raised.value.message


def test_texts_of_a_model_without_tokenizer_reach_its_refusal(engine: Engine) -> None:
    """tiny has no tokenizer: a text of any length is UnsupportedByModel, nothing
    tokenized first."""
    huge = "word " * 6_400_000
    (seq,) = sequences((3,), seed=0)
    for truncate in (False, True):
        with pytest.raises(UnsupportedByModel):
            engine.prepare(request_of([*arrays([seq]), huge], truncate=truncate))
        with pytest.raises(UnsupportedByModel):
            tokenize_texts(engine, TokenizeRequest(["short", huge], COST, truncate=truncate))


# -- the batcher: deadlines, timings, Retry-After, supervision ----------------------------


def with_batcher(
    settings: Settings,
    runtimes: dict[str, ModelRuntime],
    body: Callable[[Batcher, Metrics], Any],
    before_batch: Callable[[str], None] | None = None,
) -> Any:
    """Start a real Batcher on the session's runtimes, await ``body(batcher, metrics)``, stop."""

    async def main() -> Any:
        metrics = Metrics()
        batcher = Batcher(runtimes, settings, metrics, before_batch=before_batch)
        await batcher.start()
        try:
            return await body(batcher, metrics)
        finally:
            await batcher.stop()

    return asyncio.run(main())


def test_a_job_past_its_deadline_never_runs(
    settings: Settings, runtimes: dict[str, ModelRuntime]
) -> None:
    """Queued together, the late job is dropped when the batch is taken: the one run has
    only the other job's sequence."""
    late, on_time = sequences((7,), seed=1), sequences((5,), seed=2)

    async def body(batcher: Batcher, metrics: Metrics) -> None:
        outcomes = await asyncio.gather(
            batcher.submit(MODEL, late, graph=EMBEDDINGS, deadline=time.monotonic() - 0.001),
            batcher.submit(MODEL, on_time, graph=EMBEDDINGS, deadline=time.monotonic() + 60),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], DeadlineExceeded)
        assert "before it ran" in outcomes[0].message
        assert isinstance(outcomes[1], list) and outcomes[1][0][graph_io.OUTPUT_HIDDEN].shape == (
            5,
            D_MODEL,
        )
        assert runs(metrics, "embeddings") == 1
        assert metric(metrics.registry, "attnserve_batch_sequences_sum") == 1  # not the late one's
        assert refusals(metrics, "deadline") == 1
        assert metric(metrics.registry, "attnserve_queued_requests") == 0
        assert batcher.backlog_seconds() == 0

    with_batcher(settings, runtimes, body)


def test_run_with_a_past_deadline_raises_with_retry_after(settings: Settings) -> None:
    async def body(engine: Engine) -> None:
        prepared = engine.prepare(request_of(arrays(sequences((4,), seed=3))))
        with pytest.raises(DeadlineExceeded) as info:
            await engine.run(prepared, deadline=time.monotonic() - 0.001)
        assert info.value.status_code == 504 and info.value.error_type == "deadline_exceeded"
        assert info.value.headers == {"Retry-After": "1"}
        assert refusals(engine.metrics, "deadline") == 1
        assert runs(engine.metrics, "embeddings") == 0

    with_started_engine(settings, body)


@dataclasses.dataclass
class Dropped:
    error: BaseException | None
    embeddings_runs: float  # runs of the small request's graph
    deadline_refusals: float
    queued: float  # the queue-depth gauge once every request is done


def queued_past_deadline(settings: Settings) -> Dropped:
    """A small request whose 20 ms deadline passes while it waits behind two requests of
    64 x 128 tokens with attention (hundreds of ms on tiny)."""
    (seq,) = sequences((128,), seed=4)
    long = request_of(
        arrays([seq] * 64), return_attention=True, attention=AttentionSpec(reduce="mean")
    )
    small = request_of(arrays(sequences((5,), seed=5)))

    async def body(engine: Engine) -> Dropped:
        metrics = engine.metrics
        queued = [asyncio.ensure_future(engine.run(engine.prepare(long))) for _ in range(2)]
        while (
            metric(metrics.registry, "attnserve_queue_seconds_count") < 1
        ):  # a long run has started
            await asyncio.sleep(0.001)
        prepared = engine.prepare(small)
        error: BaseException | None = None
        try:
            await engine.run(prepared, deadline=time.monotonic() + 0.02)
        except DeadlineExceeded as exc:
            error = exc
        await asyncio.gather(*queued)
        return Dropped(
            error,
            runs(metrics, "embeddings"),
            refusals(metrics, "deadline"),
            metric(metrics.registry, "attnserve_queued_requests"),
        )

    return with_started_engine(settings, body)


def test_a_request_whose_deadline_passes_while_queued_is_dropped(settings: Settings) -> None:
    dropped = queued_past_deadline(settings)
    assert isinstance(dropped.error, DeadlineExceeded)
    assert dropped.error.headers is not None and int(dropped.error.headers["Retry-After"]) >= 1
    assert dropped.embeddings_runs == 0  # it never ran
    assert dropped.queued == 0


def test_a_deadline_passing_while_queued_counts_as_a_refusal(settings: Settings) -> None:
    assert queued_past_deadline(settings).deadline_refusals == 1


def test_run_timing_is_filled_for_a_normal_run(settings: Settings) -> None:
    async def body(engine: Engine) -> tuple[RunTiming, Metrics]:
        timing = RunTiming()
        prepared = engine.prepare(request_of(arrays(sequences((9, 30), seed=6))))
        await engine.run(prepared, timing=timing)
        return timing, engine.metrics

    timing, metrics = with_started_engine(settings, body)
    assert timing.compute > 0 and timing.queue >= 0
    # Alone, the request is one run: its times are exactly what the histograms observed.
    assert runs(metrics, "embeddings") == 1
    assert timing.compute == metric(
        metrics.registry, "attnserve_inference_seconds_sum", model=MODEL, graph="embeddings"
    )
    assert timing.queue == metric(metrics.registry, "attnserve_queue_seconds_sum")


def test_retry_after_is_the_backlog_over_the_measured_rate(
    settings: Settings, runtimes: dict[str, ModelRuntime]
) -> None:
    """ "1" while nothing is measured or nothing waits; then the queued tokens over the
    measured tokens per second, in whole seconds, at most 60.

    The jobs repeat one array (tokens cost nothing to queue) and are cancelled unrun. Each
    read follows one ``sleep(0)``: the jobs created before it are queued by then, and a run
    that ends cannot update the rate before the next loop iteration after that.
    """
    (seq,) = sequences((128,), seed=7)

    async def body(batcher: Batcher, metrics: Metrics) -> None:
        assert (batcher.retry_after(), batcher.backlog_seconds()) == ("1", 0.0)
        first = asyncio.ensure_future(batcher.submit(MODEL, [seq] * 8, graph=EMBEDDINGS))
        await asyncio.sleep(0)
        assert (batcher.retry_after(), batcher.backlog_seconds()) == ("1", 0.0)  # no rate yet
        await first  # measures the rate
        assert (batcher.retry_after(), batcher.backlog_seconds()) == ("1", 0.0)  # no backlog

        jobs: list[asyncio.Future[Any]] = []

        async def queue(copies: int) -> float:
            jobs.append(
                asyncio.ensure_future(batcher.submit(MODEL, [seq] * copies, graph=EMBEDDINGS))
            )
            await asyncio.sleep(0)
            return batcher.backlog_seconds()

        try:
            queued = 8 * 128
            seconds = await queue(8)
            assert seconds > 0
            rate = queued / seconds  # tokens per second, as measured by the first run
            more = math.ceil(3.5 * rate / 128)  # about 3.5 s more
            seconds = await queue(more)
            queued += more * 128
            assert seconds == pytest.approx(queued / rate, rel=1e-9)
            assert batcher.retry_after() == str(math.ceil(seconds))
            assert int(batcher.retry_after()) >= 4
            await queue(math.ceil(100 * rate / 128))  # about 100 s more
            assert batcher.retry_after() == "60"
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
        assert (batcher.retry_after(), batcher.backlog_seconds()) == ("1", 0.0)
        assert metric(metrics.registry, "attnserve_queued_requests") == 0

    with_batcher(settings, runtimes, body)


class WorkerFault(Exception):
    """A deliberate fault of a batcher worker, outside any run's own error handling."""


def test_a_crashed_worker_is_restarted(
    settings: Settings, runtimes: dict[str, ModelRuntime]
) -> None:
    """The worker fails on its first batch (the batcher's ``before_batch`` fault seam):
    that request fails with the fault, the restart is counted, and the next request is
    answered by the restarted worker."""
    (seq,) = sequences((6,), seed=8)
    faults = [WorkerFault("injected")]

    def before_batch(model: str) -> None:
        if faults:
            raise faults.pop()

    async def body(batcher: Batcher, metrics: Metrics) -> None:
        with pytest.raises(WorkerFault):  # failed with the fault, not left to hang
            await asyncio.wait_for(batcher.submit(MODEL, [seq], graph=EMBEDDINGS), timeout=30)
        assert not faults  # the seam was reached
        answer = await asyncio.wait_for(batcher.submit(MODEL, [seq], graph=EMBEDDINGS), timeout=30)
        assert answer[0][graph_io.OUTPUT_HIDDEN].shape == (6, D_MODEL)
        assert metric(metrics.registry, "attnserve_batcher_restarts_total", model=MODEL) == 1

    with_batcher(settings, runtimes, body, before_batch)


def test_an_empty_sequence_is_answered_without_a_restart(
    settings: Settings, runtimes: dict[str, ModelRuntime]
) -> None:
    """A run of no tokens has no fill or rate to record (it used to divide by zero there,
    outside the run's error handling, and crash the worker)."""

    async def body(batcher: Batcher, metrics: Metrics) -> None:
        empty = np.zeros((0, D_MODEL), np.float32)
        answer = await asyncio.wait_for(batcher.submit(MODEL, [empty], graph=EMBEDDINGS), 30)
        assert answer[0][graph_io.OUTPUT_HIDDEN].shape == (0, D_MODEL)
        assert metric(metrics.registry, "attnserve_batcher_restarts_total", model=MODEL) == 0
        assert metric(metrics.registry, "attnserve_batch_fill_ratio_count") == 0

    with_batcher(settings, runtimes, body)


def test_a_refused_submit_leaves_nothing_queued(
    settings: Settings, runtimes: dict[str, ModelRuntime]
) -> None:
    (seq,) = sequences((6,), seed=8)

    async def body(batcher: Batcher, metrics: Metrics) -> None:
        with pytest.raises(TypeError):
            await batcher.submit(MODEL, [5], graph=EMBEDDINGS)  # type: ignore[list-item]
        await batcher.submit(MODEL, [seq], graph=EMBEDDINGS)
        assert metric(metrics.registry, "attnserve_queued_requests") == 0
        assert metric(metrics.registry, "attnserve_batcher_restarts_total", model=MODEL) == 0

    with_batcher(settings, runtimes, body)


def test_submit_refuses_an_unknown_graph(
    settings: Settings, runtimes: dict[str, ModelRuntime]
) -> None:
    async def body(batcher: Batcher, metrics: Metrics) -> None:
        with pytest.raises(ValueError, match=r"unknown graph 'model_fast\.onnx'"):
            await batcher.submit(MODEL, sequences((3,), seed=0), graph="model_fast.onnx")
        assert metric(metrics.registry, "attnserve_queued_requests") == 0
        assert batcher.backlog_seconds() == 0

    with_batcher(settings, runtimes, body)


def test_tickets_are_released_by_the_engine_encode_path(settings: Settings) -> None:
    """A request refused while preparing (422) releases its slot and bytes with its ticket."""

    async def body(engine: Engine) -> None:
        bad = request_of([never_decoded(3)], attention=AttentionSpec(heads=[0, 0]))
        with work_scope(engine) as scope, pytest.raises(InvalidInput):
            await engine.handle(ENCODE, lambda: (bad, None), scope)
        assert in_flight(engine.metrics) == (0, 0)

    with_started_engine(settings, body)


def test_work_counts_the_attention_scratch_of_the_longest_sequence(engine: Engine) -> None:
    """onnxruntime's per-layer attention scratch grows with the square of the length and
    is no output: a request is charged SCRATCH_MAPS [h, n, n] maps for its longest
    sequence (failed before it was counted: an 8,192-token sequence of a base model took
    ~14 GB above a fresh server while admission counted ~50 MB)."""
    cfg = engine.registry.runtimes[MODEL].info.config
    short, long = sequences((8,), seed=4), sequences((MODEL_MAX_SEQ_LEN,), seed=5)
    small = engine.prepare(request_of(arrays(short))).work_bytes
    large = engine.prepare(request_of(arrays(long))).work_bytes
    scratch = FLOAT32 * attention_scratch.SCRATCH_MAPS * cfg.n_heads * MODEL_MAX_SEQ_LEN**2
    inputs_and_outputs = FLOAT32 * 2 * MODEL_MAX_SEQ_LEN * cfg.d_model * 2
    assert large >= scratch > inputs_and_outputs
    assert large - small >= scratch - FLOAT32 * attention_scratch.SCRATCH_MAPS * cfg.n_heads * 8 * 8
    # Four of them run padded together (512 tokens, within max_batch_tokens): 4 x scratch.
    many = engine.prepare(request_of(arrays(long * 4))).work_bytes
    assert many >= 4 * scratch


def test_attention_scratch_counts_a_run_of_padded_sequences(tiny_info: ModelInfo) -> None:
    cfg = tiny_info.config
    per_token = FLOAT32 * attention_scratch.SCRATCH_MAPS * cfg.n_heads
    assert attention_scratch_bytes([100], cfg, 4096) == per_token * 100 * 100
    # Three sequences padded to the longest, within the batch budget: 3 x 100 rows.
    assert attention_scratch_bytes([5, 100, 7], cfg, 4096) == per_token * 300 * 100
    # Beyond the budget the run holds max_batch_tokens rows; one sequence never less.
    assert attention_scratch_bytes([100] * 90, cfg, 4096) == per_token * 4096 * 100
    assert attention_scratch_bytes([100], cfg, 10) == per_token * 100 * 100
    compact = attention_scratch_bytes([100], cfg, 4096, compact=True)
    assert compact == FLOAT32 * attention_scratch.COMPACT_SCRATCH_MAPS * cfg.n_heads * 100 * 100
