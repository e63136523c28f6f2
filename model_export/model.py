"""A multi-head self-attention encoder written from the math.

Per layer (post-LN, as in BERT)::

    A = softmax(Q Kᵀ / √d_k + P + M) V    per head, d_k = d_model / h
    x = LayerNorm(x + W_o concat(A_1..A_h))
    x = LayerNorm(x + W_2 act(W_1 x))

P is MPNet's relative position bias (``relative_buckets`` set, else 0): per head a
learned scalar for the bucket of the offset j - i, the same in every layer.

M is 0 where a query may see a key and -10000 elsewhere. The allowed set is the
intersection of key padding, the optional causal mask and the optional local
window of radius r. exp(-10000) is exactly 0 in float32, so forbidden keys get
exactly zero weight, and a finite M means no row can turn into NaN, padded
query rows included; those rows (and padded embeddings) are then set to
exactly 0. Without a causal mask or window, M is written as BERT writes it,
``(1 - mask) · -10000``, which onnxruntime's optimizer recognises and fuses into
one ``Attention`` kernel per layer.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model_export.config import EncoderConfig


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


class MultiHeadSelfAttention(nn.Module):
    """h heads of scaled dot-product (or additive) attention, then W_o."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.scoring = config.scoring
        d = config.d_model
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        self.dropout = nn.Dropout(config.dropout)
        if config.scoring == "additive":
            # Bahdanau et al.: score(q, k) = vᵀ tanh(W_q q + W_k k), one set per head.
            hd = self.head_dim
            self.add_wq = nn.Parameter(torch.empty(config.n_heads, hd, hd))
            self.add_wk = nn.Parameter(torch.empty(config.n_heads, hd, hd))
            self.add_v = nn.Parameter(torch.empty(config.n_heads, hd))

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_k)

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Unnormalised scores (B, h, T, T) before the mask."""
        if self.scoring == "dot":
            return (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, h, T, T)
        wq = torch.einsum("bhtd,hde->bhte", q, self.add_wq)  # (B, h, T, d_k)
        wk = torch.einsum("bhtd,hde->bhte", k, self.add_wk)  # (B, h, T, d_k)
        hidden = torch.tanh(wq[:, :, :, None, :] + wk[:, :, None, :, :])  # (B, h, T, T, d_k)
        return torch.einsum("bhije,he->bhij", hidden, self.add_v)  # (B, h, T, T)

    def forward(
        self, x: Tensor, bias: Tensor, *, need_norms: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """x (B, T, d), additive mask ``bias`` -> output (B, T, d), weights (B, h, T, T),
        and with ``need_norms`` each head's transformed value norms (B, h, T)."""
        b, t, d = x.shape
        q = self._split_heads(self.q_proj(x))  # (B, h, T, d_k)
        k = self._split_heads(self.k_proj(x))  # (B, h, T, d_k)
        v = self._split_heads(self.v_proj(x))  # (B, h, T, d_k)
        scores = self.scores(q, k) + bias  # (B, h, T, T)
        weights = torch.softmax(scores, dim=-1)  # (B, h, T, T); masked keys exactly 0
        context = self.dropout(weights) @ v  # (B, h, T, d_k)
        context = context.transpose(1, 2).reshape(b, t, d)  # (B, T, d_model)
        norms = self.value_norms(v) if need_norms else None
        return self.out_proj(context), weights, norms

    def value_norms(self, v: Tensor) -> Tensor:
        """‖f_h(x_j)‖ with f_h(x) = (x W_V^h + b_V^h) W_O^h, head h's slice of the output
        projection, its bias excluded (Kobayashi et al., 2020): (B, h, T, d_k) -> (B, h, T).
        ``α_ij ‖f_h(x_j)‖`` is then how much token j moves token i through head h."""
        d = self.out_proj.weight.shape[0]
        # W_Oᵀ (d_model, d) -> (h, d_k, d): head h's rows, as a matmul (no einsum: the
        # exported MatMul keeps onnxruntime's shape inference and fusions working). Taken
        # from the transpose the projection itself multiplies by, so the exported graph
        # holds those bytes once (model_export.weights_file shares equal bytes).
        per_head = self.out_proj.weight.t().reshape(self.n_heads, self.head_dim, d)
        transformed = v @ per_head  # (B, h, T, d)
        # sqrt(sum(x²)), not vector_norm: its ReduceL2 export has no shape for onnxruntime's
        # symbolic shape inference, which then skips the attention graph's fusions.
        norms: Tensor = transformed.square().sum(dim=-1).sqrt()
        return norms


class FeedForward(nn.Module):
    """Position-wise W_2 act(W_1 x)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.d_ff)
        self.down = nn.Linear(config.d_ff, config.d_model)
        self.activation = config.activation
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.relu(h)
        out: Tensor = self.dropout(self.down(h))
        return out


class EncoderBlock(nn.Module):
    """Attention and feed-forward sub-layers, each with residual + LayerNorm."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.attn = MultiHeadSelfAttention(config)
        self.attn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, bias: Tensor, *, need_norms: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        if self.pre_norm:
            attn_out, weights, norms = self.attn(self.attn_norm(x), bias, need_norms=need_norms)
            x = x + self.dropout(attn_out)
            x = x + self.ffn(self.ffn_norm(x))
        else:
            attn_out, weights, norms = self.attn(x, bias, need_norms=need_norms)
            x = self.attn_norm(x + self.dropout(attn_out))
            x = self.ffn_norm(x + self.ffn(x))
        return x, weights, norms


class Encoder(nn.Module):
    """A stack of ``n_layers`` encoder blocks over token embeddings.

    ``forward(inputs_embeds, attention_mask)`` returns the contextualized
    embeddings (B, T, d_model) and the attention weights (B, L, h, T, T);
    both are exactly 0 at padded positions.
    """

    def __init__(self, config: EncoderConfig, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(EncoderBlock(config) for _ in range(config.n_layers))
        self.relative_bias = (
            RelativePositionBias(config) if config.relative_buckets is not None else None
        )
        # Pre-LN stacks need a final norm; post-LN blocks already end in one.
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.norm_placement == "pre"
            else None
        )
        self.reset_parameters(seed)
        self.eval()

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """BERT-style init (N(0, 0.02) weights, zero biases) from ``seed`` alone."""
        generator = torch.Generator().manual_seed(seed)
        for name, param in sorted(self.named_parameters()):
            if "norm" in name:
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)

    def forward(
        self, inputs_embeds: Tensor, attention_mask: Tensor, *, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        hidden, attn, _ = self.forward_all(inputs_embeds, attention_mask, need_weights=need_weights)
        return hidden, attn

    def forward_all(
        self,
        inputs_embeds: Tensor,
        attention_mask: Tensor,
        *,
        need_weights: bool = True,
        need_hidden_states: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(hidden, attention weights, hidden states); the last two only when asked."""
        hidden, attn, states, _ = self.forward_with_norms(
            inputs_embeds,
            attention_mask,
            need_weights=need_weights,
            need_hidden_states=need_hidden_states,
        )
        return hidden, attn, states

    def forward_with_norms(
        self,
        inputs_embeds: Tensor,
        attention_mask: Tensor,
        *,
        need_weights: bool = True,
        need_hidden_states: bool = False,
        need_value_norms: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """(hidden, attention weights, hidden states, value norms); the last three only
        when asked. Value norms are (B, L, h, T): ``MultiHeadSelfAttention.value_norms``.

        Hidden states are transformers' ``output_hidden_states``: the input embeddings,
        then each layer's output, (B, L + 1, T, d_model); the last equals ``hidden``
        (after the final norm, for pre-LN). All are exactly 0 at padded positions.
        """
        bias = self.attention_bias(attention_mask)
        token = attention_mask.bool()  # (B, T)
        x = inputs_embeds
        per_layer: list[Tensor] = []
        per_layer_norms: list[Tensor] = []
        states: list[Tensor] = [x]
        for layer in self.layers:
            x, weights, layer_norms = layer(x, bias, need_norms=need_value_norms)
            per_layer.append(weights)
            if layer_norms is not None:
                per_layer_norms.append(layer_norms)
            states.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            states[-1] = x
        hidden = torch.where(token[:, :, None], x, torch.zeros_like(x))  # (B, T, d_model)
        attn = None
        if need_weights:
            attn = torch.stack(per_layer, dim=1)  # (B, L, h, T, T)
            attn = torch.where(token[:, None, None, :, None], attn, torch.zeros_like(attn))
        hidden_states = None
        if need_hidden_states:
            stacked = torch.stack(states, dim=1)  # (B, L + 1, T, d_model)
            hidden_states = torch.where(token[:, None, :, None], stacked, torch.zeros_like(stacked))
        value_norms = None
        if need_value_norms:
            norms = torch.stack(per_layer_norms, dim=1)  # (B, L, h, T)
            value_norms = torch.where(token[:, None, None, :], norms, torch.zeros_like(norms))
        return hidden, attn, hidden_states, value_norms

    def attention_bias(self, attention_mask: Tensor) -> Tensor:
        """P + M, added to every layer's scores: (B, 1, 1, T) or (B, 1, T, T) from the mask,
        (B, h, T, T) with the relative position bias. Where M is 0 the sum is P exactly,
        so allowed keys score as transformers' ``(scores + P) + M``."""
        cfg = self.config
        bias = mask_bias(attention_mask, causal=cfg.causal, window=cfg.window)
        if self.relative_bias is not None:
            bias = self.relative_bias(attention_mask.shape[1]) + bias  # (B, h, T, T)
        return bias

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
    its own small graph so the service can serve text without torch.
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
    ) -> None:
        super().__init__()
        # Token t sits at row t + position_offset of the position table (RoBERTa's rows
        # start after its padding id; BERT's at 0).
        self.position_offset = position_offset
        self.word = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_positions, d_model)
        self.token_type = nn.Embedding(type_vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.eval()

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table covers."""
        return self.position.num_embeddings - self.position_offset

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        """input_ids, token_type_ids (B, T) int64 -> (B, T, d_model)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        positions = positions + self.position_offset
        x = self.word(input_ids) + self.position(positions)[None] + self.token_type(token_type_ids)
        out: Tensor = self.norm(x)  # (B, T, d_model)
        return out
