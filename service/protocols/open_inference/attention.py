"""Attention over the Open Inference Protocol: its parameters, and its outputs framed as
tensors of one shape for the whole batch.

Parameters (each optional): ``attention_measure`` (weights, norms), ``attention_layers``
and ``attention_heads`` (comma-separated indices, negative from the end; default all),
``attention_top_k`` (int), ``attention_threshold`` (float in [0, 1]), ``attention_dtype``
(FP32, FP16), ``attention_summaries`` (comma-separated names of ``graph_io.SUMMARIES``)
and ``attention_summaries_per_token`` (bool). Outputs:

- ``attentions``: FP32 (or FP16) [batch, L', H', seq, seq] of the chosen layers and
  heads, or with top-k/threshold the kept values [batch, L', H', seq, k];
- ``attention_indices``: INT32 [batch, L, H, seq, k], their keys (-1: none kept);
- ``attention_summaries``: FP32 [batch, S, L, H] in the order asked, or
  [batch, S, L, H, seq] per token.

A thresholded answer's k is its fullest row's over the batch; rows, sequences and
padding beyond what a sequence kept hold value 0 and key -1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_export.manifest import graph_io
from service.engine import AttentionSpec, SequenceOutput
from service.errors import InvalidInput, quoted
from service.protocols import wire
from service.protocols.open_inference.padding import repad

OUTPUT_INDICES = "attention_indices"
OUTPUT_SUMMARIES = "attention_summaries"
OUTPUTS = (OUTPUT_INDICES, OUTPUT_SUMMARIES)
MEASURES = ("weights", "norms")
DTYPES = {"FP32": "float32", "FP16": "float16"}
NO_KEY = -1
# Layer or head indices a parameter may list: more than any model has is refused later.
MAX_INDICES = 1024
INDEX = re.compile(r" *-?[0-9]{1,6} *")  # ASCII digits: int() would take others too


@dataclass(frozen=True)
class AttentionParameters:
    """The request's attention parameters, as framed (checked by ``spec``)."""

    measure: Any = "weights"
    top_k: Any = None
    threshold: Any = None
    dtype: Any = "FP32"
    summaries: Any = ""
    summaries_per_token: Any = False
    layers: Any = None
    heads: Any = None

    @classmethod
    def of(cls, params: dict[str, Any]) -> AttentionParameters:
        return cls(
            params.get("attention_measure", "weights"),
            params.get("attention_top_k"),
            params.get("attention_threshold"),
            params.get("attention_dtype", "FP32"),
            params.get("attention_summaries", ""),
            params.get("attention_summaries_per_token", False),
            params.get("attention_layers"),
            params.get("attention_heads"),
        )

    def spec(self, outputs: dict[str, bool]) -> AttentionSpec:
        """The engine's attention spec for the requested ``outputs``; 422 on a bad value."""
        if self.measure not in MEASURES:
            raise InvalidInput(
                f"parameters.attention_measure must be one of {MEASURES}, got "
                f"{quoted(self.measure)}"
            )
        if self.top_k is not None and (isinstance(self.top_k, bool) or not _integer(self.top_k)):
            raise InvalidInput("parameters.attention_top_k must be an integer")
        threshold = self.threshold
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, int | float)
        ):
            raise InvalidInput("parameters.attention_threshold must be a number in [0, 1]")
        if self.dtype not in DTYPES:
            raise InvalidInput(
                f"parameters.attention_dtype must be one of {list(DTYPES)}, got "
                f"{quoted(self.dtype)}"
            )
        if not isinstance(self.summaries, str):
            raise InvalidInput("parameters.attention_summaries must be a comma-separated string")
        if not isinstance(self.summaries_per_token, bool):
            raise InvalidInput("parameters.attention_summaries_per_token must be a boolean")
        summaries = tuple(s.strip() for s in self.summaries.split(",")) if self.summaries else ()
        if "" in summaries:  # as the index lists: "entropy,,first" is a mistake, not two names
            raise InvalidInput(
                "parameters.attention_summaries must be comma-separated names without empty "
                f"items, got {quoted(self.summaries)}"
            )
        if (OUTPUT_SUMMARIES in outputs) != bool(summaries):
            raise InvalidInput(
                f"output {OUTPUT_SUMMARIES!r} and parameters.attention_summaries go together"
            )
        sparse = self.top_k is not None or threshold is not None
        if OUTPUT_INDICES in outputs and not sparse:
            raise InvalidInput(
                f"output {OUTPUT_INDICES!r} needs parameters.attention_top_k or attention_threshold"
            )
        return AttentionSpec(
            layers=_indices("attention_layers", self.layers),
            heads=_indices("attention_heads", self.heads),
            measure=self.measure,
            top_k=None if self.top_k is None else int(self.top_k),
            threshold=None if threshold is None else float(threshold),
            dtype=DTYPES[self.dtype],
            maps=graph_io.OUTPUT_ATTENTIONS in outputs or not asks_attention(outputs),
            summaries=summaries,
            summaries_per_token=self.summaries_per_token,
        )


def _indices(name: str, value: Any) -> list[int] | None:
    """A comma-separated list of integers (the engine bounds and checks each)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    parts = value.split(",") if isinstance(value, str) else None
    if parts is None or len(parts) > MAX_INDICES or not all(map(INDEX.fullmatch, parts)):
        raise InvalidInput(
            f"parameters.{name} must be comma-separated integers (at most {MAX_INDICES}), "
            f"got {quoted(value)}"
        )
    return [int(p) for p in parts]


def _integer(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def asks_attention(outputs: dict[str, bool]) -> bool:
    return any(n in outputs for n in (graph_io.OUTPUT_ATTENTIONS, OUTPUT_INDICES, OUTPUT_SUMMARIES))


def output(outs: list[SequenceOutput], name: str, length: int) -> np.ndarray:
    """One attention output of the batch, padded to ``length`` tokens."""
    if name == OUTPUT_SUMMARIES:
        per_sequence = [
            np.stack(list(o.attention_summaries.values()))
            for o in outs
            if o.attention_summaries is not None
        ]  # each [S, L', H'] or [S, L', H', n]
        axes = (3,) if per_sequence[0].ndim == 4 else ()
        return wire.float32_le(repad(per_sequence, length, axes))
    maps = [o.attention for o in outs if o.attention is not None]
    indices = [o.attention_indices for o in outs if o.attention_indices is not None]
    if not indices:  # full maps [L', H', n, n]
        return wire.little_endian(repad(maps, length, graph_io.TOKEN_AXES[name]))
    width = max(i.shape[-1] for i in indices)  # thresholded rows differ per sequence
    if name == OUTPUT_INDICES:
        padded = [_widen(i, width, NO_KEY) for i in indices]
        out = np.full((len(padded), *padded[0].shape[:2], length, width), NO_KEY, np.int32)
    else:
        padded = [_widen(m, width, 0) for m in maps]
        out = np.zeros((len(padded), *padded[0].shape[:2], length, width), padded[0].dtype)
    for row, array in enumerate(padded):
        out[row, :, :, : array.shape[2]] = array
    return wire.little_endian(out)


def _widen(array: np.ndarray, width: int, fill: int) -> np.ndarray:
    """[.., n, k] -> [.., n, width], the new places ``fill``."""
    if array.shape[-1] == width:
        return array
    out = np.full((*array.shape[:-1], width), fill, dtype=array.dtype)
    out[..., : array.shape[-1]] = array
    return out
