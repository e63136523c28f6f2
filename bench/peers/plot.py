"""The plot: each workload's contenders side by side, rendered from the results JSON."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.peers.common import Results
from bench.peers.limit import limit_of
from bench.peers.ratios import column, summary_contenders, workload_title
from bench.peers.workloads import WORKLOADS


def plot(results: Results, path: Path) -> None:
    """Grouped bars: each workload's contenders side by side, one colour per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if limit_of(results, w)[0]]
    contenders = summary_contenders(results)
    # tab20's dark shades first (even indices), so neighbouring contenders differ in hue.
    tab20 = plt.get_cmap("tab20")
    colours = {c: tab20((2 * i) % 20 + (2 * i) // 20) for i, c in enumerate(contenders)}
    fig, ax = plt.subplots(figsize=(12, 5.5))
    labelled: set[str] = set()
    for i, w in enumerate(workloads):
        present = []
        for c in contenders:
            if values := column(results, w, c)[0]:
                present.append((c, values))
        width = 0.8 / max(1, len(present))
        for j, (c, values) in enumerate(present):
            med = statistics.median(values)
            ax.bar(
                i + (j - (len(present) - 1) / 2) * width,
                med,
                width,
                color=colours[c],
                label=None if c in labelled else c,
                yerr=[[med - min(values)], [max(values) - med]],
                capsize=2,
            )
            labelled.add(c)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(workloads)))
    titles = [workload_title(w, results.max_seq).replace(" ", "\n", 2) for w in workloads]
    ax.set_xticklabels(titles, fontsize=8)
    ax.set_ylabel("throughput ÷ in-process onnxruntime (same round)")
    ax.set_title(f"{results.name}: peers against the in-process limit (median, min–max)")
    if contenders:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
