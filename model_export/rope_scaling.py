"""Scaled rotary position embeddings: a ``rope_parameters`` dict (transformers' names) to
the inverse frequencies f_i and the cos/sin factor the encoder rotates with
(``EncoderConfig.rotary_inv_freq``, ``rotary_scale``).

Each kind is computed as transformers' ``modeling_rope_utils`` computes it, in float32
with the same operations, so the angles t·f_i are the ones the model was run with:

- ``default``: f_i = θ^(-2i/d); no explicit frequencies (the encoder's own formula).
- ``linear``: f_i / factor (positions interpolated).
- ``dynamic``: NTK-aware; transformers rescales θ only for sequences longer than
  ``max_position_embeddings``, which the encoder never serves (its ``max_seq_len``
  is at most that), so within it the frequencies are the default ones.
- ``yarn``: f_i blended between f_i and f_i / factor over the correction range of
  ``beta_fast``/``beta_slow``, and cos, sin scaled by the attention factor.
- ``llama3``: low frequencies / factor, high ones kept, the band between smoothed.
- ``proportional``: θ^(-2i/d) for the first ``partial_rotary_factor`` of the pairs,
  0 (no rotation) for the others, all / factor.

``longrope`` is refused: its frequencies switch with the batch's longest sequence
(short ones up to ``original_max_position_embeddings``, long ones past it), so a
sequence's answer would depend on what it is batched with. Any other kind is refused
by name.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from model_export.st_folder import CheckpointError

KINDS: tuple[str, ...] = ("default", "linear", "dynamic", "yarn", "llama3", "proportional")


def _number(params: dict[str, Any], key: str, default: float | None = None) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CheckpointError(f"rope_parameters: {key} must be a number, got {value!r}")
    return float(value)


def _default(theta: float, dim: int) -> torch.Tensor:
    """θ^(-2i/d) as transformers computes it: (d/2,) float32."""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    inv_freq: torch.Tensor = 1.0 / (theta**exponent)
    return inv_freq


def rope_kind(params: dict[str, Any]) -> str:
    """The kind a ``rope_parameters`` (or legacy ``rope_scaling``) dict names."""
    return str(params.get("rope_type", params.get("type", "default")))


def scaled_rope(
    params: dict[str, Any], *, head_dim: int, theta: float, max_positions: int
) -> tuple[tuple[float, ...] | None, float]:
    """(f_i or None for the default formula, the cos/sin factor) of ``params``' kind for
    heads of ``head_dim`` fully rotated; CheckpointError names a kind not supported."""
    kind = rope_kind(params)
    if kind not in KINDS:
        why = (
            ": its frequencies change with the batch's longest sequence"
            if kind == "longrope"
            else ""
        )
        raise CheckpointError(
            f"rope_type {kind!r} is not supported{why}; supported: {', '.join(KINDS)}"
        )
    if kind in ("default", "dynamic"):
        return None, 1.0
    factor = _number(params, "factor", 1.0 if kind == "proportional" else None)
    if not factor > 0:
        raise CheckpointError(f"rope_parameters: factor must be > 0, got {factor}")
    scale = 1.0
    if kind == "linear":
        inv_freq = _default(theta, head_dim) / factor
    elif kind == "proportional":
        inv_freq = _proportional(params, theta, head_dim) / factor
    elif kind == "llama3":
        inv_freq = _llama3(params, _default(theta, head_dim), factor, max_positions)
    else:
        inv_freq, scale = _yarn(params, theta, head_dim, factor, max_positions)
    return tuple(float(f) for f in inv_freq), scale


def _proportional(params: dict[str, Any], theta: float, head_dim: int) -> torch.Tensor:
    fraction = _number(params, "partial_rotary_factor", 1.0)
    angles = int(fraction * head_dim // 2)
    exponent = torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    rotated = 1.0 / (theta**exponent)
    return torch.cat((rotated, torch.zeros(head_dim // 2 - angles, dtype=torch.float32)))


def _llama3(
    params: dict[str, Any], inv_freq: torch.Tensor, factor: float, max_positions: int
) -> torch.Tensor:
    low = _number(params, "low_freq_factor")
    high = _number(params, "high_freq_factor")
    old = _number(params, "original_max_position_embeddings", max_positions)
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(
    params: dict[str, Any], theta: float, dim: int, factor: float, max_positions: int
) -> tuple[torch.Tensor, float]:
    original = _number(params, "original_max_position_embeddings", max_positions)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if attention is None:
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, float(_number({"attention_factor": attention}, "attention_factor"))
