"""Request bodies and inputs that several benchmarks send alike."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

# Words that are one token each in MiniLM's uncased WordPiece vocabulary: texts made of
# them have a known length. The cache benchmarks draw from the first list, the
# starvation probe from the second (each list as it was measured with).
BANK_WORDS = (
    *("river", "bank", "money", "loan", "water", "stream", "account", "deposit", "flood"),
    *("bridge", "boat", "credit", "fish", "interest", "rate", "current", "flow", "branch"),
    *("teller", "vault", "shore"),
)
ONE_TOKEN_WORDS = (
    *BANK_WORDS[:18],
    *("shore", "city", "house", "light", "music", "paper", "road", "school", "table"),
)


def b64_array(array: np.ndarray) -> dict[str, Any]:
    """Our wire's base64 array: ``{"shape", "data"}`` of little-endian float32."""
    le = np.ascontiguousarray(array, dtype="<f4")
    return {"shape": list(le.shape), "data": base64.b64encode(le.tobytes()).decode("ascii")}


def encode_body(seqs: list[np.ndarray], encoding: str, reduce: str | None = None) -> bytes:
    """A /v1/encode body: one item per sequence, base64 or nested floats, attention
    maps asked for with ``reduce`` (none, mean…) unless None."""
    items = [b64_array(s) if encoding == "base64" else s.tolist() for s in seqs]
    body: dict[str, Any] = {"inputs": items, "encoding_format": encoding}
    if reduce is not None:
        body |= {"return_attention": True, "attention": {"reduce": reduce}}
    return json.dumps(body).encode()
