"""A hostile checkpoint folder gets one clear error line from the exporter's command,
exit status 2, no traceback, as a hostile model directory gets from the server.

Each case starts from a small random BERT saved by ``save_pretrained`` (plus a
sentence-transformers ``modules.json`` and ``1_Pooling``) and breaks one file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from model_export.cli import main
from tests.support.heads import SIZES, _bert_config, _bert_tokenizer

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import BertModel

    folder = tmp_path_factory.mktemp("hostile") / "template"
    BertModel(_bert_config()).save_pretrained(folder)  # type: ignore[arg-type]
    _bert_tokenizer(folder)
    (folder / "modules.json").write_text(json.dumps(MODULES))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))
    return folder


def _modules(raw: object) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / "modules.json").write_text(json.dumps(raw))

    return change


def _config(**changes: object) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | changes))

    return change


def _pooling_outside(folder: Path) -> None:
    outside = folder.parent / "outside-pooling"
    outside.mkdir(exist_ok=True)
    (outside / "config.json").write_text(json.dumps({"pooling_mode": "mean"}))
    shutil.rmtree(folder / "1_Pooling")
    (folder / "1_Pooling").symlink_to(outside, target_is_directory=True)


def _prompts(count: int, chars: int) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        prompts = {f"p{i}": "x" * chars for i in range(count)}
        path = folder / "config_sentence_transformers.json"
        path.write_text(json.dumps({"prompts": prompts}))
        # Refused before any weight is read: without its weights the folder's only
        # fault left to name would be the missing weights.
        (folder / "model.safetensors").unlink()

    return change


def _dense(in_features: int, weight: list[int]) -> Callable[[Path], None]:
    """A Dense module after the pooling: its config's sizes, its weight's shape."""

    def change(folder: Path) -> None:
        from safetensors.torch import save_file

        dense = {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        (folder / "modules.json").write_text(json.dumps([*MODULES, dense]))
        (folder / "2_Dense").mkdir()
        config = {"in_features": in_features, "out_features": 4, "bias": True}
        (folder / "2_Dense" / "config.json").write_text(json.dumps(config))
        state = {"linear.weight": torch.zeros(weight), "linear.bias": torch.zeros(4)}
        save_file(state, str(folder / "2_Dense" / "model.safetensors"))

    return change


# name -> (how the folder is broken, what the one error line says)
CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "modules-list-of-texts": (_modules(["a", "b"]), "modules.json must be a list"),
    "modules-dict": (_modules({"0": MODULES[0]}), "modules.json must be a list"),
    "modules-unknown-type": (
        _modules([*MODULES, {"path": "2_X", "type": "sentence_transformers.models.LSTM"}]),
        "module 'sentence_transformers.models.LSTM' is not applied",
    ),
    "modules-path-escapes": (
        _modules([MODULES[0], {**MODULES[1], "path": "../elsewhere"}]),
        "leads outside the checkpoint folder",
    ),
    "vocab-negative": (_config(vocab_size=-5), "vocab_size must be an integer in 1.."),
    "vocab-huge": (_config(vocab_size=10**12), "vocab_size must be an integer in 1.."),
    "hidden-a-list": (_config(hidden_size=[32]), "hidden_size must be an integer in 1.."),
    "positions-zero": (
        _config(max_position_embeddings=0),
        "max_position_embeddings must be an integer in 1..",
    ),
    "type-vocab-text": (_config(type_vocab_size="2"), "type_vocab_size must be an integer"),
    "pad-negative": (_config(pad_token_id=-3), "pad_token_id must be a non-negative integer"),
    "pooling-symlink-outside": (_pooling_outside, "leads outside the checkpoint folder"),
    "prompts-100-of-100k": (
        _prompts(100, 100_000),
        "config_sentence_transformers.json is larger than 1048576 bytes",
    ),
    "prompts-100": (_prompts(100, 10), "100 prompts, at most 64"),
    "dense-not-hidden-wide": (
        _dense(7, [4, 7]),
        f"2_Dense: in_features 7 is not the checkpoint's hidden_size {SIZES['hidden']}",
    ),
    "dense-weight-misshapen": (
        _dense(SIZES["hidden"], [4, 3]),
        f"2_Dense: linear.weight has shape [4, 3], expected [4, {SIZES['hidden']}]",
    ),
    "prompt-5000-chars": (_prompts(1, 5000), "prompts at most 2048"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_checkpoint_gets_one_error_line(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    breaks, message = CASES[case]
    folder = tmp_path / "checkpoint"
    shutil.copytree(template, folder)
    breaks(folder)
    code = main(["--checkpoint", str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("attnserve-export: error:"), err
    assert message in err[0], err
    assert not (tmp_path / "out").exists()


def test_the_docs_state_these_bounds() -> None:
    from model_export.manifest import MAX_CONFIG_BYTES, MAX_PROMPT_CHARS, MAX_PROMPTS
    from model_export.st_folder import MAX_MODULES

    docs = " ".join((Path(__file__).parents[2] / "docs" / "models.md").read_text().split())
    assert f"read at most {MAX_CONFIG_BYTES >> 20} MiB each" in docs
    assert f"a list of at most {MAX_MODULES} objects" in docs
    assert f"at most {MAX_PROMPTS} prompts of up to {MAX_PROMPT_CHARS:,} characters" in docs
