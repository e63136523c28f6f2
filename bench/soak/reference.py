"""The soak's check of a 2xx answer: onnxruntime in this process, each sequence alone."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.reference import SequenceReference
from bench.soak.requests import Planned


class Reference:
    """onnxruntime on the model directory's graphs, each sequence run alone (no padding)."""

    def __init__(self, model_dir: Path, atol: float) -> None:
        self.atol = atol
        self.largest = 0.0  # the largest difference of an answer within atol
        self._lock = threading.Lock()  # check() runs in several threads
        self.graphs = SequenceReference(model_dir, threads=1)

    def expected(self, x: np.ndarray, attention: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(embeddings [n, d], head-averaged attention [L, 1, n, n] or None) of one sequence."""
        hidden, maps = self.graphs.run(x, attention)  # (n, d), (L, H, n, n)
        return hidden, (maps.mean(axis=1, keepdims=True) if maps is not None else None)

    def check(self, planned: Planned, answer: bytes) -> str | None:
        """None if ``answer`` is the right one for ``planned``, else what is wrong."""
        try:
            data = json.loads(answer)["data"]
        except (ValueError, KeyError, TypeError) as exc:
            return f"unreadable answer ({exc!r}): {answer[:200]!r}"
        if not isinstance(data, list):
            return f"data is {type(data).__name__}, not a list"
        if len(data) != len(planned.sequences):
            return f"{len(data)} items answer {len(planned.sequences)} sequences"
        for i, (item, x) in enumerate(zip(data, planned.sequences, strict=True)):
            hidden, maps = self.expected(x, planned.attention)
            try:
                if item.get("index") != i:
                    return f"data[{i}].index is {item.get('index')!r}"
                for name, want in (("embeddings", hidden), ("attention", maps)):
                    got = item.get(name)
                    if want is None:
                        if got is not None:
                            return f"data[{i}].{name} not asked for, yet answered"
                        continue
                    if got is None:
                        return f"data[{i}].{name} missing"
                    error = self._compare(as_array(got), want)
                    if error:
                        return f"data[{i}].{name}: {error}"
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                return f"data[{i}] unreadable: {exc!r}"
        return None

    def _compare(self, got: np.ndarray, want: np.ndarray) -> str | None:
        if got.shape != want.shape:
            return f"shape {list(got.shape)}, expected {list(want.shape)}"
        diff = float(np.max(np.abs(got - want), initial=0.0))
        if not diff <= self.atol:  # NaN fails too
            return f"max |difference| {diff:.3g} from onnxruntime > atol {self.atol:g}"
        with self._lock:
            self.largest = max(self.largest, diff)
        return None


def as_array(value: Any) -> np.ndarray:
    """An answered array (nested floats or a base64 object) as float32."""
    if isinstance(value, dict):
        if value.get("dtype", "float32") != "float32":
            raise ValueError(f"dtype {value.get('dtype')!r}")
        raw = base64.b64decode(value["data"], validate=True)
        return np.frombuffer(raw, dtype="<f4").reshape(value["shape"]).astype(np.float32)
    return np.asarray(value, dtype=np.float32)
