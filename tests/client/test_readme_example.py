"""README.md, section "## Python client": its ```python blocks run against a real server.

The blocks are written for the default model of ``make serve`` (minilm-l6, text
input) and take the server from ATTNSERVE_BASE_URL, as a reader's would.
"""

from __future__ import annotations

import re
from pathlib import Path

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
