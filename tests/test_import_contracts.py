"""The import contracts of ``[tool.importlinter]`` (``make lint``) can fail: each one,
given one planted import that breaches it, is the one contract broken.

The packages are copied to a temporary directory, one import is appended to one
module there, and ``lint-imports`` runs on the copy; the checkout is never touched.
A contract added to pyproject.toml without a plant here fails
``test_every_contract_has_a_plant``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "model_export", "attnserve_client")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# Contract name -> (module file, an import that breaches it and no other contract).
PLANTS = {
    "Data flows one way: protocols -> engine -> batcher -> inference thread -> runtime": (
        "service/runtime.py",
        "from service.engine import types",
    ),
    "Protocols translate wire formats: no onnxruntime, runtime or batcher of their own": (
        "service/protocols/wire.py",
        "import onnxruntime",
    ),
    "The engine never sees a web framework or a protocol": (
        "service/engine/types.py",
        "import uvicorn",  # fastapi would break the Open Inference model's contract too
    ),
    "Protocols only translate: no engine rule (limits, admission, post-processing) in them": (
        "service/protocols/http.py",
        "from service.engine import limits",
    ),
    "The gRPC and TEI protocols never read the settings (the engine tells them what applies)": (
        "service/protocols/tei/codec.py",
        "from service.settings import Settings",
    ),
    "Protocol folders are independent of each other (shared: http, wire, context, protocol)": (
        "service/protocols/kserve_grpc/errors.py",
        "from service.protocols.kserve_v2.errors import render",
    ),
    "The Open Inference Protocol's shared model serves its two transports and no other": (
        "service/protocols/tei/codec.py",
        "from service.protocols.open_inference import padding",
    ),
    "The Open Inference Protocol's shared model is framework-free": (
        "service/protocols/open_inference/tensors.py",
        "import fastapi",
    ),
    "The gRPC protocol imports no HTTP framework or HTTP plumbing": (
        "service/protocols/kserve_grpc/codec.py",
        "from service.protocols.http import Answer",
    ),
    "The server layer (uvicorn) never imports a protocol or the app": (
        "service/connection_guard.py",
        "from service.protocols.context import SCOPE_KEY",
    ),
    "A request's scope, which protocols hold, is no way into the batcher or the runtime": (
        "service/engine/scope.py",
        "from service.batcher import Batcher",
    ),
    "Nothing in the service imports torch (only the export step needs it)": (
        "service/metrics.py",
        "import torch",
    ),
    "The SDK stands alone": ("attnserve_client/_types.py", "import service"),
}


def contract_names() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [c["name"] for c in config["tool"]["importlinter"]["contracts"]]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the packages and pyproject.toml that plants may change."""
    copy = tmp_path_factory.mktemp("contracts")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", copy)
    return copy


def lint_imports(tree: Path) -> tuple[int, str]:
    """lint-imports on ``tree`` (its packages first on the path): exit status and the
    output with runs of whitespace joined (long contract names wrap)."""
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", "pyproject.toml"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": str(LINT_IMPORTS.parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def test_every_contract_has_a_plant() -> None:
    assert set(contract_names()) == set(PLANTS)


def test_the_copy_keeps_every_contract(tree: Path) -> None:
    """The positive control: unplanted, the copy is linted as the checkout is."""
    status, out = lint_imports(tree)
    assert status == 0, out
    assert f"Contracts: {len(PLANTS)} kept, 0 broken." in out


@pytest.mark.parametrize("name", list(PLANTS))
def test_a_planted_import_breaks_its_contract(tree: Path, name: str) -> None:
    path, line = PLANTS[name]
    module = tree / path
    original = module.read_text()
    module.write_text(f"{original}\n{line}  # planted\n")
    try:
        status, out = lint_imports(tree)
    finally:
        module.write_text(original)
    assert status != 0, out
    assert f"Contracts: {len(PLANTS) - 1} kept, 1 broken." in out, out
    assert f"{name} BROKEN" in out, out
