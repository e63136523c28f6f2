"""Sentence embeddings as a client gets them from a real server."""

from __future__ import annotations

import base64

import httpx
import numpy as np


def sentence_embeddings(url: str, model: str, texts: list[str]) -> np.ndarray:
    """POST /v1/embeddings for ``texts`` as base64 (asserts 200): float32 [n, d]."""
    r = httpx.post(
        f"{url}/v1/embeddings",
        json={"model": model, "input": texts, "encoding_format": "base64"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])
