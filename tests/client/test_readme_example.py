"""README.md, section "## Python client": its ```python blocks run against a real server.

The blocks are written for the default model of ``make serve`` (minilm-l6, text
input) and take the server from ATTNSERVE_BASE_URL, as a reader's would; what
they compute is checked against what the README's comments say it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Python client"


def python_blocks() -> list[str]:
    text = README.read_text()
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.MULTILINE)[0]  # up to the next
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.DOTALL | re.MULTILINE)


def test_section_has_an_example() -> None:
    blocks = python_blocks()
    assert blocks
    assert any("from attnserve_client import" in b for b in blocks)


def test_examples_run(
    minilm_server_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTNSERVE_BASE_URL", minilm_server_url)
    monkeypatch.delenv("ATTNSERVE_API_KEY", raising=False)
    namespace: dict[str, object] = {"__name__": "readme_example"}
    for block in python_blocks():
        exec(compile(block, f"{README}:{SECTION}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "[CLS]" in out and "similarity:" in out, out
    # What the README's comments promise: (3, 384) unit vectors, the tokens of the first
    # text, and (6, 1, n, n) head-averaged attention (6 layers, one map, n tokens).
    vectors = namespace["vectors"]
    assert isinstance(vectors, np.ndarray) and vectors.shape == (3, 384), vectors
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=0, atol=1e-5)
    similar = vectors @ vectors.T
    assert similar[0, 1] > similar[0, 2] and similar[0, 1] > similar[1, 2], similar
    result = namespace["result"]
    tokens = result.tokens[0]  # type: ignore[attr-defined]
    assert tokens[:3] == ["[CLS]", "a", "man"] and tokens[-1] == "[SEP]", tokens
    maps = namespace["attention"].attention[0]  # type: ignore[attr-defined]
    n = len(namespace["attention"].tokens[0])  # type: ignore[attr-defined]
    assert maps.shape == (6, 1, n, n), maps.shape
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, rtol=0, atol=1e-5)
