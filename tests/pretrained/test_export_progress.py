"""An export's progress, through every kind of step: a cross-encoder checkpoint with a
WordPiece tokenizer has all eight graphs (the five encoder graphs, the token
embeddings, BM42's and the head's), the text path's check and no int8 ranges."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from pathlib import Path

import pytest

from model_export import graph_io
from model_export.cli import main
from model_export.progress import Progress, Step
from tests.support.heads import bert_cross_encoder

LINE = re.compile(r"^attnserve-export: model: (\w+) (\d+)/(\d+) (.+) \((.+)\)$")


def test_every_step_is_planned_and_shown_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bert_cross_encoder(tmp_path / "checkpoint")
    capsys.readouterr()  # what building the checkpoint said
    args = ["--checkpoint", str(tmp_path / "checkpoint"), "--exporter", "torchscript"]
    assert main([*args, "--out", str(tmp_path / "model")]) == 0
    lines = capsys.readouterr().err.splitlines()
    steps: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for line in lines:
        match = LINE.match(line)
        assert match is not None, lines
        stage, k, n, name, _ = match.groups()
        steps[stage].append((int(k), int(n), name))
    # Each stage counts 1..n with the n planned from the start: no step was unplanned.
    for shown in steps.values():
        assert [(k, n) for k, n, _ in shown] == [(k, len(shown)) for k in range(1, len(shown) + 1)]
    encoder_graphs = list(graph_io.GRAPH_OUTPUTS)
    text = [graph_io.GRAPH_TOKEN_EMBEDDINGS, graph_io.GRAPH_SPARSE]
    assert [name for *_, name in steps["export"]] == [*encoder_graphs, *text, graph_io.GRAPH_SCORES]
    assert [name for *_, name in steps["optimize"]] == encoder_graphs
    assert [name for *_, name in steps["validate"]] == [
        "PyTorch's outputs",
        *encoder_graphs,
        graph_io.GRAPH_TOKEN_EMBEDDINGS,
        f"{graph_io.GRAPH_TOKEN_EMBEDDINGS} + {graph_io.GRAPH_EMBEDDINGS}",
        graph_io.GRAPH_SPARSE,
        graph_io.GRAPH_SCORES,
    ]
    assert set(steps) == {"export", "optimize", "write", "validate"}  # a head: no int8 ranges


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_rewritten_and_ended() -> None:
    now = [0.0]
    shown = Terminal()
    progress = Progress("export", shown, clock=lambda: now[0])
    progress.plan([Step("export", "a.onnx", 1.0), Step("export", "b.onnx", 3.0)])
    for name in ("a.onnx", "b.onnx"):
        with progress.step("export", name):
            now[0] += 10.0
    progress.close()
    text = shown.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, ended at the close
    first, second = text.rstrip("\n").split("\r")[1:]
    assert first.startswith("export [--------------------] export 1/2 a.onnx (0 s, ")
    # A quarter done in 10 s: three quarters are about 30 s.
    assert second.startswith("export [#####---------------] export 2/2 b.onnx (10 s, about 30 s")
    assert [(t.step.name, t.seconds) for t in progress.timings] == [
        ("a.onnx", 10.0),
        ("b.onnx", 10.0),
    ]


def test_no_stream_shows_nothing_and_still_times() -> None:
    progress = Progress("export")
    progress.plan([Step("export", "a.onnx")])
    with progress.step("export", "a.onnx"):
        pass
    progress.close()
    assert [t.step.name for t in progress.timings] == ["a.onnx"]
