"""What one onnxruntime run is given beyond its sequences, and the padding of a run's
sequences into one batch (no onnxruntime here: service/runtime.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class RunOptions:
    """What a run feeds its graph beyond the sequences: the compact graph's ``top_k``,
    and the selected-maps graph's layers (ascending), heads (in answer order) and
    dtype (``half``: float16); a model with task adapters' ``task`` (the graphs' task
    id, 0: none). Runs share a graph only with jobs of the same selection and task
    (``selection``); their k is the largest of theirs."""

    top_k: int = 1
    layers: tuple[int, ...] | None = None  # None: every layer
    heads: tuple[int, ...] | None = None  # None: every head
    half: bool = False
    # Give the run's arena growth back to the system afterwards (calibration's full batch:
    # its timing must not leave idle memory reserved for good).
    shrink_arena: bool = False
    # The lane whose own session runs it (service/lane_sessions.py); None, or a graph
    # without lane sessions: the graph's own session.
    lane_session: int | None = None
    task: int = 0

    @property
    def selection(self) -> tuple[object, ...]:
        return (self.layers, self.heads, self.half, self.task)

    def kept_maps(self, n_layers: int, n_heads: int) -> int:
        """(layer, head) maps the selected-maps graph returns."""
        layers = n_layers if self.layers is None else len(self.layers)
        return layers * (n_heads if self.heads is None else len(self.heads))

    def with_top_k(self, top_k: int) -> RunOptions:
        return replace(self, top_k=top_k)


# A run with nothing to feed beyond its sequences (every graph but the compact ones).
PLAIN_RUN = RunOptions()


def pad(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Zero-pad [n_i, ...] arrays into one [B, T, ...] batch, with an int64 1/0 mask [B, T]."""
    longest = max(len(s) for s in sequences)
    first = sequences[0]
    batch = np.zeros((len(sequences), longest, *first.shape[1:]), dtype=first.dtype)
    mask = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, seq in enumerate(sequences):
        batch[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return batch, mask
