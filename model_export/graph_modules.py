"""The PyTorch modules exported as a model directory's graphs, and their example inputs.

Each wraps the one ``Encoder`` (and its ``TokenEmbeddings``) and returns the outputs
its graph declares in ``graph_io``; ``model_export.export`` exports and validates them.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from model_export import graph_io
from model_export.compact_attention import CompactAttentionGraph, SelectedAttentionGraph
from model_export.model import Encoder, EncoderBlock, TokenEmbeddings
from model_export.validate import selection_feeds


class EmbeddingsGraph(nn.Module):
    """The fast path: only last_hidden_state is an output, so no weights are stacked."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, inputs_embeds: Tensor, attention_mask: Tensor, task: Tensor | None = None
    ) -> Tensor:
        hidden: Tensor = self.encoder(
            inputs_embeds, attention_mask, weights=False, task=task
        ).hidden
        return hidden


class HiddenStatesGraph(nn.Module):
    """Every layer's output besides the last: no attention weights are stacked."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, inputs_embeds: Tensor, attention_mask: Tensor, task: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        out = self.encoder(
            inputs_embeds, attention_mask, weights=False, hidden_states=True, task=task
        )
        assert out.hidden_states is not None
        return out.hidden, out.hidden_states


class AttentionGraph(nn.Module):
    """Everything: attention weights, hidden states and the value norms that turn weights
    into norms (a request for any of them runs once)."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, inputs_embeds: Tensor, attention_mask: Tensor, task: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        hidden, attn, states, norms = self.encoder(
            inputs_embeds, attention_mask, hidden_states=True, value_norms=True, task=task
        )
        assert attn is not None and states is not None and norms is not None
        return hidden, attn, states, norms


class SparseGraph(nn.Module):
    """Token ids to the last layer's [CLS] attention row, averaged over heads and zero at
    padding [B, T]: what BM42 weighs words by. Only that row of the last layer is
    computed (its [CLS] query against every key), nothing after it."""

    def __init__(self, embeddings: TokenEmbeddings, encoder: Encoder) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.encoder = encoder

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        biases = self.encoder.layer_biases(attention_mask)  # each (B, 1 or h, 1 or T, T)
        rotations = self.encoder.layer_rotations(input_ids.shape[1])
        relative = self.encoder.relative(input_ids.shape[1])
        x = self.embeddings(input_ids, token_type_ids)
        for layer, bias, rotation in zip(self.encoder.layers[:-1], biases, rotations, strict=False):
            x, _, _ = layer(x, bias, rotation, relative=relative)
        last = cast(EncoderBlock, self.encoder.layers[-1])
        if last.pre_norm:
            x = last.attn_norm(x)
        attention, bias, rotation = last.attn, biases[-1], rotations[-1]
        first = None if rotation is None else (rotation[0][:1], rotation[1][:1])
        query = attention.queries(x[:, :1], first)  # (B, h, 1, d_k)
        keys = attention.keys(x, rotation)  # (B, h, T, d_k)
        first_row = None if relative is None else (relative[0], relative[1][:1])  # DeBERTa's
        scores = attention.scores(query, keys, first_row)  # (B, h, 1, T)
        weights = torch.softmax(scores + bias[:, :, :1], dim=-1)
        cls: Tensor = weights[:, :, 0].mean(dim=1) * attention_mask  # (B, T)
        return cls


HEAD_GRAPH = {"classify": graph_io.GRAPH_SCORES, "splade": graph_io.GRAPH_SPLADE}

GRAPH_MODULES = {
    graph_io.GRAPH_EMBEDDINGS: EmbeddingsGraph,
    graph_io.GRAPH_HIDDEN_STATES: HiddenStatesGraph,
    graph_io.GRAPH_ATTENTION: AttentionGraph,
    graph_io.GRAPH_COMPACT_ATTENTION: CompactAttentionGraph,
    graph_io.GRAPH_SELECTED_ATTENTION: SelectedAttentionGraph,
}


def task_example(tasks: int, batch: int = 2) -> tuple[Tensor, ...]:
    """An example task input (B,) for a model of ``tasks`` adapters (none without): the
    rows name different tasks, the last one first."""
    if not tasks:
        return ()
    return (torch.arange(tasks, tasks - batch, -1, dtype=torch.int64).clamp(min=0),)


def extra_inputs(graph: str, n_layers: int, n_heads: int) -> tuple[Tensor, ...]:
    """Example values of ``graph``'s inputs beyond the embeddings and mask."""
    if graph == graph_io.GRAPH_COMPACT_ATTENTION:
        return (torch.zeros(3, dtype=torch.int64),)  # k = 3 of 8 keys: a dynamic axis
    if graph == graph_io.GRAPH_SELECTED_ATTENTION:  # every head: > 1, a dynamic axis
        feeds = selection_feeds(n_layers, n_heads, case=0)
        return tuple(torch.from_numpy(feeds[name]) for name in graph_io.GRAPH_INPUTS[graph][2:])
    return ()
