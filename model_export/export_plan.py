"""The steps of an export, in order, each with its expected share of the time.

``export_model`` plans them (``model_export.progress``) before it starts, so its
progress can say how far it is from the first step on, and how long is left after it.
"""

from __future__ import annotations

from model_export import graph_io
from model_export.progress import Step
from model_export.validate import PYTORCH_OUTPUTS, TEXT_PATH

SHARE_WEIGHTS = ("write", graph_io.WEIGHTS_FILE)
RANGES = ("calibrate", "int8 ranges")

# Expected time of each step relative to the others: CPU seconds measured on minilm-l6
# over 7 (docs/benchmarks.md, "What an export costs"). The graphs of attention maps cost
# most to export; the first export also pays the exporter's set-up.
EXPORT_SHARES = {
    graph_io.GRAPH_EMBEDDINGS: 1.1,
    graph_io.GRAPH_HIDDEN_STATES: 0.9,
    graph_io.GRAPH_ATTENTION: 1.05,
    graph_io.GRAPH_COMPACT_ATTENTION: 2.1,
    graph_io.GRAPH_SELECTED_ATTENTION: 1.5,
    graph_io.GRAPH_TOKEN_EMBEDDINGS: 0.2,
    graph_io.GRAPH_SPARSE: 0.95,
}  # a head's graph: 1 (the encoder and its head)
OPTIMIZE_SHARE = 0.08
WEIGHTS_SHARE = 0.06
VALIDATE_SHARES = {PYTORCH_OUTPUTS: 0.25}  # each graph's check: 0.05
RANGES_SHARE = 2.2


def export_plan(
    encoder_graphs: list[str],
    text_graphs: list[str],
    head_graph: str | None,
    *,
    optimize: bool,
    ranges: bool,
    late_interaction: bool = False,
) -> list[Step]:
    """The steps of an export of these graphs, in the order ``export_model`` runs them
    (the multi-vector graph, with ``late_interaction``, after a head's)."""
    heads = [head_graph] if head_graph is not None else []
    heads += [graph_io.GRAPH_MULTI_VECTOR] if late_interaction else []
    steps = [Step("export", g, EXPORT_SHARES.get(g, 1.0)) for g in encoder_graphs]
    steps += [Step("optimize", g, OPTIMIZE_SHARE) for g in encoder_graphs if optimize]
    steps += [Step("export", g, EXPORT_SHARES.get(g, 1.0)) for g in (*text_graphs, *heads)]
    steps.append(Step(*SHARE_WEIGHTS, WEIGHTS_SHARE))
    validated = [PYTORCH_OUTPUTS, *encoder_graphs]
    if text_graphs:
        validated += [graph_io.GRAPH_TOKEN_EMBEDDINGS, TEXT_PATH, *text_graphs[1:]]
    steps += [Step("validate", g, VALIDATE_SHARES.get(g, 0.05)) for g in (*validated, *heads)]
    if ranges:
        steps.append(Step(*RANGES, RANGES_SHARE))
    return steps
