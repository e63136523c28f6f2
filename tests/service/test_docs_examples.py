"""docs/api.md: every example runs against a live server, and the page covers the API.

```bash blocks run against the tiny model's server, or MiniLM's when marked
``# model: minilm-l6``; ```python blocks (the openai client, LangChain) run
against MiniLM's with ``ATTNSERVE_URL`` set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service import errors
from service.settings import Settings

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
TEXT = API_MD.read_text()
BLOCKS = re.findall(r"^```bash\n(.*?)^```", TEXT, flags=re.DOTALL | re.MULTILINE)
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```", TEXT, flags=re.DOTALL | re.MULTILINE)
EXPECT_ERROR = re.compile(r"^# expect error: (\w+)$", re.MULTILINE)
MINILM = "# model: minilm-l6"


def _block_id(block: str) -> str:
    path = re.search(r"\$ATTNSERVE_URL(/[\w/{}.-]*)", block)
    return path.group(1) if path else block[:20]


@pytest.fixture(scope="module")
def python3_on_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH whose ``python3`` is this interpreter, so the examples need no system Python."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python3").symlink_to(sys.executable)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def test_page_has_examples() -> None:
    assert len(BLOCKS) >= 10
    for block in BLOCKS:
        assert "$ATTNSERVE_URL" in block and "curl" in block, block
        first = next(line for line in block.splitlines() if not line.startswith("#"))
        assert first.startswith(("curl ", "python3 -c ")), block


@pytest.mark.parametrize("block", BLOCKS, ids=[_block_id(b) for b in BLOCKS])
def test_example_runs(
    block: str, server_url: str, python3_on_path: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("minilm_server_url") if MINILM in block else server_url
    env = {**os.environ, "ATTNSERVE_URL": url, "PATH": python3_on_path}
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + block],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    if "/metrics" in block:
        assert "attnserve_tokens_total" in done.stdout
        return
    answer = json.loads(done.stdout)
    expected = EXPECT_ERROR.search(block)
    if expected:
        # Native errors carry error_type; OpenAI's shape carries it as error.code.
        kind = answer["error_type"] if "error_type" in answer else answer["error"]["code"]
        assert kind == expected.group(1), answer
    else:
        assert "error" not in answer, answer


def test_page_has_python_examples() -> None:
    assert any("openai" in b for b in PYTHON_BLOCKS) and any(
        "langchain" in b for b in PYTHON_BLOCKS
    )


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.split("\n")[0] for b in PYTHON_BLOCKS])
def test_python_example_runs(block: str, minilm_server_url: str) -> None:
    env = {**os.environ, "ATTNSERVE_URL": minilm_server_url}
    done = subprocess.run(
        [sys.executable, "-c", block], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the example prints what it shows"


def test_examples_cover_every_endpoint(client: httpx.Client) -> None:
    paths = set(client.get("/openapi.json").json()["paths"])
    assert paths  # the API describes itself
    for path in paths:
        assert f"`{path}`" in TEXT or f" {path}`" in TEXT, f"{path} is not documented"
        pattern = re.sub(r"\\\{\w+\\\}", r"[\\w-]+", re.escape(path)) + r"(?![\w/])"
        assert any(re.search(r"\$ATTNSERVE_URL" + pattern, b) for b in BLOCKS), (
            f"no example for {path}"
        )


def test_every_setting_is_documented() -> None:
    for name in Settings.model_fields:
        assert f"ATTNSERVE_{name.upper()}" in TEXT, name


def test_every_error_type_is_documented() -> None:
    kinds: set[str] = set()
    todo: list[type[errors.ServiceError]] = [errors.ServiceError]
    while todo:
        cls = todo.pop()
        kinds.add(cls.error_type)
        todo.extend(cls.__subclasses__())
    for kind in kinds | {"not_found", "method_not_allowed"}:
        assert f"`{kind}`" in TEXT, kind
