"""``python -m model_export``: help, argument errors, and real export runs in a subprocess.

Most subprocesses import torch (~2 s of CPU each), so the
``runs`` fixture starts all of this module's invocations at once and each test
waits for its own: the module costs a few seconds instead of one import per test.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import pytest
import torch

from model_export import cli, graph_io
from model_export.cli import main
from model_export.config import EncoderConfig, preset
from model_export.manifest import FORMAT_VERSION, Manifest
from model_export.model import Encoder
from tests.model_export.reference import ragged_batch
from tests.support.onnx_runs import new_session

PARITY_ATOL = 1e-4  # ONNX Runtime vs PyTorch, fp32 (observed ~1e-6)
CASES = ("single token", "one sequence", "equal batch", "ragged batch with padding", "long ragged")
EXPORT = [sys.executable, "-m", "model_export"]
# A bound for a hung export, not a measure: the exports run side by side, on a 2-core
# machine that may be loaded.
EXPORT_SECONDS = 900

# Bad arguments: (args, the message the single stderr line must contain).
BAD_ARGUMENTS: dict[str, tuple[list[str], str]] = {
    "d_model-vs-heads": (
        ["--d-model", "10", "--n-heads", "3"],
        "d_model (10) must be divisible by n_heads (3)",
    ),
    "opset": (["--preset", "tiny", "--opset", "12"], "--opset must be >= 17, got 12"),
    "weights": (["--preset", "tiny", "--weights", "/nonexistent/w.pt"], "--weights file not found"),
}
# The architecture of the --weights run: overrides on top of --preset tiny.
WEIGHTS_CONFIG: EncoderConfig = preset("tiny", n_layers=1, causal=True, window=3)


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


class CliRuns:
    """Subprocesses started together; ``result(name)`` waits for one of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._procs: dict[str, tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = {}

    def start(self, name: str, argv: list[str]) -> None:
        assert name not in self._procs, name
        # Files rather than pipes: nothing blocks on a full pipe while we wait on another run.
        out = (self.root / f"{name}.stdout").open("w+b")
        err = (self.root / f"{name}.stderr").open("w+b")
        self._procs[name] = (subprocess.Popen(argv, stdout=out, stderr=err), out, err)

    def result(self, name: str) -> Finished:
        proc, out, err = self._procs[name]
        returncode = proc.wait(timeout=EXPORT_SECONDS)
        out.seek(0)
        err.seek(0)
        return Finished(returncode, out.read().decode(), err.read().decode())

    def close(self) -> None:
        for proc, out, err in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()


def heavy_weights(config: EncoderConfig) -> Encoder:
    """An encoder with O(1) weights, so that a run ignoring them shows in the output."""
    encoder = Encoder(config, seed=99)
    with torch.no_grad():
        for name, param in encoder.named_parameters():
            if "norm" not in name and not name.endswith("bias"):
                param.mul_(25.0)
    return encoder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliRuns]:
    root = tmp_path_factory.mktemp("cli")
    torch.save(heavy_weights(WEIGHTS_CONFIG).state_dict(), root / "weights.pt")
    code = "import sys, model_export.cli; sys.exit(int('torch' in sys.modules))"
    invocations: dict[str, list[str]] = {
        "help": [*EXPORT, "--help"],
        **{
            name: [*EXPORT, "--out", str(root / name), *args]
            for name, (args, _) in BAD_ARGUMENTS.items()
        },
        "bad-choice": [*EXPORT, "--out", str(root / "bad-choice"), "--preset", "huge"],
        "export": [
            *EXPORT, "--preset", "tiny", "--exporter", "torchscript", "--seed", "7",
            "--out", str(root / "tiny-cli"),
        ],
        "weights-run": [
            *EXPORT, "--preset", "tiny", "--n-layers", "1", "--causal", "--window", "3",
            "--weights", str(root / "weights.pt"), "--exporter", "torchscript",
            "--name", "demo", "--out", str(root / "local"),
        ],
        "import-cli": [sys.executable, "-c", code],
        # The default exporter, whose registry logs that torchvision is missing.
        "dynamo": [
            *EXPORT, "--preset", "tiny", "--n-layers", "1",
            "--out", str(root / "dynamo"),
        ],
    }  # fmt: skip
    runs = CliRuns(root)
    try:
        for name, argv in invocations.items():
            runs.start(name, argv)
        yield runs
    finally:
        runs.close()


def onnx_hidden(model_dir: Path, embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
    session = new_session(model_dir / graph_io.GRAPH_EMBEDDINGS)
    (hidden,) = session.run(
        [graph_io.OUTPUT_HIDDEN], {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
    )
    assert isinstance(hidden, np.ndarray)
    result: np.ndarray = hidden
    return result


def torch_hidden(encoder: Encoder, embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        hidden = encoder(torch.from_numpy(embeds), torch.from_numpy(mask), weights=False).hidden
    result: np.ndarray = hidden.numpy()
    return result


def model_files(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.iterdir())


def test_help_exits_zero(runs: CliRuns) -> None:
    run = runs.result("help")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: attnserve-export")
    for flag in ("--out", "--preset", "--weights", "--window", "--scoring", "--opset", "--atol"):
        assert flag in run.stdout
    assert "{dynamo,torchscript}" in run.stdout
    assert run.stderr == ""


@pytest.mark.parametrize("name", list(BAD_ARGUMENTS))
def test_bad_arguments_give_one_clear_line(runs: CliRuns, name: str) -> None:
    run = runs.result(name)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr  # no traceback, no log noise
    assert lines[0].startswith("attnserve-export: error: ")
    assert BAD_ARGUMENTS[name][1] in lines[0]
    assert run.stdout == ""
    assert not (runs.root / name).exists()  # nothing written
    assert not list(runs.root.glob(f".{name}.*"))


def test_argparse_errors_exit_two(runs: CliRuns) -> None:
    run = runs.result("bad-choice")
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("attnserve-export: error: argument --preset: invalid choice: 'huge'")
    assert "Traceback" not in run.stderr
    assert not (runs.root / "bad-choice").exists()


def test_cli_exports_and_prints_the_validation_table(runs: CliRuns) -> None:
    run = runs.result("export")
    assert run.returncode == 0, run.stderr
    out_dir = runs.root / "tiny-cli"
    assert {*graph_io.GRAPH_OUTPUTS, graph_io.CONFIG_FILE} <= set(model_files(out_dir))
    assert len(graph_io.GRAPH_OUTPUTS) == 5  # model, model_hidden, model_attn, compact, select
    assert not list(runs.root.glob(".tiny-cli.*"))  # no staging directory left

    lines = run.stdout.splitlines()
    assert lines[0].split() == ["graph", "case", "output", "shape", "max|diff|", "ok"]
    rows = [line for line in lines if line.startswith(tuple(graph_io.GRAPH_OUTPUTS))]
    assert len(rows) == len(CASES) * 14  # (1 + 2 + 4 + 4 + 3) outputs per case
    assert all(row.endswith("  yes") for row in rows)
    for case in CASES:
        assert sum(case in row for row in rows) == 14
    for graph, outputs in graph_io.GRAPH_OUTPUTS.items():  # every output of every graph
        for output in outputs:
            checked = [r for r in rows if r.split()[0] == graph and f" {output} " in r]
            assert len(checked) == len(CASES), (graph, output)
    assert f"wrote {out_dir} in " in run.stdout

    config = json.loads((out_dir / graph_io.CONFIG_FILE).read_text())
    assert config["name"] == "tiny-cli"
    assert config["seed"] == 7
    assert config["weights_source"] == "random(seed=7)"
    assert config["exporter"]["exporter"] == "torchscript"
    assert config["architecture"] == preset("tiny").to_dict()
    for graph in graph_io.GRAPH_OUTPUTS:  # the printed digest prefix is the recorded one
        assert f"sha256 {config['graphs'][graph]['sha256'][:16]}" in run.stdout

    # The graph holds the seed-7 weights.
    embeds, mask = ragged_batch((6, 3), 32, seed=0)
    expected = torch_hidden(Encoder(preset("tiny"), seed=7), embeds, mask)
    np.testing.assert_allclose(
        onnx_hidden(out_dir, embeds, mask), expected, rtol=0, atol=PARITY_ATOL
    )


def test_cli_weights_and_architecture_overrides(runs: CliRuns) -> None:
    run = runs.result("weights-run")
    assert run.returncode == 0, run.stderr
    out_dir = runs.root / "local"
    recorded = json.loads((out_dir / graph_io.CONFIG_FILE).read_text())
    assert recorded["architecture"] == WEIGHTS_CONFIG.to_dict()
    assert recorded["name"] == "demo"
    assert recorded["seed"] is None
    assert recorded["weights_source"] == str(runs.root / "weights.pt")

    source = Encoder(WEIGHTS_CONFIG, seed=0)
    source.load_state_dict(torch.load(runs.root / "weights.pt", weights_only=True))
    embeds, mask = ragged_batch((9, 4, 1), WEIGHTS_CONFIG.d_model, seed=1)
    got = onnx_hidden(out_dir, embeds, mask)
    np.testing.assert_allclose(got, torch_hidden(source, embeds, mask), rtol=0, atol=PARITY_ATOL)
    # And not the seed-0 random init the CLI would otherwise have used.
    seeded = torch_hidden(Encoder(WEIGHTS_CONFIG, seed=0), embeds, mask)
    assert np.abs(got - seeded).max() > 100 * PARITY_ATOL


def test_importing_the_cli_does_not_import_torch(runs: CliRuns) -> None:
    assert runs.result("import-cli").returncode == 0


def test_an_export_prints_nothing_on_stderr_but_its_progress(runs: CliRuns) -> None:
    """No third-party notice a user cannot act on (torch's about torchvision: ~20 lines)."""
    run = runs.result("dynamo")
    assert run.returncode == 0, run.stderr
    assert (
        json.loads((runs.root / "dynamo" / graph_io.CONFIG_FILE).read_text())["exporter"][
            "exporter"
        ]
        == "dynamo"
    )
    lines = run.stderr.splitlines()
    assert lines and all(line.startswith("attnserve-export: dynamo: ") for line in lines), lines
    assert f"wrote {runs.root / 'dynamo'} in " in run.stdout


def test_an_export_shows_each_step_as_it_starts(runs: CliRuns) -> None:
    """Not on a terminal (a file here, as in CI or `make serve` piped): one line per step,
    in order, each saying its stage's k/n, its graph and the time so far and left."""
    run = runs.result("export")
    assert run.returncode == 0, run.stderr
    graphs = list(graph_io.GRAPH_OUTPUTS)  # five: no tokenizer, so no text graphs
    want = [
        *(f"export {k}/5 {graph}" for k, graph in enumerate(graphs, 1)),
        *(f"optimize {k}/5 {graph}" for k, graph in enumerate(graphs, 1)),
        f"write 1/1 {graph_io.WEIGHTS_FILE}",
        "validate 1/6 PyTorch's outputs",
        *(f"validate {k}/6 {graph}" for k, graph in enumerate(graphs, 2)),
    ]
    lines = run.stderr.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"attnserve-export: tiny-cli: {step}" for step in want
    ], run.stderr
    assert lines[0].endswith("(0 s, time left: after the first step)")
    assert all(
        re.search(r" \(\d+( min \d\d)? s, about \d+( min \d\d)? s left\)$", line)
        for line in lines[1:]
    )
    assert "\r" not in run.stderr  # no bar: that is for a terminal


def test_only_the_torchvision_notice_is_dropped() -> None:
    """The control: torch's exporter logs it where the filter sits, and nothing else of
    that logger is dropped."""
    import torch.onnx._internal.exporter._registration as registration

    assert registration.logger.name == cli.TORCHVISION_NOTICE_LOGGER
    source = Path(registration.__file__).read_text()
    assert f'logger.warning("{cli.TORCHVISION_NOTICE}. Skipping %s"' in source
    notice = logging.LogRecord(
        registration.logger.name, logging.WARNING, "", 0, cli.TORCHVISION_NOTICE + ". Skipping %s",
        ("torchvision::nms",), None,
    )  # fmt: skip
    other = logging.LogRecord(
        registration.logger.name, logging.WARNING, "", 0, "something else: %s", ("x",), None
    )
    assert not cli._without_torchvision_notice(notice)
    assert cli._without_torchvision_notice(other)


@pytest.fixture
def restore_torch_logger() -> Iterator[None]:
    # cli.main() adds a filter to a torch logger; keep the test process as it was.
    logger = logging.getLogger(cli.TORCHVISION_NOTICE_LOGGER)
    filters = list(logger.filters)
    yield None
    logger.filters[:] = filters


@pytest.mark.parametrize("case", ["negative-atol", "weights-of-another-architecture"])
@pytest.mark.usefixtures("restore_torch_logger")
def test_cli_failures_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    args = ["--preset", "tiny", "--exporter", "torchscript", "--out", str(tmp_path / "out")]
    if case == "negative-atol":
        args += ["--atol", "-1"]
    else:
        weights = tmp_path / "w.pt"
        torch.save(Encoder(preset("tiny", n_layers=1), seed=0).state_dict(), weights)
        args += ["--weights", str(weights)]
    # In process: the subprocess form runs the same code, ~2 s slower.
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("attnserve-export: error: ")


@pytest.mark.usefixtures("restore_torch_logger")
def test_unless_current_exports_an_older_format_again_and_skips_a_current_one(
    tmp_path: Path,
) -> None:
    """What `make serve` runs: a model in an older format (or broken) is exported again
    instead of being served half-working; a current one is left alone."""
    out = tmp_path / "m"
    args = ["--preset", "tiny", "--exporter", "torchscript", "--out", str(out), "--unless-current"]
    assert main(args) == 0
    config = out / graph_io.CONFIG_FILE
    raw = json.loads(config.read_text())
    assert raw["format_version"] == FORMAT_VERSION
    written = config.stat().st_mtime_ns
    assert main(args) == 0
    assert config.stat().st_mtime_ns == written  # current: nothing done
    raw["format_version"] = 2
    config.write_text(json.dumps(raw))
    assert main(args) == 0
    assert json.loads(config.read_text())["format_version"] == FORMAT_VERSION  # exported again
    (out / graph_io.GRAPH_EMBEDDINGS).write_bytes(b"not onnx")
    assert main(args) == 0
    assert Manifest.read(out).verify(out)  # corrupt: exported again
