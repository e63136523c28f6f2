"""Answers without extra copies: what an attention answer costs between the run and the wire.

A run's outputs are cut per sequence; a sequence that fills its row keeps a view
(no copy), every map in order is the run's own buffer, one unpadded sequence is
re-padded as a view, and the /v2 binary framing sends each output buffer as it
is. Counted with tracemalloc: what building a [1, 128] all-attention /v2 answer
allocates, against the answer's bytes.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np

from model_export.manifest import graph_io
from service.engine import ENCODE, Engine
from service.engine.postprocess import select_attention
from service.inference_lanes import run_and_split
from service.protocols.kserve_v2 import codec
from service.protocols.open_inference.padding import repad
from service.runtime import ModelRuntime
from tests.service.layers.conftest import layer_settings, with_started_engine, work_scope
from tests.support.inputs import sequences
from tests.support.tiny import MODEL

ATTENTIONS = graph_io.OUTPUT_ATTENTIONS
# What framing may allocate beyond the answer's arrays: the JSON header and bookkeeping.
FRAMING_SLACK_BYTES = 64 * 1024


def test_sequences_that_fill_their_run_are_views_of_it(tiny_runtime: ModelRuntime) -> None:
    full = run_and_split(tiny_runtime, sequences((9, 9, 9), seed=0), graph_io.GRAPH_ATTENTION)
    base = full[0][ATTENTIONS].base
    assert base is not None  # a view, of the run's one buffer
    assert all(result[ATTENTIONS].base is base for result in full)
    ragged = run_and_split(tiny_runtime, sequences((9, 4), seed=0), graph_io.GRAPH_ATTENTION)
    assert all(result[ATTENTIONS].base is None for result in ragged)  # own copies, cut
    assert ragged[1][ATTENTIONS].shape[-2:] == (4, 4)


def test_every_map_in_order_is_the_runs_buffer_and_a_selection_a_copy() -> None:
    maps = np.random.default_rng(1).random((2, 4, 5, 5), dtype=np.float32)
    assert select_attention(maps, [0, 1], [0, 1, 2, 3], "none") is maps
    chosen = select_attention(maps, [1], [2, 0], "none")
    assert not np.shares_memory(chosen, maps)
    np.testing.assert_array_equal(chosen[0], maps[1, [2, 0]])


def test_one_unpadded_sequence_is_repadded_as_a_view() -> None:
    array = np.ones((2, 3, 6, 6), np.float32)
    assert np.shares_memory(repad([array], 6, (2, 3)), array)
    padded = repad([array], 8, (2, 3))
    assert padded.shape == (1, 2, 3, 8, 8) and not np.shares_memory(padded, array)


def test_a_binary_attention_answer_is_framed_without_copying_it(model_repository: Path) -> None:
    settings = layer_settings(model_repository)
    embeds = sequences((128,), seed=0)[0][None]  # [1, 128, d]
    header = json.dumps(
        {
            "inputs": [{"name": "inputs_embeds", "datatype": "FP32", "shape": list(embeds.shape),
                        "parameters": {"binary_data_size": embeds.nbytes}}],
            "outputs": [{"name": ATTENTIONS, "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    body = header + embeds.tobytes()

    async def answer(engine: Engine) -> tuple[int, int, bool]:
        info = engine.model(MODEL)
        with work_scope(engine) as scope:
            result, reply = await engine.handle(
                ENCODE, lambda: codec.infer_request(body, str(len(header)), info, "1"), scope
            )
            maps = result.outputs[0].attention
            assert maps is not None
            tracemalloc.start()
            framed = codec.infer_response(result, reply)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            tensor = framed.parts[1]
            shares = isinstance(tensor, memoryview) and np.shares_memory(
                np.frombuffer(tensor, np.float32), maps
            )
            return peak, maps.nbytes, shares

    allocated, answer_bytes, shares = with_started_engine(settings, answer)
    assert answer_bytes >= 512 * 1024  # [1, L, H, 128, 128] float32 maps: worth not copying
    assert shares  # the bytes sent are the run's own attention buffer
    assert allocated < FRAMING_SLACK_BYTES, (allocated, answer_bytes)
