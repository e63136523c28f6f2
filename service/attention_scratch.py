"""onnxruntime's attention scratch: the memory a sequence's attention needs while it runs,
which grows with the square of its length, and so the longest sequence a memory budget
affords.

Admission charges it to each request (``service.engine.limits``); a model's served
length is capped where one sequence's scratch would exceed the whole budget
(``service.model_info``), so a long-context model serves what the budget holds and
its start-up probe of that length stays within it.
"""

from __future__ import annotations

import math

from model_export.config import EncoderConfig

FLOAT32 = 4

# onnxruntime's working memory while one layer's attention runs, in [heads, T, T] float32
# maps per sequence of a run: scores, masked scores, softmax and what its kernels copy.
# Not an output, so not in ``work_bytes``; it grows with the square of the length (one
# 8,192-token sequence of a 12-head model: 3 GiB per map). Measured with
# ``bench.long_inputs`` on a 12-layer, 12-head model (docs/benchmarks.md, "Long inputs"):
# a pooled request's peak above a fresh server was 1.6 maps at 512 tokens, 2.6 at 2,048
# and 1.1 at 8,192; top-k attention's (each row's top k and summaries) 18 at 512 and
# 15.2 at 2,048. Rounded up.
SCRATCH_MAPS = 3
COMPACT_SCRATCH_MAPS = 20


def attention_scratch_bytes(
    lengths: list[int], cfg: EncoderConfig, batch_tokens: int, *, compact: bool = False
) -> int:
    """The attention scratch of the run that holds a request's longest sequence: that
    run's padded tokens (the longest alone, or up to ``batch_tokens`` of the request's
    sequences padded to it) times the longest, per head, ``SCRATCH_MAPS`` times (layers
    run one after another, so one layer's worth)."""
    longest = max(lengths, default=0)
    rows = max(longest, min(batch_tokens, len(lengths) * longest))
    maps = COMPACT_SCRATCH_MAPS if compact else SCRATCH_MAPS
    return FLOAT32 * maps * cfg.n_heads * rows * longest


def longest_affordable(cfg: EncoderConfig, budget: int) -> int:
    """The longest single sequence whose attention scratch (``SCRATCH_MAPS`` maps of
    [heads, n, n]) fits in ``budget`` bytes."""
    return math.isqrt(budget // (FLOAT32 * SCRATCH_MAPS * cfg.n_heads))
