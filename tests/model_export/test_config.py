"""EncoderConfig validation, dict round trips and the named presets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from model_export.config import (
    CHECKPOINT_PRESETS,
    PRESETS,
    SIZE_BOUNDS,
    ConfigError,
    EncoderConfig,
    preset,
)

MODELS_MD = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def kwargs(field: str, value: Any) -> dict[str, Any]:
    """One field, typed loosely on purpose: these tests pass values of the wrong type."""
    return {field: value}


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_defaults_are_valid_and_bert_like() -> None:
    config = EncoderConfig()
    assert (config.d_model, config.n_heads, config.n_layers, config.d_ff) == (384, 12, 6, 1536)
    assert config.activation == "gelu"
    assert config.norm_placement == "post"
    assert config.layer_norm_eps == 1e-12
    assert config.dropout == 0.0
    assert not config.causal
    assert config.window is None
    assert config.scoring == "dot"
    assert config.head_dim == 32


@pytest.mark.parametrize(("d_model", "n_heads"), [(10, 3), (32, 5), (384, 7)])
def test_d_model_must_be_divisible_by_n_heads(d_model: int, n_heads: int) -> None:
    with pytest.raises(ConfigError) as info:
        EncoderConfig(d_model=d_model, n_heads=n_heads)
    assert str(info.value) == (f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")


@pytest.mark.parametrize("field", ["d_model", "n_heads", "n_layers", "d_ff", "max_seq_len"])
@pytest.mark.parametrize("value", [0, -1, -384, True, 2.0, "32", None, 1 << 26])
def test_sizes_must_be_integers_in_their_sane_range(field: str, value: Any) -> None:
    """A config.json is untrusted: d_model 2^26 once cost gigabytes before any check."""
    bound = SIZE_BOUNDS[field]
    with pytest.raises(ConfigError, match=rf"^{field} must be an integer in 1..{bound}, got "):
        EncoderConfig(**kwargs(field, value))


@pytest.mark.parametrize("window", [0, -1, True, 2.5, "2", 1 << 21])
def test_window_must_be_an_integer_in_range_or_none(window: Any) -> None:
    with pytest.raises(ConfigError, match=r"^window must be an integer in 1\.\.\d+, got "):
        EncoderConfig(window=window)


@pytest.mark.parametrize(
    ("buckets", "max_distance"), [(30, 128), (2, 128), (32, 8), (32, 0), (0, 128), (True, 128)]
)
def test_relative_buckets_need_exact_and_log_spaced_buckets(
    buckets: Any, max_distance: int
) -> None:
    """MPNet's buckets: a quarter exact per direction, then log-spaced up to max_distance."""
    with pytest.raises(ConfigError, match=r"^relative_(buckets|max_distance) must be "):
        EncoderConfig(relative_buckets=buckets, relative_max_distance=max_distance)


def test_relative_bias_table_is_counted_and_optional_in_config_json() -> None:
    """The bias table is one weight per bucket and head; a config.json written before the
    field existed still loads (no bias)."""
    mpnet = EncoderConfig(relative_buckets=32)
    assert mpnet.parameters() == EncoderConfig().parameters() + 32 * mpnet.n_heads
    older = {k: v for k, v in EncoderConfig().to_dict().items() if not k.startswith("relative")}
    assert EncoderConfig.from_dict(older).relative_buckets is None
    assert EncoderConfig.from_dict(json.loads(json.dumps(mpnet.to_dict()))) == mpnet


def test_window_one_and_none_are_valid() -> None:
    assert EncoderConfig(window=1).window == 1
    assert EncoderConfig(window=None).window is None


@pytest.mark.parametrize(
    ("field", "value", "choices"),
    [
        ("activation", "swish", "('gelu', 'gelu_tanh', 'relu', 'silu')"),
        ("activation", "GELU", "('gelu', 'gelu_tanh', 'relu', 'silu')"),
        ("scoring", "multiplicative", "('dot', 'additive')"),
        ("norm_placement", "sandwich", "('post', 'pre')"),
    ],
)
def test_unknown_choice_names_the_choices(field: str, value: str, choices: str) -> None:
    with pytest.raises(ConfigError) as info:
        EncoderConfig(**kwargs(field, value))
    assert str(info.value) == f"{field} must be one of {choices}, got {value!r}"


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_layer_norm_eps_must_be_positive(eps: float) -> None:
    with pytest.raises(ConfigError, match=r"^layer_norm_eps must be > 0"):
        EncoderConfig(layer_norm_eps=eps)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5])
def test_dropout_must_be_in_unit_interval(dropout: float) -> None:
    with pytest.raises(ConfigError, match=r"^dropout must be in \[0, 1\)"):
        EncoderConfig(dropout=dropout)


def test_causal_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="causal"):
        EncoderConfig.from_dict({"causal": "false"})


def test_config_is_frozen() -> None:
    config = EncoderConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 64  # type: ignore[misc]


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError) as info:
        EncoderConfig.from_dict({"d_model": 64, "nheads": 4, "hidden": 3})
    assert str(info.value) == "unknown config keys: hidden, nheads"  # sorted, all of them


def test_from_dict_validates_values() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        EncoderConfig.from_dict({"d_model": 30, "n_heads": 4})


def test_dict_and_json_round_trip() -> None:
    config = EncoderConfig(
        d_model=64,
        n_heads=4,
        n_layers=3,
        d_ff=128,
        activation="relu",
        norm_placement="pre",
        causal=True,
        window=5,
        scoring="additive",
        max_seq_len=256,
        layer_norm_eps=1e-6,
    )
    assert EncoderConfig.from_dict(config.to_dict()) == config
    assert EncoderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    scaled = EncoderConfig(rotary="half", rotary_inv_freq=tuple(0.5**i for i in range(16)))
    assert EncoderConfig.from_dict(json.loads(json.dumps(scaled.to_dict()))) == scaled


PRESET_SIZES: dict[str, tuple[int, int, int, int]] = {
    # name: (d_model, n_heads, n_layers, d_ff)
    "tiny": (32, 4, 2, 64),
    "small": (384, 12, 6, 1536),
    "base": (768, 12, 12, 3072),
}


@pytest.mark.parametrize("name", list(PRESET_SIZES))
def test_preset_sizes(name: str) -> None:
    config = preset(name)
    assert (config.d_model, config.n_heads, config.n_layers, config.d_ff) == PRESET_SIZES[name]
    assert config.head_dim * config.n_heads == config.d_model
    assert config == PRESETS[name]
    # Presets are plain BERT-style encoders; the variants are opt-in.
    assert (config.causal, config.window, config.scoring, config.norm_placement) == (
        False,
        None,
        "dot",
        "post",
    )


def test_tiny_preset_max_seq_len() -> None:
    assert preset("tiny").max_seq_len == 128
    assert preset("small").max_seq_len == 512


def documented_presets() -> dict[str, list[str]]:
    """The rows of the table under docs/models.md's "## Presets": name -> its cells."""
    section = MODELS_MD.read_text().split("\n## Presets\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| `")]
    return {cells[0].strip().strip("`"): [c.strip() for c in cells[1:]] for cells in rows}


def test_preset_set_is_documented() -> None:
    """docs/models.md lists every preset the CLI accepts, no other, each with its sizes."""
    table = documented_presets()
    assert sorted(table) == sorted([*PRESETS, *CHECKPOINT_PRESETS])
    for name, config in PRESETS.items():
        sizes = [int(cell) for cell in table[name][:4]]  # d_model, heads, layers, d_ff
        assert sizes == [config.d_model, config.n_heads, config.n_layers, config.d_ff], name
        assert table[name][4] == "random (seed)", name
    for name in CHECKPOINT_PRESETS:
        assert table[name][4].startswith("real: "), name


def test_preset_overrides_are_applied_and_validated() -> None:
    config = preset("tiny", causal=True, window=3, n_layers=1)
    assert (config.d_model, config.n_layers, config.causal, config.window) == (32, 1, True, 3)
    assert preset("tiny") == PRESETS["tiny"]  # the preset itself is untouched
    with pytest.raises(ConfigError, match=r"d_model \(32\) must be divisible by n_heads \(3\)"):
        preset("tiny", n_heads=3)
    with pytest.raises(ConfigError, match="unknown config keys: heads"):
        preset("tiny", heads=2)


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError) as info:
        preset("huge")
    assert str(info.value) == "unknown preset 'huge'; choose one of ['base', 'small', 'tiny']"


# -- rotary, ALiBi, gated feed-forwards, bias-free layers, per-layer windows ------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rotary": "neox"}, "rotary must be one of ('interleaved', 'half') or null, got 'neox'"),
        ({"rotary": "half", "d_model": 36, "n_heads": 4}, "head_dim (9) must be even"),
        ({"rotary": "half", "rotary_theta": 1.0}, "rotary_theta must be a number > 1, got 1.0"),
        ({"local_rotary_theta": "big"}, "local_rotary_theta must be a number > 1, got 'big'"),
        ({"global_every": 2}, "global_every alternates global and windowed layers: set window"),
        ({"global_every": 0, "window": 4}, "global_every must be an integer in 1..1024, got 0"),
        ({"first_attn_norm": False}, "first_attn_norm false only applies to pre-LN"),
        ({"alibi": 1}, "alibi must be true or false, got 1"),
        ({"norm_bias": "no"}, "norm_bias must be true or false, got 'no'"),
        ({"rotary_fraction": 0.0}, "rotary_fraction must be a number in (0, 1], got 0.0"),
        ({"rotary_fraction": "half"}, "rotary_fraction must be a number in (0, 1]"),
        (
            {"rotary": "half", "rotary_fraction": 0.05},
            "int(head_dim · rotary_fraction) (1) must be even and at least 2",
        ),
        ({"rotary_inv_freq": (1.0,) * 16}, "rotary_inv_freq needs rotary"),
        (
            {"rotary": "half", "rotary_inv_freq": (1.0, 0.5)},
            "rotary_inv_freq must hold 16 finite numbers >= 0",
        ),
        (
            {"rotary": "half", "rotary_inv_freq": (float("nan"),) * 16},
            "rotary_inv_freq must hold 16 finite numbers >= 0",
        ),
        ({"rotary_scale": 0}, "rotary_scale must be a number in (0, 1000), got 0"),
        ({"mlp_in_bias": "no"}, "mlp_in_bias must be true, false or null, got 'no'"),
    ],
)
def test_position_and_layer_options_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        EncoderConfig(**overrides)
    assert message in str(info.value)


def test_layer_windows_and_rotary_bases_alternate_as_modernbert() -> None:
    config = EncoderConfig(
        n_layers=5,
        window=64,
        global_every=3,
        rotary="half",
        rotary_theta=160000.0,
        local_rotary_theta=10000.0,
    )
    assert [config.layer_window(i) for i in range(5)] == [None, 64, 64, None, 64]
    thetas = [config.layer_rotary_theta(i) for i in range(5)]
    assert thetas == [160000.0, 10000.0, 10000.0, 160000.0, 10000.0]
    every = EncoderConfig(window=8)  # no global_every: every layer windowed, one base
    assert {every.layer_window(i) for i in range(6)} == {8}
    assert {every.layer_rotary_theta(i) for i in range(6)} == {10000.0}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm_placement": "pre"},
        {"relative_buckets": 32},
        {"glu": True, "activation": "silu"},
        {"attention_bias": False, "mlp_bias": False, "norm_bias": False},
        {"norm_placement": "pre", "first_attn_norm": False, "glu": True, "norm_bias": False},
        {"rotary": "interleaved", "alibi": True},  # no weights of their own
        {"glu": True, "mlp_in_bias": False},  # GTE: gated input projections bias-free
        {"glu": True, "mlp_bias": False, "mlp_in_bias": True},
        {"rotary": "half", "rotary_fraction": 0.5, "rotary_scale": 1.5},  # no weights
    ],
)
def test_parameters_count_the_encoders_weights(overrides: dict[str, Any]) -> None:
    from model_export.model import Encoder

    config = preset("tiny", **overrides)
    assert config.parameters() == sum(p.numel() for p in Encoder(config).parameters())


def test_new_fields_round_trip_and_older_config_json_still_loads() -> None:
    config = EncoderConfig(
        n_layers=3,
        norm_placement="pre",
        first_attn_norm=False,
        glu=True,
        attention_bias=False,
        mlp_bias=False,
        norm_bias=False,
        rotary="half",
        rotary_theta=160000.0,
        local_rotary_theta=10000.0,
        window=64,
        global_every=3,
        alibi=True,
    )
    assert EncoderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    new = {"global_every", "rotary", "rotary_theta", "local_rotary_theta", "alibi", "glu"}
    new |= {"attention_bias", "mlp_bias", "norm_bias", "first_attn_norm"}
    new |= {"rotary_fraction", "rotary_inv_freq", "rotary_scale", "mlp_in_bias"}
    older = {k: v for k, v in EncoderConfig().to_dict().items() if k not in new}
    assert EncoderConfig.from_dict(older) == EncoderConfig()
