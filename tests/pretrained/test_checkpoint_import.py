"""The checkpoint key mapping is explicit and checked both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from model_export.hf_import import CheckpointError, config_from_hf, map_state_dict, minilm_l6_dir
from model_export.manifest import Manifest
from model_export.model import Encoder, TokenEmbeddings


@pytest.fixture(scope="module")
def hf_state() -> dict[str, torch.Tensor]:
    return load_file(str(minilm_l6_dir() / "model.safetensors"))


def _targets() -> tuple[Encoder, TokenEmbeddings]:
    cfg = config_from_hf(
        {
            "hidden_size": 384,
            "num_attention_heads": 12,
            "num_hidden_layers": 6,
            "intermediate_size": 1536,
        }
    )
    return Encoder(cfg), TokenEmbeddings(30522, 512, 2, 384, 1e-12)


def test_every_parameter_is_filled(hf_state: dict[str, torch.Tensor]) -> None:
    encoder, embeddings = _targets()
    enc, emb = map_state_dict(hf_state, encoder, embeddings)
    assert set(enc) == set(encoder.state_dict())
    assert set(emb) == set(embeddings.state_dict())
    torch.testing.assert_close(
        enc["layers.3.attn.q_proj.weight"],
        hf_state["encoder.layer.3.attention.self.query.weight"],
        rtol=0,
        atol=0,
    )


def test_task_head_prefix_is_stripped(hf_state: dict[str, torch.Tensor]) -> None:
    prefixed = {f"bert.{k}": v for k, v in hf_state.items()}
    enc, _ = map_state_dict(prefixed, *_targets())
    assert "layers.0.ffn.up.weight" in enc


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("encoder.layer.2.output.dense.bias"), "missing encoder.layer.2.output"),
        (lambda s: s.__setitem__("encoder.layer.9.extra.weight", torch.zeros(1)), "unexpected"),
        (
            lambda s: s.__setitem__("embeddings.LayerNorm.weight", torch.ones(7)),
            "embeddings.LayerNorm.weight has shape [7]",
        ),
    ],
)
def test_mismatches_are_named(
    hf_state: dict[str, torch.Tensor], edit: object, message: str
) -> None:
    state = dict(hf_state)
    edit(state)  # type: ignore[operator]
    with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")):
        map_state_dict(state, *_targets())


def test_config_errors_are_clear() -> None:
    with pytest.raises(CheckpointError, match="hidden_size"):
        config_from_hf({"num_attention_heads": 12})
    with pytest.raises(CheckpointError, match="hidden_act"):
        config_from_hf(
            {
                "hidden_size": 8,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "intermediate_size": 8,
                "hidden_act": "tanh",
            }
        )


def test_minilm_manifest_carries_its_sentence_recipe(minilm_repository: Path) -> None:
    """1_Pooling/config.json says mean; modules.json has a Normalize module."""
    manifest = Manifest.read(minilm_repository / "minilm-l6")
    assert (manifest.pooling, manifest.normalize) == ("mean", True)
    assert manifest.matryoshka_dimensions == ()
    assert manifest.has_tokenizer and manifest.architecture.max_seq_len == 256
