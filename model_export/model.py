"""A multi-head self-attention encoder written from the math.

Per layer (post-LN, as in BERT)::

    A = softmax(R(Q) R(K)ᵀ / √d_k + P + M) V    per head, d_k = d_model / h
    x = LayerNorm(x + W_o concat(A_1..A_h))
    x = LayerNorm(x + W_2 act(W_1 x))

or pre-LN: ``x = x + W_o concat(A(LayerNorm(x)))``, ``x = x + FFN(LayerNorm(x))``
and one LayerNorm after the last layer; Gemma3's sandwich norms also norm each
sub-layer's output before the sum: ``x = x + N'(W_o concat(A(N(x))))``, and its scores
are multiplied by a set scale instead of divided by √d_k. A gated feed-forward (``glu``)
is ``W_2 (act(W_1 x) ⊙ W_g x)``: GeGLU with GELU (ModernBERT), SwiGLU with SiLU.

R rotates each head's query and key at position t by angles t·θ^(-2i/d_k), one
per pair of dimensions (``rotary``; identity without): RoFormer pairs neighbours
(x_2i, x_2i+1), ModernBERT pairs halves (x_i, x_i+d_k/2). Rotated scores depend
on j - i only; values are not rotated. Partial rotary (NomicBERT's fraction)
rotates the first d_r dims only, with d_r in place of d_k; a scaled RoPE (GTE's
rope_parameters) gives its own frequencies for t·f_i and may scale cos and sin.

P is a position bias, the same in every layer: MPNet's relative position bias
(``relative_buckets``; per head a learned scalar for the bucket of the offset
j - i) and/or ALiBi's -m_h·|i - j| (``alibi``); 0 without either.

DeBERTa's disentangled attention (``relative_embeddings``) adds two terms that
depend on the layer's queries and keys, so they are part of the scores rather
than of P: with r = row(i, j) of the shared relative embeddings E_r,
``q_i·(E_r W_k)[r]`` (content-to-position) and ``k_j·(E_r W_q)[r]``
(position-to-content); all terms share one scale 1/√(d_k · ``score_scale_factor``).

Task adapters (``lora_tasks``, Jina v3): each projection W of a layer is W x + B_t A_t x
for the task t of the row (``TaskLoRALinear``), t = 0 the base model.

M is 0 where a query may see a key and -10000 elsewhere. The allowed set is the
intersection of key padding, the optional causal mask and the optional local
window of radius r, which may differ per layer (ModernBERT's global layers have
none): M is computed once per distinct window. exp(-10000) is exactly 0 in
float32, so forbidden keys get exactly zero weight, and a finite M means no row
can turn into NaN, padded query rows included; those rows (and padded
embeddings) are then set to exactly 0. Without a causal mask or window, M is
written as BERT writes it, ``(1 - mask) · -10000``, which onnxruntime's
optimizer recognises and fuses into one ``Attention`` kernel per layer.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model_export.config import EncoderConfig, Rotary


def allowed_keys(
    attention_mask: Tensor, *, causal: bool = False, window: int | None = None
) -> Tensor:
    """Boolean [batch, 1, seq, seq]: may query i attend to key j?"""
    seq = attention_mask.shape[1]
    key_ok = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    pos = torch.arange(seq, device=attention_mask.device)
    offset = pos[None, :] - pos[:, None]  # (T, T): j - i
    structural = torch.ones_like(offset, dtype=torch.bool)
    if causal:
        structural = structural & (offset <= 0)
    if window is not None:
        structural = structural & (offset.abs() <= window)
    diagonal = offset == 0
    # Diagonal always allowed: a padded query keeps one finite score, so no NaN.
    return (key_ok & structural[None, None]) | diagonal[None, None]  # (B, 1, T, T)


# The additive score of a forbidden key: BERT's value, the one onnxruntime's fused
# attention assumes. Scores differ by far less, so its softmax weight is exactly 0.
MASKED_SCORE = -10000.0


def mask_bias(attention_mask: Tensor, *, causal: bool = False, window: int | None = None) -> Tensor:
    """Additive M, broadcastable to the scores: (B, 1, 1, T), or (B, 1, T, T) with structure."""
    if not causal and window is None:
        keys = attention_mask[:, None, None, :].to(torch.float32)  # (B, 1, 1, T)
        return (1.0 - keys) * MASKED_SCORE
    allowed = allowed_keys(attention_mask, causal=causal, window=window)
    return torch.zeros(allowed.shape).masked_fill(~allowed, MASKED_SCORE)  # (B, 1, T, T)


def relative_buckets(num_buckets: int, max_distance: int) -> Tensor:
    """Bucket of each distance |j - i| in 0..max_distance for one direction, (max_distance + 1,).

    MPNet's (T5's) ``relative_position_bucket``: distances below a quarter of the
    buckets get one bucket each; larger ones share log-spaced buckets up to
    ``max_distance``, beyond which they all fall in the last. Evaluated here once,
    with transformers' float32 operations in transformers' order, and looked up in
    the graph: onnxruntime's Log rounding differently from torch's could otherwise
    move a distance that sits on a boundary (64: log(8)/log(16)·8 = 6) to the next
    bucket.
    """
    half = num_buckets // 2  # one half per direction
    max_exact = half // 2
    n = torch.arange(max_distance + 1)
    scaled = torch.log(n.clamp(min=max_exact).float() / max_exact)
    large = max_exact + (scaled / math.log(max_distance / max_exact) * (half - max_exact)).long()
    return torch.where(n < max_exact, n, large.clamp(max=half - 1))


class RelativePositionBias(nn.Module):
    """P: one learned scalar per head and bucket of j - i, shared by every layer (MPNet)."""

    bucket_of_distance: Tensor  # (max_distance + 1,): ``relative_buckets``

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        assert config.relative_buckets is not None
        self.max_distance = config.relative_max_distance
        self.per_direction = config.relative_buckets // 2
        self.table = nn.Embedding(config.relative_buckets, config.n_heads)
        # Not a weight: derived from the config, so kept out of the state dict.
        self.register_buffer(
            "bucket_of_distance",
            relative_buckets(config.relative_buckets, self.max_distance),
            persistent=False,
        )

    def forward(self, seq_len: int) -> Tensor:
        """P for a sequence of ``seq_len`` tokens: (1, h, T, T)."""
        pos = torch.arange(seq_len, device=self.table.weight.device)
        offset = pos[None, :] - pos[:, None]  # (T, T): j - i
        distance = offset.abs().clamp(max=self.max_distance)  # (T, T)
        after = (offset > 0).long()  # (T, T): keys after the query use the upper half
        bucket = self.bucket_of_distance[distance] + after * self.per_direction  # (T, T)
        bias: Tensor = self.table(bucket).permute(2, 0, 1)[None]  # (1, h, T, T)
        return bias


def log_bucket_positions(offsets: Tensor, buckets: int, max_distance: int) -> Tensor:
    """DeBERTa's ``make_log_bucket_position`` of integer offsets i - j: offsets within
    ±buckets/2 kept, larger ones log-spaced up to ``max_distance`` (and beyond it on the
    same curve), the sign kept. transformers' float32 operations in transformers' order,
    evaluated once per export (as ``relative_buckets``) and looked up in the graph."""
    sign = torch.sign(offsets)
    mid = buckets // 2
    inside = (offsets < mid) & (offsets > -mid)
    abs_pos = torch.where(inside, torch.tensor(mid - 1).type_as(offsets), offsets.abs())
    ratio = torch.log(torch.tensor((max_distance - 1) / mid))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / ratio * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, offsets.type_as(log_pos), log_pos * sign).long()


class RelativeEmbeddings(nn.Module):
    """DeBERTa's relative position embeddings: one table of 2k rows (LayerNorm'd with
    ``relative_norm``) shared by every layer, and the row each query i and key j read,
    clamp(δ + k, 0, 2k - 1) for the offset δ = i - j or its log bucket. Each layer
    projects the rows itself (``DisentangledScores``)."""

    row_of_offset: Tensor  # (2 max_seq_len - 1,): the row of offset i - j + max_seq_len - 1

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        assert config.relative_embeddings is not None
        span, self.max_len = config.relative_embeddings, config.max_seq_len
        self.table = nn.Embedding(2 * span, config.d_model)
        self.norm = norm_layer(config) if config.relative_norm else None
        offsets = torch.arange(-(self.max_len - 1), self.max_len)  # i - j
        if config.position_buckets is not None:
            buckets, distance = config.position_buckets, config.relative_max_distance
            offsets = log_bucket_positions(offsets, buckets, distance)
        # Not a weight: derived from the config, so kept out of the state dict.
        rows = (offsets + span).clamp(0, 2 * span - 1)
        self.register_buffer("row_of_offset", rows, persistent=False)

    def forward(self, seq_len: int) -> tuple[Tensor, Tensor]:
        """The rows (2k, d_model) and each query's and key's row (T, T)."""
        rows = self.table.weight  # (2k, d_model)
        if self.norm is not None:
            rows = self.norm(rows)
        pos = torch.arange(seq_len, device=rows.device)
        offset = pos[:, None] - pos[None, :] + (self.max_len - 1)  # (T, T): i - j, shifted
        return rows, self.row_of_offset[offset]


# DeBERTa's relative rows (2k, d_model) and each (query, key)'s row (T, T), or None.
Relative = tuple[Tensor, Tensor] | None


class DisentangledScores(nn.Module):
    """One layer's DeBERTa position terms, (B, h, T_q, T_k): content-to-position
    q_i·K_r[row(i, j)] and position-to-content k_j·Q_r[row(i, j)], K_r and Q_r the
    relative rows through the layer's key and query projections (shared) or through
    its own ``key_proj`` and ``query_proj``, each term over √(d_k · scale factor).

    Position-to-content reads row(j → i) of -δ in transformers; buckets are odd
    (bucket(-δ) = -bucket(δ)), so that is row(i, j) too."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.c2p, self.p2c = config.content_to_position, config.position_to_content
        self.scale = math.sqrt(config.head_dim * config.score_scale_factor)
        own, d = not config.share_position_projections, config.d_model
        # transformers' pos_key_proj / pos_query_proj: always with a bias.
        self.key_proj = nn.Linear(d, d) if self.c2p and own else None
        self.query_proj = nn.Linear(d, d) if self.p2c and own else None

    def _rows(self, proj: nn.Linear, rows: Tensor) -> Tensor:
        """proj(rows) split into heads: (h, 2k, d_k)."""
        projected: Tensor = proj(rows)  # (2k, d_model)
        return projected.view(rows.shape[0], self.n_heads, self.head_dim).transpose(0, 1)

    def forward(
        self, q: Tensor, k: Tensor, relative: tuple[Tensor, Tensor], shared: tuple[nn.Linear, ...]
    ) -> Tensor:
        """q (B, h, T_q, d_k), k (B, h, T_k, d_k), the relative rows and row indices
        (T_q, T_k), the layer's (query, key) projections -> (B, h, T_q, T_k)."""
        rows, index = relative
        b, h, t_q, _ = q.shape
        t_k = k.shape[2]
        terms: list[Tensor] = []
        if self.c2p:
            pos_k = self._rows(self.key_proj or shared[1], rows)  # (h, 2k, d_k)
            c2p = q @ pos_k.transpose(-2, -1)  # (B, h, T_q, 2k)
            terms.append(c2p.gather(-1, index.expand(b, h, t_q, t_k)) / self.scale)
        if self.p2c:
            pos_q = self._rows(self.query_proj or shared[0], rows)  # (h, 2k, d_k)
            p2c = k @ pos_q.transpose(-2, -1)  # (B, h, T_k, 2k)
            by_key = p2c.gather(-1, index.t().expand(b, h, t_k, t_q))  # (B, h, T_k, T_q)
            terms.append(by_key.transpose(-2, -1) / self.scale)
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's m_h (Press et al., 2022): 2^(-8k/n) for k = 1..n with n = h a power of
    two; otherwise those of the power of two below h, then every other slope of twice
    that power, as the paper's reference code (and BLOOM's) does."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    below = 2 ** math.floor(math.log2(n_heads))
    slopes = geometric(below) + geometric(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes, dtype=torch.float32)


class AlibiBias(nn.Module):
    """ALiBi's P: -m_h·|i - j| per head, no weights (linear in the distance)."""

    slopes: Tensor  # (h,)

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(config.n_heads), persistent=False)

    def forward(self, seq_len: int) -> Tensor:
        """P for a sequence of ``seq_len`` tokens: (1, h, T, T)."""
        pos = torch.arange(seq_len, device=self.slopes.device)
        distance = (pos[None, :] - pos[:, None]).abs().float()  # (T, T): |j - i|
        bias: Tensor = -self.slopes[:, None, None] * distance[None]  # (h, T, T)
        return bias[None]


def rotary_angles(
    max_len: int, head_dim: int, theta: float, rotary: Rotary, factor: float | None = None
) -> Tensor:
    """t·θ^(-2i/d_k) for t < ``max_len``, i < d_k/2: (max_len, d_k/2), computed as each
    convention's reference does: RoFormer's table in float64, then rounded;
    ModernBERT's (transformers' default RoPE) in float32. A linear ``factor`` divides the
    frequencies (t / factor: transformers' rope_type "linear", Gemma3's global layers)."""
    if rotary == "interleaved":
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]
        pos = pos if factor is None else pos / factor
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        return pos / torch.pow(torch.tensor(theta, dtype=torch.float64), exponent)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if factor is not None:
        inv_freq = inv_freq / factor
    return torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq


class RotaryEmbedding(nn.Module):
    """R's cos and sin for one base θ (and linear factor), laid out for its convention; one
    per distinct θ and factor, shared by the layers that use it (the tables are not weights)."""

    cos_half: Tensor  # (max_len, d_k/2)
    sin_half: Tensor

    def __init__(self, config: EncoderConfig, theta: float, factor: float | None = None) -> None:
        super().__init__()
        assert config.rotary is not None
        self.rotary: Rotary = config.rotary
        if config.rotary_inv_freq is None:
            angles = rotary_angles(
                config.max_seq_len, config.rotary_dims, theta, config.rotary, factor
            )
        else:  # a scaled RoPE's frequencies, applied as transformers does: in float32
            inv_freq = torch.tensor(config.rotary_inv_freq, dtype=torch.float32)
            angles = torch.arange(config.max_seq_len, dtype=torch.float32)[:, None] * inv_freq
        cos, sin = angles.cos().float(), angles.sin().float()  # (max_len, d_r/2)
        if config.rotary_scale != 1.0:  # YaRN's attention factor, on cos and sin
            cos, sin = cos * config.rotary_scale, sin * config.rotary_scale
        self.register_buffer("cos_half", cos, persistent=False)
        self.register_buffer("sin_half", sin, persistent=False)

    def forward(self, seq_len: int) -> tuple[Tensor, Tensor]:
        """cos, sin for positions 0..T-1, each (T, d_k): one angle per pair, repeated
        over the pair's two dimensions."""
        cos, sin = self.cos_half[:seq_len], self.sin_half[:seq_len]  # (T, d_k/2)
        if self.rotary == "interleaved":  # [c0, c0, c1, c1, …]
            return _interleave(cos, cos), _interleave(sin, sin)
        # [c0, c1, …, c0, c1, …]
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def _interleave(a: Tensor, b: Tensor) -> Tensor:
    """[a0, b0, a1, b1, …] along the last axis."""
    return torch.stack((a, b), dim=-1).flatten(-2)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, rotary: Rotary) -> Tensor:
    """R(x) = x·cos + x⊥·sin, x⊥ each pair (a, b) turned to (-b, a): (B, h, T, d_k).
    Partial rotary: cos and sin cover the first d_r < d_k dims only; the rest pass."""
    dims = cos.shape[-1]
    if dims < x.shape[-1]:
        return torch.cat((rotate(x[..., :dims], cos, sin, rotary), x[..., dims:]), dim=-1)
    if rotary == "interleaved":
        turned = _interleave(-x[..., 1::2], x[..., 0::2])
    else:
        half = x.shape[-1] // 2
        turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


# cos and sin (T, d_k) of one layer's rotation, or None without rotary.
Rotation = tuple[Tensor, Tensor] | None


class RMSNorm(nn.Module):
    """x / √(mean(x²) + eps) · w, or Gemma's · (1 + w) (``plus_one``); no bias, no mean."""

    def __init__(self, size: int, eps: float, *, plus_one: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if plus_one else torch.ones(size))
        self.eps = eps
        self.plus_one = plus_one

    def forward(self, x: Tensor) -> Tensor:
        normed = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + self.eps)
        scale = 1.0 + self.weight if self.plus_one else self.weight
        out: Tensor = normed * scale
        return out


def norm_layer(config: EncoderConfig, size: int | None = None) -> nn.Module:
    """The config's normalisation over ``size`` features (d_model by default)."""
    size = config.d_model if size is None else size
    if config.norm == "layer":
        return nn.LayerNorm(size, eps=config.layer_norm_eps, bias=config.norm_bias)
    return RMSNorm(size, config.layer_norm_eps, plus_one=config.norm == "rms_plus_one")


class TaskLoRALinear(nn.Linear):
    """W x + b + B_t A_t x: a projection with one low-rank adapter per task (LoRA, Hu et
    al.; Jina v3's task adapters), chosen per row by its task id t.

    The factors of every task are stacked, ``lora_a`` (k + 1, in, r) and ``lora_b``
    (k + 1, r, out), and gathered by the row's task: one graph serves every task with
    each weight once. Slot 0 is zero (the base model); LoRA's scaling α/r is folded
    into ``lora_b`` on import. Without a task it is the plain projection.
    """

    def __init__(self, in_features: int, out_features: int, tasks: int, rank: int, bias: bool):
        super().__init__(in_features, out_features, bias=bias)
        self.lora_a = nn.Parameter(torch.zeros(tasks + 1, in_features, rank))
        self.lora_b = nn.Parameter(torch.zeros(tasks + 1, rank, out_features))

    def forward(self, x: Tensor, task: Tensor | None = None) -> Tensor:
        """x (B, T, in), task int64 (B,) -> (B, T, out)."""
        out = super().forward(x)
        if task is None:
            return out
        low = x @ self.lora_a[task]  # (B, T, r)
        adapted: Tensor = out + low @ self.lora_b[task]  # (B, T, out)
        return adapted


def linear(config: EncoderConfig, d_in: int, d_out: int, bias: bool) -> nn.Linear:
    """A projection, with task adapters where the config has them."""
    if config.lora_tasks:
        return TaskLoRALinear(d_in, d_out, config.lora_tasks, config.lora_rank, bias)
    return nn.Linear(d_in, d_out, bias=bias)


def project(proj: nn.Linear, x: Tensor, task: Tensor | None) -> Tensor:
    """``proj(x)``, through the row's task adapter where it has one."""
    out: Tensor = (
        proj(x, task) if task is not None and isinstance(proj, TaskLoRALinear) else proj(x)
    )
    return out


class MultiHeadSelfAttention(nn.Module):
    """h heads of scaled dot-product (or additive) attention, then W_o. With fewer
    key/value heads than query heads (grouped-query attention), query head h reads
    key/value head h // (n_heads / kv_heads): its map and value norms are head h's own."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.kv_heads = config.key_heads
        self.head_dim = config.head_dim
        self.scoring = config.scoring
        self.rotary = config.rotary
        self.scale = math.sqrt(config.head_dim * config.score_scale_factor)
        self.score_scale = config.score_scale  # Gemma3's: multiplies instead
        d, bias = config.d_model, config.attention_bias
        inner, kv = self.n_heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_proj = linear(config, d, inner, bias)
        self.k_proj = linear(config, d, kv, bias)
        self.v_proj = linear(config, d, kv, bias)
        self.out_proj = linear(config, inner, d, config.output_bias)
        # Qwen3's and Gemma3's per-head norms of queries and keys, before rotary.
        self.q_norm = norm_layer(config, self.head_dim) if config.qk_norm else None
        self.k_norm = norm_layer(config, self.head_dim) if config.qk_norm else None
        self.dropout = nn.Dropout(config.dropout)
        if config.scoring == "additive":
            # Bahdanau et al.: score(q, k) = vᵀ tanh(W_q q + W_k k), one set per head.
            hd = self.head_dim
            self.add_wq = nn.Parameter(torch.empty(config.n_heads, hd, hd))
            self.add_wk = nn.Parameter(torch.empty(config.n_heads, hd, hd))
            self.add_v = nn.Parameter(torch.empty(config.n_heads, hd))
        positional = config.content_to_position or config.position_to_content
        self.disentangled = DisentangledScores(config) if positional else None

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, heads, T, d_k)

    def _per_query_head(self, x: Tensor) -> Tensor:
        """Key/value heads (B, kv, T, d_k) repeated for their query heads: (B, h, T, d_k)."""
        if self.kv_heads == self.n_heads:
            return x
        return x.repeat_interleave(self.n_heads // self.kv_heads, dim=1)

    def queries(self, x: Tensor, rotation: Rotation = None, task: Tensor | None = None) -> Tensor:
        """Each head's queries (B, h, T, d_k): projected (through the row's ``task``
        adapter, where the model has them), normed (qk_norm), rotated."""
        return self._positioned(self.q_proj, self.q_norm, x, rotation, task)

    def keys(self, x: Tensor, rotation: Rotation = None, task: Tensor | None = None) -> Tensor:
        """Each query head's keys (B, h, T, d_k), shared within a group."""
        return self._per_query_head(self._positioned(self.k_proj, self.k_norm, x, rotation, task))

    def values(self, x: Tensor, task: Tensor | None = None) -> Tensor:
        """Each query head's values (B, h, T, d_k): not rotated, shared within a group."""
        return self._per_query_head(self._split_heads(project(self.v_proj, x, task)))

    def _positioned(
        self,
        proj: nn.Linear,
        norm: nn.Module | None,
        x: Tensor,
        rotation: Rotation,
        task: Tensor | None = None,
    ) -> Tensor:
        out = self._split_heads(project(proj, x, task))  # (B, heads, T, d_k)
        if norm is not None:
            out = norm(out)
        if rotation is not None and self.rotary is not None:
            out = rotate(out, *rotation, self.rotary)
        return out

    def scores(self, q: Tensor, k: Tensor, relative: Relative = None) -> Tensor:
        """Unnormalised scores (B, h, T, T) before the mask; with ``relative`` (DeBERTa's
        rows and row indices) its position terms added."""
        if self.scoring == "dot" and self.score_scale is not None:  # Gemma3's scale
            return (q @ k.transpose(-2, -1)) * self.score_scale  # (B, h, T, T)
        if self.scoring == "dot":
            content = (q @ k.transpose(-2, -1)) / self.scale  # (B, h, T, T)
            if self.disentangled is None or relative is None:
                return content
            position: Tensor = self.disentangled(q, k, relative, (self.q_proj, self.k_proj))
            return content + position
        wq = torch.einsum("bhtd,hde->bhte", q, self.add_wq)  # (B, h, T, d_k)
        wk = torch.einsum("bhtd,hde->bhte", k, self.add_wk)  # (B, h, T, d_k)
        hidden = torch.tanh(wq[:, :, :, None, :] + wk[:, :, None, :, :])  # (B, h, T, T, d_k)
        return torch.einsum("bhije,he->bhij", hidden, self.add_v)  # (B, h, T, T)

    def forward(
        self,
        x: Tensor,
        bias: Tensor,
        rotation: Rotation = None,
        *,
        need_norms: bool = False,
        relative: Relative = None,
        task: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """x (B, T, d), additive ``bias`` (P + M), the layer's ``rotation`` and DeBERTa's
        ``relative`` rows -> output (B, T, d), weights (B, h, T, T), and with
        ``need_norms`` each head's value norms (B, h, T). ``task`` (B,): each row's task
        adapter (models with ``lora_tasks``)."""
        b, t, _ = x.shape
        q = self.queries(x, rotation, task)  # (B, h, T, d_k)
        k = self.keys(x, rotation, task)  # (B, h, T, d_k)
        v = self.values(x, task)  # (B, h, T, d_k): values are not rotated
        scores = self.scores(q, k, relative) + bias  # (B, h, T, T)
        weights = torch.softmax(scores, dim=-1)  # (B, h, T, T); masked keys exactly 0
        context = self.dropout(weights) @ v  # (B, h, T, d_k)
        context = context.transpose(1, 2).reshape(b, t, -1)  # (B, T, h·d_k)
        norms = self.value_norms(v, task) if need_norms else None
        return project(self.out_proj, context, task), weights, norms

    def value_norms(self, v: Tensor, task: Tensor | None = None) -> Tensor:
        """‖f_h(x_j)‖ with f_h(x) = (x W_V^h + b_V^h) W_O^h, head h's slice of the output
        projection, its bias excluded (Kobayashi et al., 2020): (B, h, T, d_k) -> (B, h, T).
        Bias-free projections make b_V^h 0: ``v`` already holds what the model used.
        ``α_ij ‖f_h(x_j)‖`` is then how much token j moves token i through head h."""
        b, d = v.shape[0], self.out_proj.weight.shape[0]
        # W_Oᵀ (h·d_k, d) -> (h, d_k, d): head h's rows, as a matmul (no einsum: the
        # exported MatMul keeps onnxruntime's shape inference and fusions working). Taken
        # from the transpose the projection itself multiplies by, so the exported graph
        # holds those bytes once (model_export.weights_file shares equal bytes).
        per_head = self.out_proj.weight.t().reshape(self.n_heads, self.head_dim, d)
        transformed = v @ per_head  # (B, h, T, d)
        out_proj = self.out_proj
        if task is not None and isinstance(out_proj, TaskLoRALinear):
            # The row's W_O is W_O + (B_t A_t)ᵀ: head h's rows of A_t, then B_t.
            a = out_proj.lora_a[task]  # (B, d_model, r)
            a = a.reshape(b, self.n_heads, self.head_dim, a.shape[-1])  # (B, h, d_k, r)
            b_t = out_proj.lora_b[task][:, None]  # (B, 1, r, d)
            transformed = transformed + (v @ a) @ b_t  # (B, h, T, d)
        # sqrt(sum(x²)), not vector_norm: its ReduceL2 export has no shape for onnxruntime's
        # symbolic shape inference, which then skips the attention graph's fusions.
        norms: Tensor = transformed.square().sum(dim=-1).sqrt()
        return norms


class FeedForward(nn.Module):
    """Position-wise W_2 act(W_1 x), or gated: W_2 (act(W_1 x) ⊙ W_g x) with W_1 and W_g
    stacked in ``up`` (ModernBERT's ``Wi`` layout: input half first, gate half second)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.glu = config.glu
        up = 2 * config.d_ff if config.glu else config.d_ff
        self.up = linear(config, config.d_model, up, config.up_bias)
        self.down = linear(config, config.d_ff, config.d_model, config.mlp_bias)
        self.activation = config.activation
        self.dropout = nn.Dropout(config.dropout)

    def act(self, h: Tensor) -> Tensor:
        if self.activation == "gelu":
            return F.gelu(h)
        if self.activation == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        if self.activation == "silu":
            return F.silu(h)
        return F.relu(h)

    def forward(self, x: Tensor, task: Tensor | None = None) -> Tensor:
        h = project(self.up, x, task)  # (B, T, d_ff), or (B, T, 2 d_ff) gated
        if self.glu:
            value, gate = h.chunk(2, dim=-1)  # (B, T, d_ff) each
            h = self.act(value) * gate
        else:
            h = self.act(h)
        out: Tensor = self.dropout(project(self.down, h, task))
        return out


class EncoderBlock(nn.Module):
    """Attention and feed-forward sub-layers, each with residual + LayerNorm. With
    ``sandwich_norms`` (Gemma3) each pre-LN sub-layer's output is normed too before the
    residual sum: x + out_norm(sublayer(norm(x)))."""

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.attn = MultiHeadSelfAttention(config)
        skip = index == 0 and not config.first_attn_norm  # ModernBERT's layer 0
        self.attn_norm: nn.Module = nn.Identity() if skip else norm_layer(config)
        self.ffn = FeedForward(config)
        self.ffn_norm = norm_layer(config)
        sandwich = config.sandwich_norms
        self.attn_out_norm: nn.Module = norm_layer(config) if sandwich else nn.Identity()
        self.ffn_out_norm: nn.Module = norm_layer(config) if sandwich else nn.Identity()
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        bias: Tensor,
        rotation: Rotation = None,
        *,
        need_norms: bool = False,
        relative: Relative = None,
        task: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        if self.pre_norm:
            normed = self.attn_norm(x)
            attn_out, weights, norms = self.attn(
                normed, bias, rotation, need_norms=need_norms, relative=relative, task=task
            )
            x = x + self.dropout(self.attn_out_norm(attn_out))
            x = x + self.ffn_out_norm(self.ffn(self.ffn_norm(x), task))
        else:
            attn_out, weights, norms = self.attn(
                x, bias, rotation, need_norms=need_norms, relative=relative, task=task
            )
            x = self.attn_norm(x + self.dropout(attn_out))
            x = self.ffn_norm(x + self.ffn(x, task))
        return x, weights, norms


class EncoderOutput(NamedTuple):
    """What one forward returns: the last layer's output, and what the flags asked for."""

    hidden: Tensor  # (B, T, d_model)
    attention: Tensor | None = None  # (B, L, h, T, T)
    hidden_states: Tensor | None = None  # (B, L + 1, T, d_model)
    value_norms: Tensor | None = None  # (B, L, h, T)


class Encoder(nn.Module):
    """A stack of ``n_layers`` encoder blocks over token embeddings: one forward, whose
    flags select the outputs (each exactly 0 at padded positions)."""

    def __init__(self, config: EncoderConfig, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(EncoderBlock(config, i) for i in range(config.n_layers))
        self.relative_bias = (
            RelativePositionBias(config) if config.relative_buckets is not None else None
        )
        self.alibi = AlibiBias(config) if config.alibi else None
        self.relative_embeddings = (
            RelativeEmbeddings(config) if config.relative_embeddings is not None else None
        )
        # One rotary table per distinct base and linear factor (ModernBERT, Gemma3: global
        # and local).
        self.rotations = sorted(
            {config.layer_rotary(i) for i in range(config.n_layers)},
            key=lambda rotation: (rotation[0], rotation[1] or 0.0),
        )
        self.rotary = nn.ModuleList(
            RotaryEmbedding(config, theta, factor)
            for theta, factor in self.rotations
            if config.rotary is not None
        )
        # Pre-LN stacks need a final norm; post-LN blocks already end in one.
        self.final_norm = norm_layer(config) if config.norm_placement == "pre" else None
        self.reset_parameters(seed)
        self.eval()

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """BERT-style init (N(0, 0.02) weights, zero biases) from ``seed`` alone."""
        generator = torch.Generator().manual_seed(seed)
        for name, param in sorted(self.named_parameters()):
            if "norm" in name:  # identity norms: Gemma's (1 + w) at w = 0
                one = name.endswith("weight") and self.config.norm != "rms_plus_one"
                param.fill_(1.0 if one else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        for module in self.modules():  # task 0 is the base model: no adapter
            if isinstance(module, TaskLoRALinear):
                module.lora_a[0].zero_()
                module.lora_b[0].zero_()

    def forward(
        self,
        inputs_embeds: Tensor,
        attention_mask: Tensor,
        *,
        weights: bool = True,
        hidden_states: bool = False,
        value_norms: bool = False,
        task: Tensor | None = None,
    ) -> EncoderOutput:
        """The contextualized embeddings, and the outputs the flags ask for (None otherwise):
        attention weights (B, L, h, T, T); hidden states, transformers'
        ``output_hidden_states`` (the input embeddings, then each layer's output, the last
        after the final norm for pre-LN: (B, L + 1, T, d_model)); value norms (B, L, h, T),
        ``MultiHeadSelfAttention.value_norms``. All are exactly 0 at padded positions.
        ``task`` int64 (B,): each row's task adapter (0: none), models with ``lora_tasks``."""
        biases = self.layer_biases(attention_mask)
        rotations = self.layer_rotations(attention_mask.shape[1])
        relative = self.relative(attention_mask.shape[1])
        token = attention_mask.bool()  # (B, T)
        x = inputs_embeds
        per_layer: list[Tensor] = []
        per_layer_norms: list[Tensor] = []
        states: list[Tensor] = [x]
        for layer, bias, rotation in zip(self.layers, biases, rotations, strict=True):
            x, layer_weights, layer_norms = layer(
                x, bias, rotation, need_norms=value_norms, relative=relative, task=task
            )
            per_layer.append(layer_weights)
            if layer_norms is not None:
                per_layer_norms.append(layer_norms)
            states.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            states[-1] = x
        out = EncoderOutput(torch.where(token[:, :, None], x, torch.zeros_like(x)))  # (B, T, d)
        if weights:
            attn = torch.stack(per_layer, dim=1)  # (B, L, h, T, T)
            attn = torch.where(token[:, None, None, :, None], attn, torch.zeros_like(attn))
            out = out._replace(attention=attn)
        if hidden_states:
            stacked = torch.stack(states, dim=1)  # (B, L + 1, T, d_model)
            stacked = torch.where(token[:, None, :, None], stacked, torch.zeros_like(stacked))
            out = out._replace(hidden_states=stacked)
        if value_norms:
            norms = torch.stack(per_layer_norms, dim=1)  # (B, L, h, T)
            norms = torch.where(token[:, None, None, :], norms, torch.zeros_like(norms))
            out = out._replace(value_norms=norms)
        return out

    def attention_bias(self, attention_mask: Tensor, *, layer: int = 0) -> Tensor:
        """P + M, added to ``layer``'s scores: (B, 1, 1, T) or (B, 1, T, T) from the mask,
        (B, h, T, T) with a position bias. Where M is 0 the sum is P exactly, so allowed
        keys score as transformers' ``(scores + P) + M``."""
        cfg = self.config
        bias = mask_bias(attention_mask, causal=cfg.causal, window=cfg.layer_window(layer))
        seq = attention_mask.shape[1]
        if self.alibi is not None:
            bias = self.alibi(seq) + bias  # (B, h, T, T)
        if self.relative_bias is not None:
            bias = self.relative_bias(seq) + bias  # (B, h, T, T)
        return bias

    def layer_biases(self, attention_mask: Tensor) -> list[Tensor]:
        """Each layer's P + M, computed once per distinct window and shared."""
        by_window: dict[int | None, Tensor] = {}
        biases = []
        for i in range(self.config.n_layers):
            window = self.config.layer_window(i)
            if window not in by_window:
                by_window[window] = self.attention_bias(attention_mask, layer=i)
            biases.append(by_window[window])
        return biases

    def layer_rotations(self, seq_len: int) -> list[Rotation]:
        """Each layer's rotary cos and sin (T, d_k), computed once per base and factor;
        None without."""
        if not self.rotary:
            return [None] * self.config.n_layers
        tables = [rotary(seq_len) for rotary in self.rotary]
        return [
            tables[self.rotations.index(self.config.layer_rotary(i))]
            for i in range(self.config.n_layers)
        ]

    def relative(self, seq_len: int) -> Relative:
        """DeBERTa's relative rows and row indices, shared by every layer; None without."""
        if self.relative_embeddings is None:
            return None
        rows, index = self.relative_embeddings(seq_len)
        return rows, index

    def load_weights(self, path: str | Path) -> None:
        """Load a PyTorch state_dict (``.pt``/``.pth``/``.bin``) or a ``.safetensors`` file."""
        path = Path(path)
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        self.load_state_dict(state, strict=True)


class TokenEmbeddings(nn.Module):
    """BERT's input layer: LayerNorm(word[id] + position[t] + token_type[type]).

    It turns token ids into the ``inputs_embeds`` the encoder takes; exported as
    its own small graph so the service can serve text without torch. Without
    ``positions`` (rotary families: positions enter the attention instead) there
    is no position table and ``max_positions`` only bounds the sequence; a family
    without token types gets a one-row table of zeros; ``norm_bias`` false drops
    the LayerNorm's bias (ModernBERT); ``normed`` false drops the norm (LLM-style
    families). ``scale`` multiplies the looked-up word vectors (Gemma: √d_model, rounded to
    the checkpoint's dtype). The graph's inputs stay the same for all, but with
    ``lora_tasks`` (Jina v3) the word embeddings have one low-rank adapter per task,
    word[id] + A_t[id] B_t, and the graph takes each row's task.
    """

    def __init__(
        self,
        vocab_size: int,
        max_positions: int,
        type_vocab_size: int,
        d_model: int,
        eps: float,
        *,
        position_offset: int = 0,
        positions: bool = True,
        norm_bias: bool = True,
        normed: bool = True,
        scale: float | None = None,
        lora_tasks: int = 0,
        lora_rank: int = 0,
    ) -> None:
        super().__init__()
        # Token t sits at row t + position_offset of the position table (RoBERTa's rows
        # start after its padding id; BERT's at 0).
        self.position_offset = position_offset
        self.max_positions = max_positions
        self.word = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_positions, d_model) if positions else None
        self.token_type = nn.Embedding(type_vocab_size, d_model)
        # LLM-style families (Llama, Qwen, Gemma, EuroBERT) have no norm after the lookup.
        self.norm = nn.LayerNorm(d_model, eps=eps, bias=norm_bias) if normed else nn.Identity()
        self.scale = scale
        # Task adapters of the word embeddings: A (k + 1, vocab, r), B (k + 1, r, d), slot 0
        # zero (the base model), LoRA's α/r folded into B.
        self.word_lora = (
            nn.ParameterDict(
                {
                    "a": torch.zeros(lora_tasks + 1, vocab_size, lora_rank),
                    "b": torch.zeros(lora_tasks + 1, lora_rank, d_model),
                }
            )
            if lora_tasks
            else None
        )
        self.eval()

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table covers (the bound, without one)."""
        return self.max_positions - self.position_offset

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor, task: Tensor | None = None
    ) -> Tensor:
        """input_ids, token_type_ids (B, T) int64 (and with task adapters each row's
        ``task`` (B,)) -> (B, T, d_model)."""
        x = self.word(input_ids)
        if self.word_lora is not None and task is not None:
            a, b = self.word_lora["a"], self.word_lora["b"]
            rows = a.reshape(-1, a.shape[-1])  # ((k + 1) · vocab, r)
            low = rows[task[:, None] * a.shape[1] + input_ids]  # (B, T, r): A_t[id]
            x = x + low @ b[task]  # (B, T, d_model)
        if self.scale is not None:  # Gemma's scaled lookup, before anything is added
            x = x * self.scale
        if self.position is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
            x = x + self.position(positions + self.position_offset)[None]
        x = x + self.token_type(token_type_ids)
        out: Tensor = self.norm(x)  # (B, T, d_model)
        return out
