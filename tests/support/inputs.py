"""Random inputs for the tiny model: one generator, so one seed means one input everywhere."""

from __future__ import annotations

import numpy as np

from tests.support.tiny import D_MODEL


def sequences(lengths: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Random float32 [n_i, D_MODEL] sequences, one per length (the same numbers as
    ``model_export.validate.make_inputs`` with that seed, unpadded)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, D_MODEL), dtype=np.float32) for n in lengths]


def ragged_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[3, 7, d] embeddings, right-padded rows of 7, 4 and 2 tokens (padding holds noise),
    and their [3, 7] int64 mask: a batch as a tensor protocol (/v2, gRPC) sends it."""
    rng = np.random.default_rng(seed)
    embeds = rng.standard_normal((3, 7, D_MODEL)).astype(np.float32)
    mask = (np.arange(7)[None, :] < np.array([7, 4, 2])[:, None]).astype(np.int64)
    return embeds, mask
