"""The soak's requests: each one rebuilt from (seed, request id) alone."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.lib.http import Request
from bench.lib.workloads import b64_array
from bench.soak.config import (
    ABANDONED,
    ABANDONED_VARIANTS,
    ATTENTION,
    INVALID,
    INVALID_VARIANTS,
    OVERSIZED,
    OVERSIZED_VARIANTS,
    SLOW,
    SLOW_VARIANTS,
    VALID,
    Limits,
)


@dataclass(frozen=True, eq=False)
class Planned:
    """One request to send: its bytes, and what a correct answer holds (valid ones)."""

    rid: int  # unique per run; with the seed, it regenerates the request (``make``)
    cls: str
    variant: str
    body: bytes
    content_type: str = "application/json"
    sequences: tuple[np.ndarray, ...] = ()  # the inputs of a valid request, [n_i, d]
    attention: bool = False

    @property
    def valid(self) -> bool:
        return bool(self.sequences)

    @property
    def label(self) -> str:
        return f"{self.cls}/{self.variant}" if self.variant else self.cls

    @property
    def request(self) -> Request:
        """The HTTP/1.1 request, for the load client and raw sockets."""
        return Request("/v1/encode", self.body, (("Content-Type", self.content_type),))


class Requests:
    """Makes every request of a run; request ``rid`` depends only on (seed, rid)."""

    def __init__(self, limits: Limits, seed: int) -> None:
        self.limits, self.seed = limits, seed
        self._ids = itertools.count()

    def next(self, cls: str) -> Planned:
        rid = next(self._ids)
        rng = np.random.default_rng([self.seed, rid])
        variants = {
            INVALID: INVALID_VARIANTS,
            OVERSIZED: OVERSIZED_VARIANTS,
            SLOW: SLOW_VARIANTS,
            ABANDONED: ABANDONED_VARIANTS,
        }.get(cls, ("",))
        return self.make(rid, cls, variants[int(rng.integers(len(variants)))])

    def make(self, rid: int, cls: str, variant: str) -> Planned:
        rng = np.random.default_rng([self.seed, rid, 1])
        lim, d = self.limits, self.limits.d_model

        def seqs(count: int, longest: int) -> tuple[np.ndarray, ...]:
            lengths = rng.integers(1, longest + 1, size=count)
            return tuple(rng.standard_normal((int(n), d), dtype=np.float32) for n in lengths)

        def body(inputs: list[Any], **options: Any) -> bytes:
            return json.dumps({"inputs": inputs, **options}).encode()

        if cls in (VALID, ATTENTION) or (cls in (SLOW, ABANDONED) and variant):
            count = int(rng.integers(1, (lim.valid_sequences if cls != SLOW else 1) + 1))
            xs = seqs(count, lim.valid_len if cls != SLOW else 4)
            attention = cls == ATTENTION or (cls != VALID and bool(rng.integers(2)))
            as_b64 = bool(rng.integers(2))
            options: dict[str, Any] = {
                "encoding_format": "base64" if rng.integers(2) else "float",
            }
            if attention:
                options |= {"return_attention": True, "attention": {"reduce": "mean"}}
            wire = [b64_array(x) if as_b64 else x.tolist() for x in xs]
            return Planned(
                rid, cls, variant, body(wire, **options), sequences=xs, attention=attention
            )
        x = seqs(1, lim.valid_len)[0]
        if variant == "bad-json":
            data = body([x.tolist()])
            return Planned(rid, cls, variant, data[: len(data) // 2])
        if variant == "wrong-width":
            wide = rng.standard_normal((len(x), d + 1), dtype=np.float32)
            return Planned(rid, cls, variant, body([wide.tolist()]))
        if variant == "nan-base64":
            x[0, 0] = np.nan
            return Planned(rid, cls, variant, body([b64_array(x)]))
        if variant == "nan-json":  # json.dumps writes NaN, which is not JSON
            x[-1, -1] = np.nan
            return Planned(rid, cls, variant, body([x.tolist()]))
        if variant == "empty-sequence":
            return Planned(rid, cls, variant, body([[]]))
        if variant == "unknown-field":
            return Planned(rid, cls, variant, body([x.tolist()], colour="blue"))
        if variant == "unknown-model":
            return Planned(rid, cls, variant, body([x.tolist()], model=f"no-such-model-{rid}"))
        if variant == "bad-base64":
            return Planned(
                rid, cls, variant, body([{"shape": list(x.shape), "data": "not base64!"}])
            )
        if variant == "text-plain":
            return Planned(rid, cls, variant, body([x.tolist()]), content_type="text/plain")
        if variant == "too-many-sequences":
            ones = rng.standard_normal((lim.max_sequences + 1, 1, d), dtype=np.float32)
            return Planned(rid, cls, variant, body([b64_array(o) for o in ones]))
        if variant == "too-long":
            long = rng.standard_normal((lim.max_seq_len + 1, d), dtype=np.float32)
            return Planned(rid, cls, variant, body([b64_array(long)]))
        if variant == "too-many-tokens":
            each = min(lim.max_seq_len, lim.max_tokens)
            parts = rng.standard_normal((lim.max_tokens // each + 1, each, d), dtype=np.float32)
            return Planned(rid, cls, variant, body([b64_array(p) for p in parts]))
        if variant == "body-too-large":  # well-formed JSON, padded past the limit
            data = body([b64_array(x)])
            return Planned(rid, cls, variant, data + b" " * (lim.max_body_bytes + 1 - len(data)))
        raise ValueError(f"no request {cls}/{variant}")
