"""The one thread every onnxruntime run of the process goes to.

Requests' runs, the token embeddings of text asking for attention or hidden
states, the warm-up of a model being loaded and the timing of calibration
shapes all run here, one at a time, each with every intra-op thread: on a
small CPU, concurrent onnxruntime runs only fight over the same cores. Outputs
are cut back per sequence here too, so no copy blocks the event loop.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np

from model_export.manifest import graph_io
from service.runtime import ModelRuntime, pad

# One sequence's outputs by name, trimmed to its n tokens: last_hidden_state [n, d],
# attentions [L, H, n, n], hidden_states [L + 1, n, d], value_norms [L, H, n] (the last
# three when its graph has them).
SequenceResult = dict[str, np.ndarray]


# Shapes (sequences, tokens) timed per graph at warm-up, so the run planner has a cost
# model before the first request (each is run twice; the first pays allocations). The
# graphs with attention or hidden-state outputs get small shapes only: onnxruntime's
# arena keeps what a run needed, and their outputs grow with B·T² (with all of them,
# idle RSS was 540 MB instead of 300); their live runs refine the fit.
CALIBRATION_SHAPES = ((1, 8), (1, 64), (8, 16), (4, 32), (2, 128), (4, 96))
SMALL_CALIBRATION_SHAPES = ((1, 8), (1, 32), (4, 8), (2, 32), (1, 64), (4, 16))


def calibration_shapes(graph: str) -> tuple[tuple[int, int], ...]:
    """The (sequences, tokens) shapes timed for ``graph`` before its first request."""
    large = graph in (graph_io.GRAPH_EMBEDDINGS, graph_io.GRAPH_TEXT)
    return CALIBRATION_SHAPES if large else SMALL_CALIBRATION_SHAPES


class InferenceThread:
    """A single worker thread; each method awaits its work there."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")

    async def run(
        self, runtime: ModelRuntime, sequences: list[np.ndarray], graph: str
    ) -> list[SequenceResult]:
        """``sequences`` through ``graph`` as one padded run, cut back per sequence."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, partial(run_and_split, runtime, sequences, graph)
        )

    async def time(self, runtime: ModelRuntime, graph: str, batch: int, longest: int) -> float:
        """Seconds of one run of ``batch`` sequences of ``longest`` tokens (run twice: the
        first pays the allocations)."""
        sequences = [runtime.sample_sequence(graph, longest)] * batch
        await self.run(runtime, sequences, graph)
        start = time.monotonic()
        await self.run(runtime, sequences, graph)
        return time.monotonic() - start

    async def warm_up(self, runtime: ModelRuntime) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, runtime.warmup)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _trim(value: np.ndarray, axes: tuple[int, ...], n: int) -> np.ndarray:
    """A copy of ``value`` cut to its first ``n`` tokens along ``axes``."""
    index = [slice(None)] * value.ndim
    for axis in axes:
        index[axis] = slice(0, n)
    return value[tuple(index)].copy()


def run_and_split(
    runtime: ModelRuntime, sequences: list[np.ndarray], graph: str
) -> list[SequenceResult]:
    """Pad, run and cut the outputs back per sequence, all on the inference thread.

    When every sequence fills the run (one sequence, or equal lengths) each gets a
    view of its row: no copy, and the run's tensors are exactly the answers'. Else
    each is copied out, cut to its length, so the run's full [B, L, H, T, T] tensor
    is freed now, not when the last response is serialised; and none of this
    copying blocks the event loop.
    """
    embeds, mask = pad(sequences)
    outputs = runtime.run(embeds, mask, graph)
    if all(len(seq) == embeds.shape[1] for seq in sequences):
        return [
            {name: value[row] for name, value in outputs.items()} for row in range(len(sequences))
        ]
    return [
        {
            name: _trim(value[row], graph_io.TOKEN_AXES[name], len(seq))
            for name, value in outputs.items()
        }
        for row, seq in enumerate(sequences)
    ]
