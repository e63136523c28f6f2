"""Session-wide fixtures: real models exported once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_export.config import EncoderConfig, preset
from model_export.export import export_model
from model_export.model import Encoder

TINY_SEED = 1234


@pytest.fixture(scope="session")
def tiny_config() -> EncoderConfig:
    return preset("tiny")


@pytest.fixture(scope="session")
def tiny_encoder(tiny_config: EncoderConfig) -> Encoder:
    return Encoder(tiny_config, seed=TINY_SEED)


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory, tiny_encoder: Encoder) -> Path:
    """A model repository holding ``tiny`` exported with the default (dynamo) exporter."""
    repo = tmp_path_factory.mktemp("models")
    export_model(tiny_encoder, repo / "tiny", name="tiny", seed=TINY_SEED)
    return repo


@pytest.fixture(scope="session")
def tiny_model_dir(model_repository: Path) -> Path:
    return model_repository / "tiny"
