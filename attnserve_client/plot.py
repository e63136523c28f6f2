"""``plot_attention``: a heatmap of one attention map (needs the ``plot`` extra: matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnserve_client._types import EncodeResult


def plot_attention(
    result: EncodeResult,
    index: int = 0,
    layer: int = -1,
    head: int | None = None,
    tokens: Sequence[str] | None = None,
    path: str | Path | None = None,
) -> Any:
    """Draw sequence ``index``'s attention at ``layer`` (one ``head``, or the mean of all).

    Token labels go on both axes (queries down, keys across); for text inputs
    the result's own tokens are used. Saves a PNG when ``path`` is given and
    returns the matplotlib Figure.

    Example::

        result = client.encode(["The cat sat."], return_attention=True)
        plot_attention(result, layer=-1, path="attention.png")
    """
    try:
        # The object-oriented API, not pyplot: no global backend switch, no figure registry
        # (a notebook's inline display keeps working, and figures are not leaked).
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise ImportError("plot_attention needs matplotlib: pip install 'attnserve[plot]'") from exc
    if result.attention is None:
        raise ValueError("the result holds no attention: encode with return_attention=True")
    maps = result.attention[index]  # (L', H', n, n)
    layer_maps = maps[layer]  # (H', n, n)
    grid = layer_maps.mean(axis=0) if head is None else layer_maps[head]  # (n, n)
    labels = list(tokens) if tokens is not None else result.tokens[index]
    n = grid.shape[0]
    if labels is not None and len(labels) != n:
        raise ValueError(f"{len(labels)} token labels for a {n}x{n} attention map")
    size = max(4.0, min(16.0, 0.35 * n + 2))
    fig = Figure(figsize=(size, size * 0.9))
    ax = fig.subplots()
    image = ax.imshow(np.asarray(grid), cmap="viridis", vmin=0.0, aspect="equal")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    if labels is not None:
        ax.set_xticks(range(n), labels, rotation=90)
        ax.set_yticks(range(n), labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    which = "mean over heads" if head is None else f"head {head}"
    ax.set_title(f"{result.model}: sequence {index}, layer {layer}, {which}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
