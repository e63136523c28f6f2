"""The PyTorch encoder: shapes, masking invariants and equality with the numpy reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from model_export.config import EncoderConfig, preset
from model_export.model import Encoder
from tests.model_export.reference import (
    ragged_batch,
    reference_forward,
    reference_forward_all,
    weights_of,
)

# Tolerances (float32 model against the float64 reference / against itself).
REFERENCE_ATOL = 1e-5  # observed ~1e-6 on these sizes
ROW_SUM_ATOL = 1e-5  # |Σ_j a_ij - 1| for every real query row
PADDING_ATOL = 1e-5  # the same sequence alone vs. padded in a longer batch

# Every variant is the ``tiny`` preset (d_model 32, 4 heads, 2 layers, d_ff 64) plus overrides.
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "causal": {"causal": True},
    "window2": {"window": 2},
    "causal+window2": {"causal": True, "window": 2},
    "additive": {"scoring": "additive"},
    "pre-LN": {"norm_placement": "pre"},
    "relu": {"activation": "relu"},
    "gelu_tanh": {"activation": "gelu_tanh"},
    "alibi": {"alibi": True},
    "rotary-interleaved": {"rotary": "interleaved"},  # RoFormer
    # ModernBERT: pre-LN, layer 0 without attention norm, GeGLU, bias-free, rotary halves
    # with a global and a local base, layers 0 and 2 global and layer 1 within ±2.
    "modernbert": {
        "n_layers": 3,
        "norm_placement": "pre",
        "first_attn_norm": False,
        "glu": True,
        "attention_bias": False,
        "mlp_bias": False,
        "norm_bias": False,
        "rotary": "half",
        "rotary_theta": 160000.0,
        "local_rotary_theta": 10.0,
        "window": 2,
        "global_every": 2,
    },
    "swiglu+alibi+window": {"glu": True, "activation": "silu", "alibi": True, "window": 3},
    # GTE: post-LN, rotary halves with a scaled RoPE's own frequencies and cos/sin factor
    # (YaRN's), gated feed-forward without input bias.
    "gte": {
        "rotary": "half",
        "rotary_inv_freq": (1.0, 0.3, 0.05, 0.001),
        "rotary_scale": 1.2,
        "glu": True,
        "mlp_in_bias": False,
    },
    # NomicBERT: SwiGLU, bias-free, interleaved rotary on the first half of each head.
    "nomic": {
        "rotary": "interleaved",
        "rotary_fraction": 0.5,
        "glu": True,
        "activation": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    },
}
RAGGED = (7, 4, 1, 6)  # padded to 7: rows with 0, 3, 6 and 1 padded positions


def config_of(variant: str) -> EncoderConfig:
    return preset("tiny", **CONFIGS[variant])


def run(encoder: Encoder, embeds: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        hidden, attn, _, _ = encoder(torch.from_numpy(embeds), torch.from_numpy(mask))
    assert attn is not None
    return hidden.numpy(), attn.numpy()


def run_all(
    encoder: Encoder, embeds: np.ndarray, mask: np.ndarray, *, need_weights: bool = True
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The forward with hidden states: (hidden, attn or None, states (B, L + 1, T, d))."""
    with torch.no_grad():
        hidden, attn, states, _ = encoder(
            torch.from_numpy(embeds),
            torch.from_numpy(mask),
            weights=need_weights,
            hidden_states=True,
        )
    assert states is not None
    return hidden.numpy(), None if attn is None else attn.numpy(), states.numpy()


def randomized(encoder: Encoder, seed: int) -> Encoder:
    """Load O(1)-scale random parameters, non-zero biases and non-unit LayerNorm gains.

    The default init (N(0, 0.02), zero biases, unit gains) would let a reference
    that forgot a bias or a LayerNorm gain pass; these weights do not.
    """
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, Tensor] = {}
    for name, param in encoder.state_dict().items():
        noise = torch.randn(param.shape, generator=generator)
        if "norm" in name and name.endswith("weight"):
            state[name] = 1.0 + 0.1 * noise
        elif name.endswith("bias"):
            state[name] = 0.1 * noise
        else:  # unit-variance projections: scores of order 1, softmax neither flat nor one-hot
            state[name] = noise / param.shape[-1] ** 0.5
    encoder.load_state_dict(state, strict=True)
    return encoder


def window_of(config: EncoderConfig, layer: int) -> int | None:
    """The layer's window: none in every ``global_every``-th layer (ModernBERT)."""
    global_layer = config.global_every is not None and layer % config.global_every == 0
    return None if global_layer else config.window


def allowed(config: EncoderConfig, layer: int, mask: np.ndarray, i: int, j: int) -> bool:
    """May real query i attend to key j? Written independently of ``allowed_keys``."""
    window = window_of(config, layer)
    return bool(
        mask[j] and (not config.causal or j <= i) and (window is None or abs(i - j) <= window)
    )


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_output_shapes_and_dtypes(variant: str) -> None:
    config = config_of(variant)
    encoder = Encoder(config, seed=0)
    embeds, mask = ragged_batch(RAGGED, config.d_model, seed=0)
    with torch.no_grad():
        hidden, attn, _, _ = encoder(torch.from_numpy(embeds), torch.from_numpy(mask))
        fast, no_attn, _, _ = encoder(
            torch.from_numpy(embeds), torch.from_numpy(mask), weights=False
        )
    assert hidden.shape == (4, 7, config.d_model)
    assert hidden.dtype == torch.float32
    assert attn is not None
    assert attn.shape == (4, config.n_layers, config.n_heads, 7, 7)
    assert attn.dtype == torch.float32
    assert no_attn is None
    assert torch.equal(fast, hidden)  # the embeddings-only path computes the same thing


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_attention_rows_and_padding(variant: str) -> None:
    config = config_of(variant)
    encoder = randomized(Encoder(config, seed=0), seed=1)
    embeds, mask = ragged_batch(RAGGED, config.d_model, seed=1)
    hidden, attn = run(encoder, embeds, mask)
    real = mask.astype(bool)  # (B, T)
    for b in range(len(RAGGED)):
        rows = attn[b][:, :, real[b]]  # (L, h, n_real, T)
        # Every real query's weights form a distribution.
        np.testing.assert_allclose(rows.sum(axis=-1), 1.0, rtol=0, atol=ROW_SUM_ATOL)
        assert (rows >= 0).all()
        # Padded keys get exactly zero weight from real queries.
        assert (rows[..., ~real[b]] == 0.0).all()
        # Padded positions are exactly zero: embeddings and whole attention rows.
        assert (hidden[b, ~real[b]] == 0.0).all()
        assert (attn[b][:, :, ~real[b]] == 0.0).all()
        # And real tokens are not (the test would pass vacuously on an all-zero output).
        assert (np.abs(hidden[b, real[b]]).max(axis=-1) > 0.0).all()


NAN_CASES: list[tuple[dict[str, Any], tuple[int, ...], bool]] = [
    # (overrides, lengths, left_pad): padded query rows with no allowed real key.
    ({"causal": True, "window": 1}, (7, 1, 3), False),
    ({"causal": True, "window": 1}, (7, 1, 3), True),  # padded queries before any real key
    ({"window": 1}, (9, 2, 1), False),
    ({"causal": True}, (5, 1), True),
    ({"causal": True, "window": 2, "norm_placement": "pre"}, (6, 0, 2), False),  # empty row
    ({"window": 1, "scoring": "additive"}, (6, 1, 0), True),
    ({}, (1,), False),
]


@pytest.mark.parametrize(("overrides", "lengths", "left_pad"), NAN_CASES)
def test_no_nan_anywhere(
    overrides: dict[str, Any], lengths: tuple[int, ...], left_pad: bool
) -> None:
    config = preset("tiny", **overrides)
    encoder = randomized(Encoder(config, seed=0), seed=2)
    non_finite: list[str] = []

    def check(module: nn.Module, _inputs: object, output: object) -> None:
        outputs = output if isinstance(output, tuple) else (output,)
        for t in outputs:
            if isinstance(t, Tensor) and not torch.isfinite(t).all():
                non_finite.append(type(module).__name__)

    # Every sub-module, so a NaN hidden by the final zeroing of padded rows is caught too.
    handles = [m.register_forward_hook(check) for m in encoder.modules()]
    try:
        embeds, mask = ragged_batch(lengths, config.d_model, seed=3, left_pad=left_pad)
        hidden, attn = run(encoder, embeds, mask)
    finally:
        for handle in handles:
            handle.remove()
    assert non_finite == []
    assert np.isfinite(hidden).all()
    assert np.isfinite(attn).all()


def assert_matches_reference(
    encoder: Encoder, config: EncoderConfig, embeds: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Model vs the numpy reference on real tokens; returns the model's (hidden, attn)."""
    hidden, attn = run(encoder, embeds, mask)
    ref_hidden, ref_attn = reference_forward(weights_of(encoder), config, embeds, mask)
    real = mask.astype(bool)
    # Real tokens only (the reference leaves padded rows NaN); attention as (token, L, h, T).
    np.testing.assert_allclose(hidden[real], ref_hidden[real], rtol=0, atol=REFERENCE_ATOL)
    np.testing.assert_allclose(
        attn.transpose(0, 3, 1, 2, 4)[real],
        ref_attn.transpose(0, 3, 1, 2, 4)[real],
        rtol=0,
        atol=REFERENCE_ATOL,
    )
    return hidden, attn


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_matches_numpy_reference(variant: str) -> None:
    config = config_of(variant)
    encoder = randomized(Encoder(config, seed=0), seed=4)
    embeds, mask = ragged_batch(RAGGED, config.d_model, seed=4)
    hidden, attn = assert_matches_reference(encoder, config, embeds, mask)
    real = mask.astype(bool)
    assert (hidden[~real] == 0.0).all()
    assert (attn.transpose(0, 3, 1, 2, 4)[~real] == 0.0).all()


@pytest.mark.parametrize("variant", ["default", "causal+window2", "additive"])
def test_matches_numpy_reference_left_padded_and_default_init(variant: str) -> None:
    config = config_of(variant)
    encoder = Encoder(config, seed=5)  # the real init, as exported by the CLI
    embeds, mask = ragged_batch((3, 7, 5), config.d_model, seed=5, left_pad=True)
    assert_matches_reference(encoder, config, embeds, mask)


@pytest.mark.parametrize(
    "variant", ["default", "causal", "window2", "causal+window2", "modernbert", "alibi"]
)
def test_attention_is_zero_exactly_where_masks_forbid(variant: str) -> None:
    config = config_of(variant)
    encoder = Encoder(config, seed=6)
    embeds, mask = ragged_batch((9, 6, 2), config.d_model, seed=6)
    _, attn = run(encoder, embeds, mask)
    seq = mask.shape[1]
    for b in range(mask.shape[0]):
        for i in range(seq):
            if not mask[b, i]:
                continue
            for layer in range(config.n_layers):
                expected = np.array([allowed(config, layer, mask[b], i, j) for j in range(seq)])
                row = attn[b, layer, :, i, :]  # (h, T)
                assert (row[..., ~expected] == 0.0).all(), (b, i)  # exactly 0 where forbidden
                assert (row[..., expected] > 0.0).all(), (b, i)  # strictly positive if allowed
    if config.causal:  # the whole strict upper triangle, padded rows included
        assert (attn[..., np.triu_indices(seq, k=1)[0], np.triu_indices(seq, k=1)[1]] == 0).all()
    for layer in range(config.n_layers):
        window = window_of(config, layer)
        far = np.abs(np.arange(seq)[:, None] - np.arange(seq)[None, :]) > (window or seq)
        assert (attn[:, layer][..., far] == 0.0).all()
        # A global layer beside windowed ones does see far keys.
        assert window is not None or config.window is None or (attn[0, layer, :, 8, 0] > 0).all()


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_sequence_alone_equals_padded_in_batch(variant: str) -> None:
    config = config_of(variant)
    encoder = randomized(Encoder(config, seed=0), seed=7)
    embeds, mask = ragged_batch((5, 9, 12), config.d_model, seed=7)
    batch_hidden, batch_attn = run(encoder, embeds, mask)
    alone_hidden, alone_attn = run(encoder, embeds[:1, :5], mask[:1, :5])
    np.testing.assert_allclose(batch_hidden[0, :5], alone_hidden[0], rtol=0, atol=PADDING_ATOL)
    np.testing.assert_allclose(
        batch_attn[0, :, :, :5, :5], alone_attn[0], rtol=0, atol=PADDING_ATOL
    )


# -- hidden states ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_hidden_states_shape_first_last_and_padding(variant: str) -> None:
    config = config_of(variant)
    encoder = randomized(Encoder(config, seed=0), seed=10)
    embeds, mask = ragged_batch(RAGGED, config.d_model, seed=10)
    real = mask.astype(bool)  # (B, T)
    embeds[~real] = 7.0  # garbage at padded positions: it must not come back
    hidden, attn, states = run_all(encoder, embeds, mask)
    assert states.shape == (len(RAGGED), config.n_layers + 1, 7, config.d_model)
    assert states.dtype == np.float32
    by_token = states.transpose(0, 2, 1, 3)  # (B, T, L + 1, d)
    # The first state is the input embeddings, bit for bit (a copy), at real tokens.
    np.testing.assert_array_equal(states[:, 0][real], embeds[real])
    # The last is the encoder's output (after the final norm, for pre-LN), bit for bit.
    np.testing.assert_array_equal(states[:, -1], hidden)
    # Exactly 0 at padded positions, in every state; not at real tokens.
    assert (by_token[~real] == 0.0).all()
    assert (np.abs(by_token[real]).max(axis=-1) > 0.0).all()
    # Each layer changes every real token (a stack of copies would pass the above).
    steps = np.abs(np.diff(by_token[real], axis=1)).max(axis=-1)  # (tokens, L)
    assert (steps > 1e-3).all()
    # The other outputs are those of forward, and do not depend on what else is asked for.
    with torch.no_grad():
        plain, plain_attn, no_states, _ = encoder(torch.from_numpy(embeds), torch.from_numpy(mask))
    assert no_states is None  # hidden_states defaults to False
    assert plain_attn is not None and attn is not None
    np.testing.assert_array_equal(hidden, plain.numpy())
    np.testing.assert_array_equal(attn, plain_attn.numpy())
    fast_hidden, no_attn, fast_states = run_all(encoder, embeds, mask, need_weights=False)
    assert no_attn is None
    np.testing.assert_array_equal(fast_hidden, hidden)
    np.testing.assert_array_equal(fast_states, states)


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_hidden_states_match_numpy_reference(variant: str) -> None:
    """Every layer's output at real tokens, within REFERENCE_ATOL of the float64 reference."""
    config = config_of(variant)
    encoder = randomized(Encoder(config, seed=0), seed=11)
    embeds, mask = ragged_batch(RAGGED, config.d_model, seed=11)
    _, _, states = run_all(encoder, embeds, mask)
    ref_hidden, _, ref_states = reference_forward_all(weights_of(encoder), config, embeds, mask)
    real = mask.astype(bool)
    # Real tokens only (the reference leaves padded rows NaN); as (token, L + 1, d).
    np.testing.assert_allclose(
        states.transpose(0, 2, 1, 3)[real],
        ref_states.transpose(0, 2, 1, 3)[real],
        rtol=0,
        atol=REFERENCE_ATOL,
    )
    # The reference's own invariants: first the input, last its output (exactly: float64).
    np.testing.assert_array_equal(ref_states[:, 0][real], embeds[real].astype(np.float64))
    np.testing.assert_array_equal(ref_states[:, -1][real], ref_hidden[real])


def test_pre_ln_last_hidden_state_is_after_the_final_norm() -> None:
    """Pre-LN blocks end without a norm: the last state is final_norm(last block's output)."""
    config = config_of("pre-LN")
    encoder = randomized(Encoder(config, seed=0), seed=12)
    assert encoder.final_norm is not None
    embeds, mask = ragged_batch(RAGGED, config.d_model, seed=12)
    captured: list[Tensor] = []
    handle = encoder.layers[-1].register_forward_hook(
        lambda _module, _inputs, output: captured.append(output[0])
    )
    try:
        hidden, _, states = run_all(encoder, embeds, mask)
    finally:
        handle.remove()
    (block_out,) = captured  # (B, T, d), before the final norm
    with torch.no_grad():
        normed = encoder.final_norm(block_out).numpy()
    real = mask.astype(bool)
    np.testing.assert_array_equal(states[:, -1][real], normed[real])  # the same op: exact
    np.testing.assert_array_equal(states[:, -1], hidden)
    # And not the block's raw output: the final norm visibly changes it.
    assert np.abs(states[:, -1][real] - block_out.numpy()[real]).max() > 1e-1
    # The states before the last are the blocks' raw outputs (no final norm on them).
    ref_hidden, _, ref_states = reference_forward_all(weights_of(encoder), config, embeds, mask)
    np.testing.assert_allclose(states[:, -1][real], ref_hidden[real], rtol=0, atol=REFERENCE_ATOL)
    np.testing.assert_allclose(
        states[:, -2][real], ref_states[:, -2][real], rtol=0, atol=REFERENCE_ATOL
    )


def test_init_is_deterministic_in_the_seed() -> None:
    config = preset("tiny", scoring="additive", norm_placement="pre")
    first = Encoder(config, seed=42).state_dict()
    again = Encoder(config, seed=42).state_dict()
    other = Encoder(config, seed=43).state_dict()
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    random_weights = [k for k in first if not k.endswith("bias") and "norm" not in k]
    assert random_weights  # projections and the additive-scoring parameters
    assert all(not torch.equal(first[k], other[k]) for k in random_weights)


def test_init_is_bert_style() -> None:
    state = Encoder(preset("tiny", scoring="additive", norm_placement="pre"), seed=0).state_dict()
    weights = torch.cat(
        [v.flatten() for k, v in state.items() if not k.endswith("bias") and "norm" not in k]
    )
    # N(0, 0.02) over ~20k values: the sample std is within 2 % of 0.02 with near certainty.
    assert abs(weights.std().item() - 0.02) < 0.02 * 0.02
    assert abs(weights.mean().item()) < 0.001
    for k, v in state.items():
        if "norm" in k and k.endswith("weight"):
            assert torch.equal(v, torch.ones_like(v)), k
        elif k.endswith("bias"):
            assert torch.equal(v, torch.zeros_like(v)), k


def test_encoder_is_built_in_eval_mode() -> None:
    encoder = Encoder(preset("tiny", dropout=0.5), seed=0)
    assert not encoder.training
    embeds, mask = ragged_batch((4, 2), 32, seed=8)
    first, _ = run(encoder, embeds, mask)
    second, _ = run(encoder, embeds, mask)
    assert np.array_equal(first, second)  # dropout inactive: bit-identical


def _save_state_dict(state: dict[str, Tensor], path: Path) -> None:
    if path.suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)


@pytest.mark.parametrize("file_name", ["weights.pt", "weights.safetensors"])
def test_load_weights_round_trip(tmp_path: Path, file_name: str) -> None:
    config = preset("tiny", causal=True, window=3)
    source = randomized(Encoder(config, seed=0), seed=9)
    path = tmp_path / file_name
    _save_state_dict(source.state_dict(), path)

    target = Encoder(config, seed=1)
    target.load_weights(path)
    loaded = target.state_dict()
    assert loaded.keys() == source.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in source.state_dict().items())
    embeds, mask = ragged_batch(RAGGED, config.d_model, seed=9)
    assert np.array_equal(run(target, embeds, mask)[0], run(source, embeds, mask)[0])


@pytest.mark.parametrize("file_name", ["weights.pt", "weights.safetensors"])
def test_load_weights_rejects_another_architecture(tmp_path: Path, file_name: str) -> None:
    path = tmp_path / file_name
    _save_state_dict(Encoder(preset("tiny", n_layers=1), seed=0).state_dict(), path)
    target = Encoder(preset("tiny"), seed=0)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*layers\.1\."):
        target.load_weights(path)


# -- position schemes ------------------------------------------------------------------------


def test_alibi_slopes_follow_the_paper() -> None:
    """Press et al.'s slopes: 2^(-8k/n) for n a power of two; otherwise those of the power
    below, then every other slope of twice that power (their reference code's values)."""
    from model_export.model import alibi_slopes

    assert alibi_slopes(4).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    six = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert alibi_slopes(6).tolist() == six


def test_alibi_scores_are_the_plain_scores_minus_slope_times_distance() -> None:
    """With ALiBi, every layer's weights are softmax(s_ij - m_h |i - j|) of the same
    model's scores without it, computed directly from its projections (6 heads: the
    slopes past the power of two are used too)."""
    from model_export.model import alibi_slopes

    config = preset("tiny", d_model=36, n_heads=6, n_layers=1, alibi=True)
    encoder = randomized(Encoder(config, seed=0), seed=13)
    embeds, mask = ragged_batch((6,), config.d_model, seed=13)
    _, attn = run(encoder, embeds, mask)
    attention = encoder.layers[0].attn
    x = torch.from_numpy(embeds)
    with torch.no_grad():
        q = attention.queries(x)  # (1, h, T, d_k)
        k = attention.keys(x)
        scores = (q @ k.transpose(-2, -1)).numpy()[0] / np.sqrt(config.head_dim)  # (h, T, T)
    distance = np.abs(np.arange(6)[:, None] - np.arange(6)[None, :])
    biased = scores - alibi_slopes(6).numpy()[:, None, None] * distance
    want = np.exp(biased - biased.max(axis=-1, keepdims=True))
    want /= want.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(attn[0, 0], want, rtol=0, atol=1e-6)
    plain = np.exp(scores - scores.max(axis=-1, keepdims=True))
    assert np.abs(attn[0, 0] - plain / plain.sum(axis=-1, keepdims=True)).max() > 1e-2


@pytest.mark.parametrize("rotary", ["interleaved", "half"])
def test_rotary_scores_depend_on_the_offset_only(rotary: str) -> None:
    """R_i q · R_j k = q · R_(j-i) k: a token pair placed at another offset from the
    start scores the same (the point of rotary positions), and differs at another
    distance."""
    config = preset("tiny", n_layers=1, rotary=rotary)
    encoder = Encoder(config, seed=0)
    attention = encoder.layers[0].attn
    pair = torch.randn(1, 2, config.d_model, generator=torch.Generator().manual_seed(0))

    def score(i: int, j: int) -> Tensor:
        x = torch.zeros(1, 12, config.d_model)
        x[0, i], x[0, j] = pair[0, 0], pair[0, 1]
        (rotation,) = encoder.layer_rotations(12)
        q = attention.queries(x, rotation)[0, :, i]  # (h, d_k)
        k = attention.keys(x, rotation)[0, :, j]
        return (q * k).sum(-1)

    with torch.no_grad():
        torch.testing.assert_close(score(1, 4), score(7, 10), rtol=0, atol=1e-5)
        assert (score(1, 4) - score(1, 9)).abs().max() > 1e-3
