"""A brute-force numpy reference of the encoder, independent of ``model_export.model``.

Written straight from the math with explicit Python loops over batch, head,
query and key, in float64, so that it shares no code (and no vectorisation
trick) with the PyTorch module. Only the weights are taken from the module,
through its ``state_dict``; the hyper-parameters come from the plain
``EncoderConfig`` dataclass.

Per layer, with d_k = d_model / h and the allowed set
``A(i) = {j : mask[j] = 1 and (not causal or j <= i) and (r is None or |i - j| <= r)}``
(r the layer's window: none in every ``global_every``-th layer)::

    s_ij  = R_i q_i · R_j k_j / √d_k - m_h |i - j|  (dot; R: rotary, m_h: ALiBi)
    s_ij  = vᵀ tanh(W_q q_i + W_k k_j)              (additive, no scaling)
    a_ij  = exp(s_ij) / Σ_{j' ∈ A(i)} exp(s_ij')    for j ∈ A(i), else 0
    o_i   = W_o concat_h(Σ_j a_ij v_j) + b_o

R_t turns each pair of a head's dimensions ((2m, 2m+1) interleaved, (m, m + d_k/2)
half) by the angle t·θ^(-2m/d_k); m_h = 2^(-8(h+1)/H) for H heads a power of two.
Partial rotary turns only the first d_r = int(d_k · rotary_fraction) dims, with d_r
in place of d_k; explicit ``rotary_inv_freq`` f_m make the angle t·f_m; cos and sin
are multiplied by ``rotary_scale``.

post-LN: x = LN(x + attn(x)); x = LN(x + ffn(x))
pre-LN:  x = x + attn(LN(x)); x = x + ffn(LN(x)); then a final LN (layer 0's
attention LN skipped without ``first_attn_norm``). Gated: ffn(x) = W_2 (act(a) ⊙ g)
with (a, g) the two halves of W_1 x. Missing biases (bias-free configs) count as 0.

Only real-token rows are computed: padded query positions are never seen by a
real query (they are not in any A(i)), so they cannot influence real tokens.
Their rows in the returned arrays are NaN, so a comparison that forgets to
select real tokens fails loudly instead of passing by accident.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from model_export.config import EncoderConfig

Weights = Mapping[str, np.ndarray]


def weights_of(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's parameters as float64 numpy arrays, keyed as in its state_dict."""
    return {
        name: tensor.detach().to(torch.float64).numpy().copy()
        for name, tensor in module.state_dict().items()
    }


def _linear(w: Weights, prefix: str, x: np.ndarray) -> np.ndarray:
    """nn.Linear semantics: weight stored (out, in), y = W x + b."""
    y: np.ndarray = w[f"{prefix}.weight"] @ x + w.get(f"{prefix}.bias", 0.0)
    return y


def _layer_norm(w: Weights, prefix: str, x: np.ndarray, eps: float) -> np.ndarray:
    mean = sum(float(v) for v in x) / len(x)
    var = sum((float(v) - mean) ** 2 for v in x) / len(x)  # biased, as LayerNorm
    normed = (x - mean) / math.sqrt(var + eps) * w[f"{prefix}.weight"]
    out: np.ndarray = normed + w.get(f"{prefix}.bias", 0.0)
    return out


def _activation(name: str, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for n, v in enumerate(x):
        v = float(v)
        if name == "gelu":  # exact: x Φ(x)
            out[n] = 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))
        elif name == "gelu_tanh":
            out[n] = 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
        elif name == "relu":
            out[n] = max(v, 0.0)
        elif name == "silu":
            out[n] = v / (1.0 + math.exp(-v))
        else:
            raise ValueError(f"unknown activation {name!r}")
    return out


def _window(config: EncoderConfig, layer: int) -> int | None:
    if config.global_every is not None and layer % config.global_every == 0:
        return None
    return config.window


def _allowed(config: EncoderConfig, layer: int, mask: np.ndarray, i: int, j: int) -> bool:
    if mask[j] == 0:
        return False
    if config.causal and j > i:
        return False
    window = _window(config, layer)
    return window is None or abs(i - j) <= window


def _rotated(config: EncoderConfig, layer: int, x: np.ndarray, t: int) -> np.ndarray:
    """Each head's slice of ``x`` turned pair by pair by the angles of position ``t``."""
    if config.rotary is None:
        return x
    theta = config.rotary_theta
    if _window(config, layer) is not None and config.local_rotary_theta is not None:
        theta = config.local_rotary_theta
    d_k, out = config.head_dim, x.copy()
    d_r = int(d_k * config.rotary_fraction)  # the first d_r dims turn, the others pass
    scale = config.rotary_scale
    for head in range(config.n_heads):
        for m in range(d_r // 2):
            a, b = (2 * m, 2 * m + 1) if config.rotary == "interleaved" else (m, m + d_r // 2)
            a, b = head * d_k + a, head * d_k + b
            freqs = config.rotary_inv_freq
            angle = t * (theta ** (-2.0 * m / d_r) if freqs is None else freqs[m])
            cos, sin = math.cos(angle) * scale, math.sin(angle) * scale
            out[a] = x[a] * cos - x[b] * sin
            out[b] = x[b] * cos + x[a] * sin
    return out


def _attention(
    w: Weights,
    prefix: str,
    config: EncoderConfig,
    layer: int,
    x: dict[int, np.ndarray],
    mask: np.ndarray,
) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """One attention sub-layer over the real positions ``x`` (position -> vector).

    Returns the projected output per real position and the weights (h, T, T),
    NaN in padded query rows.
    """
    seq = len(mask)
    h, d_k = config.n_heads, config.head_dim
    q = {i: _rotated(config, layer, _linear(w, f"{prefix}.q_proj", xi), i) for i, xi in x.items()}
    k = {i: _rotated(config, layer, _linear(w, f"{prefix}.k_proj", xi), i) for i, xi in x.items()}
    v = {i: _linear(w, f"{prefix}.v_proj", xi) for i, xi in x.items()}
    weights = np.full((h, seq, seq), np.nan)
    out: dict[int, np.ndarray] = {}
    for i in x:
        context = np.zeros(config.d_model)
        for head in range(h):
            sl = slice(head * d_k, (head + 1) * d_k)
            keys = [j for j in range(seq) if _allowed(config, layer, mask, i, j)]
            scores: dict[int, float] = {}
            for j in keys:
                if config.scoring == "dot":
                    scores[j] = float(np.dot(q[i][sl], k[j][sl])) / math.sqrt(d_k)
                else:
                    # The parameters are stored (in, out): the docstring's W_q q is
                    # q @ add_wq[h] (unlike nn.Linear, which stores (out, in)).
                    wq = q[i][sl] @ w[f"{prefix}.add_wq"][head]
                    wk = k[j][sl] @ w[f"{prefix}.add_wk"][head]
                    scores[j] = float(np.dot(w[f"{prefix}.add_v"][head], np.tanh(wq + wk)))
                if config.alibi:
                    scores[j] -= 2.0 ** (-8.0 * (head + 1) / h) * abs(i - j)
            top = max(scores.values())
            exp = {j: math.exp(s - top) for j, s in scores.items()}
            total = sum(exp.values())
            row = np.zeros(seq)
            for j in keys:
                row[j] = exp[j] / total
                context[sl] += row[j] * v[j][sl]
            weights[head, i] = row
        out[i] = _linear(w, f"{prefix}.out_proj", context)
    return out, weights


def _ffn(w: Weights, prefix: str, config: EncoderConfig, x: np.ndarray) -> np.ndarray:
    up = _linear(w, f"{prefix}.up", x)
    if config.glu:
        hidden = _activation(config.activation, up[: config.d_ff]) * up[config.d_ff :]
    else:
        hidden = _activation(config.activation, up)
    return _linear(w, f"{prefix}.down", hidden)


def reference_forward(
    w: Weights, config: EncoderConfig, embeds: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Encoder output for ``embeds`` (B, T, d_model) and ``mask`` (B, T) of 1/0.

    Returns ``hidden`` (B, T, d_model) and ``attentions`` (B, L, h, T, T) in
    float64; rows of padded query positions are NaN (not computed).
    """
    hidden, attentions, _ = reference_forward_all(w, config, embeds, mask)
    return hidden, attentions


def reference_forward_all(
    w: Weights, config: EncoderConfig, embeds: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``reference_forward``'s (hidden, attentions), and the hidden states.

    ``states`` (B, L + 1, T, d_model): the input embeddings, then each layer's output;
    for pre-LN the last is taken after the final LayerNorm, so it equals ``hidden``.
    Rows of padded positions are NaN (not computed), as in the other two.
    """
    batch, seq, d_model = embeds.shape
    eps = config.layer_norm_eps
    hidden = np.full((batch, seq, d_model), np.nan)
    attentions = np.full((batch, config.n_layers, config.n_heads, seq, seq), np.nan)
    states = np.full((batch, config.n_layers + 1, seq, d_model), np.nan)
    for b in range(batch):
        x = {i: embeds[b, i].astype(np.float64) for i in range(seq) if mask[b, i] != 0}
        for i, xi in x.items():
            states[b, 0, i] = xi
        for layer in range(config.n_layers):
            p = f"layers.{layer}"
            if config.norm_placement == "pre":
                if layer == 0 and not config.first_attn_norm:
                    normed = dict(x)
                else:
                    normed = {i: _layer_norm(w, f"{p}.attn_norm", xi, eps) for i, xi in x.items()}
                attn_out, attn_w = _attention(w, f"{p}.attn", config, layer, normed, mask[b])
                x = {i: x[i] + attn_out[i] for i in x}
                x = {
                    i: xi + _ffn(w, f"{p}.ffn", config, _layer_norm(w, f"{p}.ffn_norm", xi, eps))
                    for i, xi in x.items()
                }
            else:
                attn_out, attn_w = _attention(w, f"{p}.attn", config, layer, x, mask[b])
                x = {i: _layer_norm(w, f"{p}.attn_norm", x[i] + attn_out[i], eps) for i in x}
                x = {
                    i: _layer_norm(w, f"{p}.ffn_norm", xi + _ffn(w, f"{p}.ffn", config, xi), eps)
                    for i, xi in x.items()
                }
            attentions[b, layer] = attn_w
            for i, xi in x.items():
                states[b, layer + 1, i] = xi
        if config.norm_placement == "pre":
            x = {i: _layer_norm(w, "final_norm", xi, eps) for i, xi in x.items()}
            for i, xi in x.items():
                states[b, config.n_layers, i] = xi  # the last state after the final norm
        for i, xi in x.items():
            hidden[b, i] = xi
    return hidden, attentions, states


def ragged_batch(
    lengths: tuple[int, ...], d_model: int, *, seed: int, left_pad: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Random float32 embeddings (B, T, d_model) and an int64 1/0 mask (B, T).

    Sequence b has ``lengths[b]`` real tokens, padded to the longest with zero
    embeddings, on the right (default) or on the left.
    """
    rng = np.random.default_rng(seed)
    seq = max(lengths)
    embeds = np.zeros((len(lengths), seq, d_model), dtype=np.float32)
    mask = np.zeros((len(lengths), seq), dtype=np.int64)
    for b, n in enumerate(lengths):
        span = slice(seq - n, seq) if left_pad else slice(0, n)
        embeds[b, span] = rng.standard_normal((n, d_model)).astype(np.float32)
        mask[b, span] = 1
    return embeds, mask
