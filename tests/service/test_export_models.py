"""ATTNSERVE_EXPORT_MODELS: a checkpoint named at start is exported into the model
repository before the server listens, served under its name, and pinned: a second
start serves the export as it is, without exporting again (or torch). Every fault
is one line and the documented exit status, before anything listens.

The checkpoint is a small random BERT saved by ``save_pretrained`` with MiniLM's
tokenizer (tests/support/heads.py); its export, run by the server, takes about a
minute on two loaded cores, once per module. The first start names it by a Hub id,
read from a Hugging Face cache written in huggingface_hub's layout with
``HF_HUB_OFFLINE=1`` (tests/support/hub_cache.py): the one-command path, nothing
fetched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.__main__ import CANNOT_START
from service.exports import PIN_FILE
from tests.conftest import ServerFailed, free_port, running_server, server_process
from tests.support.heads import bert_encoder
from tests.support.hub_cache import add_commit, offline_env
from tests.support.wait import wait_until

# The export is part of the start: a minute alone, more beside other tests.
EXPORT_READY_TIMEOUT = 600.0
NAME = "tiny-bert"  # the checkpoint folder's name, so the model's
HUB_ID = f"attnserve-tests/{NAME}"  # the same checkpoint in an offline Hugging Face cache
COMMIT = "c0ffee" * 6 + "c0ff"


@dataclass(frozen=True)
class FirstStart:
    checkpoint: Path
    repository: Path
    encoded: dict[str, Any]
    log: str


# Python started with this on its path finds no torch: an image with the serve extra only.
NO_TORCH = """
import sys


class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NoTorch())
"""


@pytest.fixture
def without_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers started in this test cannot import torch (a sitecustomize on PYTHONPATH)."""
    site = tmp_path / "no-torch"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(site))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("checkpoints") / NAME
    bert_encoder(folder)
    return folder


@pytest.fixture(scope="module")
def offline_hub(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Iterator[str]:
    """The checkpoint cached as ``HUB_ID`` at ``COMMIT``; the module's servers (and
    their exporters) read that cache only."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    add_commit(cache, HUB_ID, COMMIT, checkpoint)
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("HF_")]:
            patch.delenv(key)
        for key, value in offline_env(cache).items():
            if key.startswith("HF_"):
                patch.setenv(key, value)
        yield HUB_ID


@pytest.fixture(scope="module")
def first_start(
    tmp_path_factory: pytest.TempPathFactory, checkpoint: Path, offline_hub: str
) -> FirstStart:
    """A server started on a repository that does not exist yet, naming the checkpoint
    by its Hub id."""
    repository = tmp_path_factory.mktemp("exported") / "models"
    with server_process(
        repository,
        export_models=offline_hub,
        log_level="info",
    ) as server:
        r = httpx.post(
            f"{server.url}/v1/encode",
            json={"inputs": ["Attention is all you need."], "pooling": "mean"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return FirstStart(checkpoint, repository, r.json(), server.log())


@pytest.mark.slow  # the export: a minute alone on 2 cores, shared by the module's slow tests
def test_first_start_exports_and_serves_it_by_its_name(first_start: FirstStart) -> None:
    exported = first_start.repository / NAME
    assert first_start.encoded["model"] == NAME  # the default model: the one named
    [item] = first_start.encoded["data"]
    assert item["tokens"][0] == "[CLS]" and len(item["pooled"]) == 32
    assert (exported / "config.json").is_file() and (exported / "tokenizer.json").is_file()
    pin = json.loads((exported / PIN_FILE).read_text())
    assert pin["spec"] == HUB_ID
    # The exporter resolved the id in the cache: its commit and files are on record.
    record = json.loads((exported / "config.json").read_text())["checkpoint"]
    assert (record["hub"], record["commit"]) == (HUB_ID, COMMIT), record
    assert "model.safetensors" in record["files"], record
    # The exporter's own output reached the server's log, before it listened.
    log = first_start.log
    assert f"export {NAME}: " in log and "wrote " in log, log
    assert log.index(f"export {NAME}: ") < log.index("ready: "), log


@pytest.mark.slow
def test_a_second_start_serves_the_pinned_export_without_torch(
    first_start: FirstStart, without_torch: None
) -> None:
    """Not exported again: the same directory (a new export replaces it by a rename)
    with the same manifest; and no torch was needed to find that out."""
    exported = first_start.repository / NAME
    before = (exported.stat().st_ino, (exported / "config.json").stat().st_mtime_ns)
    with server_process(first_start.repository, export_models=HUB_ID, log_level="info") as server:
        r = httpx.post(f"{server.url}/v1/encode", json={"inputs": ["a text"]}, timeout=30)
        assert r.status_code == 200 and r.json()["model"] == NAME, r.text
        log = server.log()
    assert f"model {NAME}: {exported} holds its pinned export: not exporting" in log, log
    assert f"export {NAME}: " not in log, log
    assert (exported.stat().st_ino, (exported / "config.json").stat().st_mtime_ns) == before


def _refused(repository: Path, **settings: str) -> str:
    """The start fails with CANNOT_START: its one ERROR line (no traceback)."""
    with (
        pytest.raises(ServerFailed) as failed,
        running_server(repository, **settings),
    ):
        pytest.fail("the server became ready")  # pragma: no cover
    log = failed.value.log
    assert failed.value.returncode == CANNOT_START, log
    assert "Traceback" not in log, log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, log
    return errors[0]


def test_an_export_without_torch_says_what_to_install(
    checkpoint: Path, tmp_path: Path, without_torch: None
) -> None:
    line = _refused(tmp_path / "models", export_models=str(checkpoint))
    assert "needs the export extra (torch not installed)" in line, line
    assert "pip install 'attnserve[export]'" in line, line
    assert not (tmp_path / "models").exists()


def test_a_folder_that_is_no_checkpoint_fails_the_start(tmp_path: Path) -> None:
    """The exporter's own one-line error, passed on with its exit status."""
    (tmp_path / "not-a-model").mkdir()
    line = _refused(tmp_path / "models", export_models=str(tmp_path / "not-a-model"))
    assert f"model not-a-model: exporting '{tmp_path / 'not-a-model'}' failed (exit 2)" in line
    assert "attnserve-export: error: " in line and "config.json" in line, line
    assert not (tmp_path / "models" / "not-a-model").exists()


@pytest.fixture
def exported_copy(first_start: FirstStart, tmp_path: Path) -> Iterator[Path]:
    """A repository holding a copy of the first start's export, its pin included."""
    repository = tmp_path / "copy"
    shutil.copytree(first_start.repository / NAME, repository / NAME)
    yield repository


def _pinned_elsewhere(repository: Path, checkpoint: Path, tmp: Path) -> tuple[str, str]:
    moved = tmp / "v2" / NAME  # the same name, another checkpoint
    shutil.copytree(checkpoint, moved)
    return str(moved), f"is pinned to '{HUB_ID}', not '{moved}'"


def _not_pinned(repository: Path, checkpoint: Path, tmp: Path) -> tuple[str, str]:
    (repository / NAME / PIN_FILE).unlink()  # an export run by hand
    return HUB_ID, "exists and was not written by ATTNSERVE_EXPORT_MODELS"


def _changed(repository: Path, checkpoint: Path, tmp: Path) -> tuple[str, str]:
    with (repository / NAME / "config.json").open("a") as f:
        f.write("\n")
    return HUB_ID, "changed since it was exported"


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [_pinned_elsewhere, _not_pinned, _changed], ids=lambda case: case.__name__[1:]
)
def test_a_directory_not_pinned_to_the_spec_is_kept(
    exported_copy: Path, checkpoint: Path, tmp_path: Path, case: Callable[..., tuple[str, str]]
) -> None:
    """Refused before any export runs: the directory is left as it was."""
    spec, says = case(exported_copy, checkpoint, tmp_path)
    before = {p.name: p.read_bytes() for p in (exported_copy / NAME).iterdir()}
    line = _refused(exported_copy, export_models=spec)
    assert says in line, line
    assert {p.name: p.read_bytes() for p in (exported_copy / NAME).iterdir()} == before


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ("..={checkpoint}", "a model name must be a plain file name"),
        (".x={checkpoint}", "a model name must be a plain file name"),
        ("a/../..={checkpoint}", "a model name must be a plain file name"),
        ("{tmp}/nowhere", "'{tmp}/nowhere' is not a checkpoint directory"),
        ("{checkpoint},{checkpoint}", f"model name '{NAME}' is given twice"),
        ("x=", "'x=' names no checkpoint"),
        ("-", "no model name in '-'"),
    ],
    ids=["dot-dot", "hidden", "slash-in-name", "missing-dir", "twice", "no-spec", "no-name"],
)
def test_a_refused_entry_is_one_line(
    checkpoint: Path, tmp_path: Path, entries: str, says: str
) -> None:
    """Refused before any export runs, nothing written."""
    fill = {"checkpoint": checkpoint, "tmp": tmp_path}
    line = _refused(tmp_path / "models", export_models=entries.format(**fill))
    assert says.format(**fill) in line, line
    assert not (tmp_path / "models").exists()


def _exporters(out: Path) -> list[int]:
    """Processes whose command line names ``out`` (the exporter writing it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if f"--out\0{out}\0".encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


@pytest.mark.slow  # waits for the exporter to start writing (torch's import)
def test_sigterm_during_the_export_stops_the_exporter(checkpoint: Path, tmp_path: Path) -> None:
    """No exporter left running, no directory left behind (its staging removed)."""
    repository = tmp_path / "models"
    env = {
        **os.environ,
        "ATTNSERVE_MODEL_REPOSITORY": str(repository),
        "ATTNSERVE_EXPORT_MODELS": str(checkpoint),
        "ATTNSERVE_PORT": str(free_port()),
        "ATTNSERVE_GRPC_PORT": "0",
        "ATTNSERVE_LOG_LEVEL": "warning",  # the pipe is read at the end only
    }
    command = [sys.executable, "-m", "service"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(
            lambda: any(repository.glob(f".{NAME}.*/*.onnx")) or proc.poll() is not None,
            "the exporter writing into its staging directory",
            timeout=EXPORT_READY_TIMEOUT,
        )
        assert proc.poll() is None and _exporters(repository / NAME)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == CANNOT_START
    assert f"attnserve cannot start: model {NAME}: the export was stopped" in err.decode()
    assert _exporters(repository / NAME) == []
    assert list(repository.iterdir()) == []


@pytest.mark.slow
def test_explicit_mode_loads_the_named_model_beside_the_default(
    exported_copy: Path, checkpoint: Path, tiny_model_dir: Path
) -> None:
    """``ATTNSERVE_DEFAULT_MODEL`` names another model: the exported one is loaded at
    start too, as if listed in ``ATTNSERVE_LOAD_MODELS``."""
    shutil.copytree(tiny_model_dir, exported_copy / "tiny")
    with running_server(
        exported_copy,
        export_models=HUB_ID,
        model_control="explicit",
        default_model="tiny",
    ) as url:
        index = httpx.post(f"{url}/v2/repository/index", json={}, timeout=10).json()
        r = httpx.post(f"{url}/v1/encode", json={"inputs": ["a text"], "model": NAME}, timeout=30)
        assert r.status_code == 200, r.text
    assert {m["name"]: m["state"] for m in index} == {NAME: "READY", "tiny": "READY"}, index
