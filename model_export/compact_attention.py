"""Compact attention computed inside the graph: each layer's top-k keys and per-head
summaries, taken as soon as that layer's weights exist.

The full-map graph stacks every layer's weights into one [B, L, H, T, T] output
(151 MB for one 512-token sequence through a 12 × 12 base model). This graph keeps
only what most users look at: per query row the k largest weights and their key
indices, and the row statistics of ``graph_io.SUMMARIES``. Each layer's [B, H, T, T]
weights are dropped once its top-k and statistics are taken, so onnxruntime frees
them before the next layer: a run's attention memory is one layer's maps, not L.

k is the length of the ``attention_top_k`` input, so a run asks for its own k
without a graph per k (the service feeds ``max`` of its sequences' k and each
sequence keeps its first k: the rows are sorted, largest first).

``SelectedAttentionGraph`` answers full maps of some layers and heads, in float32 or
float16: each layer's maps are cut to the asked heads (or to none) and cast as soon
as they exist, so the maps of layers nobody asked for, and the float32 maps of a
float16 answer, are freed before the next layer instead of being stacked.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model_export.graph_io import LAYER_FLOAT16, LAYER_FLOAT32
from model_export.model import Encoder

# The smallest weight whose logarithm the entropy takes: 0 · ln(tiny) is exactly 0, as
# 0 ln 0 is by convention, and no weight a softmax gives a real key is this small.
TINY = 1e-30


def row_summaries(weights: Tensor) -> Tensor:
    """(B, h, T, T) weights -> (B, h, T, 6): ``graph_io.SUMMARIES`` of each query row,
    in that order (entropy, first, self, previous, next, distance).

    The key neighbours are gathered (no T × T masks multiplied); keys past a sequence's
    end are padding with weight exactly 0, so ``next`` of its last token is 0 there
    and at the batch's last column by the explicit mask."""
    b, h, t, _ = weights.shape
    entropy = -(weights * torch.log(weights.clamp(min=TINY))).sum(dim=-1)  # (B, h, T)
    first = weights[..., 0]  # (B, h, T)
    rows = torch.arange(t, device=weights.device)  # (T,)

    def at(offset: int) -> Tensor:
        keys = (rows + offset).clamp(min=0, max=t - 1)  # (T,)
        valid = ((rows + offset >= 0) & (rows + offset < t)).to(weights.dtype)  # (T,)
        index = keys[None, None, :, None].expand(b, h, t, 1)  # (B, h, T, 1)
        return weights.gather(-1, index)[..., 0] * valid  # (B, h, T)

    distance = (rows[None, :] - rows[:, None]).abs().to(weights.dtype)  # (T, T): |i - j|
    mean_distance = (weights * distance).sum(dim=-1)  # (B, h, T)
    return torch.stack((entropy, first, at(0), at(-1), at(1), mean_distance), dim=-1)


class CompactAttentionGraph(nn.Module):
    """inputs_embeds, attention_mask, attention_top_k [k] -> last_hidden_state, top-k
    weights (B, L, h, T, k) and their key indices (int32), and row summaries
    (B, L, h, T, 6); every output 0 at padded query rows."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, inputs_embeds: Tensor, attention_mask: Tensor, attention_top_k: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        encoder = self.encoder
        k = attention_top_k.shape[0]
        biases = encoder.layer_biases(attention_mask)
        rotations = encoder.layer_rotations(attention_mask.shape[1])
        relative = encoder.relative(attention_mask.shape[1])
        x = inputs_embeds
        top_weights, top_indices, summaries = [], [], []
        for layer, bias, rotation in zip(encoder.layers, biases, rotations, strict=True):
            x, weights, _ = layer(x, bias, rotation, relative=relative)  # (B, h, T, T)
            values, indices = torch.topk(weights, k, dim=-1)  # (B, h, T, k), largest first
            top_weights.append(values)
            top_indices.append(indices.to(torch.int32))
            summaries.append(row_summaries(weights))
        if encoder.final_norm is not None:
            x = encoder.final_norm(x)
        token = attention_mask.bool()  # (B, T)
        hidden = torch.where(token[:, :, None], x, torch.zeros_like(x))  # (B, T, d_model)
        row = token[:, None, None, :, None]  # (B, 1, 1, T, 1): a real query row
        weights_out = torch.stack(top_weights, dim=1)  # (B, L, h, T, k)
        indices_out = torch.stack(top_indices, dim=1)  # (B, L, h, T, k)
        summaries_out = torch.stack(summaries, dim=1)  # (B, L, h, T, 6)
        return (
            hidden,
            torch.where(row, weights_out, torch.zeros_like(weights_out)),
            torch.where(row, indices_out, torch.zeros_like(indices_out)),
            torch.where(row, summaries_out, torch.zeros_like(summaries_out)),
        )


class SelectedAttentionGraph(nn.Module):
    """inputs_embeds, attention_mask, attention_layers [L] (each graph_io.LAYER_*), attention_heads
    [h'] (head indices) -> last_hidden_state, selected_attentions (B, l32, h', T, T)
    float32 and selected_attentions_fp16 (B, l16, h', T, T): the maps of the layers
    marked for each, in layer order, their heads in ``attention_heads``' order, 0 at
    padded query rows.

    A layer's heads are picked with a boolean index of ``attention_heads`` (all or
    none), which both exporters write as NonZero + Gather: the outputs' layer axis is
    data-dependent without a graph per selection."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self,
        inputs_embeds: Tensor,
        attention_mask: Tensor,
        attention_layers: Tensor,
        attention_heads: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        encoder = self.encoder
        biases = encoder.layer_biases(attention_mask)
        rotations = encoder.layer_rotations(attention_mask.shape[1])
        relative = encoder.relative(attention_mask.shape[1])
        row = attention_mask[:, None, :, None].to(inputs_embeds.dtype)  # (B, 1, T, 1)
        n_heads = attention_heads.shape[0]
        x = inputs_embeds
        single: list[Tensor] = []
        half: list[Tensor] = []
        for index, (layer, bias, rotation) in enumerate(
            zip(encoder.layers, biases, rotations, strict=True)
        ):
            x, weights, _ = layer(x, bias, rotation, relative=relative)  # (B, h, T, T)
            mode = attention_layers[index].expand(n_heads)  # (h',)
            for kept, wanted in ((single, LAYER_FLOAT32), (half, LAYER_FLOAT16)):
                heads = attention_heads[mode == wanted]  # (h',) or (0,)
                maps = weights.index_select(1, heads) * row  # (B, h' or 0, T, T)
                kept.append(maps if wanted == LAYER_FLOAT32 else maps.to(torch.float16))
        if encoder.final_norm is not None:
            x = encoder.final_norm(x)
        token = attention_mask.bool()[:, :, None]  # (B, T, 1)
        hidden = torch.where(token, x, torch.zeros_like(x))  # (B, T, d_model)
        b, t = attention_mask.shape
        return (
            hidden,
            torch.cat(single, dim=1).reshape(b, -1, n_heads, t, t),
            torch.cat(half, dim=1).reshape(b, -1, n_heads, t, t),
        )
