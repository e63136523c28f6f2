"""The steps of an export, in order, each with its expected share of the time.

``export_model`` plans them (``model_export.progress``) before it starts, so its
progress can say how far it is and how long is left from the first step on.
"""

from __future__ import annotations

from model_export import graph_io
from model_export.progress import Step
from model_export.validate import PYTORCH_OUTPUTS, TEXT_PATH

SHARE_WEIGHTS = ("write", graph_io.WEIGHTS_FILE)
RANGES = ("calibrate", "int8 ranges")

# Expected seconds of each step relative to one another (a graph's export = 1), from
# the steps' times measured on minilm-l6 (docs/benchmarks.md, "What an export costs").
EXPORT_SHARES = {graph_io.GRAPH_TOKEN_EMBEDDINGS: 0.3}
OPTIMIZE_SHARE = 0.3
VALIDATE_SHARE = 0.1
WEIGHTS_SHARE = 0.3
RANGES_SHARE = 1.0


def export_plan(
    encoder_graphs: list[str],
    text_graphs: list[str],
    head_graph: str | None,
    *,
    optimize: bool,
    ranges: bool,
) -> list[Step]:
    """The steps of an export of these graphs, in the order ``export_model`` runs them."""
    heads = [head_graph] if head_graph is not None else []
    steps = [Step("export", g, EXPORT_SHARES.get(g, 1.0)) for g in encoder_graphs]
    steps += [Step("optimize", g, OPTIMIZE_SHARE) for g in encoder_graphs if optimize]
    steps += [Step("export", g, EXPORT_SHARES.get(g, 1.0)) for g in (*text_graphs, *heads)]
    steps.append(Step(*SHARE_WEIGHTS, WEIGHTS_SHARE))
    validated = [PYTORCH_OUTPUTS, *encoder_graphs]
    if text_graphs:
        validated += [graph_io.GRAPH_TOKEN_EMBEDDINGS, TEXT_PATH, *text_graphs[1:]]
    steps += [Step("validate", g, VALIDATE_SHARE) for g in (*validated, *heads)]
    if ranges:
        steps.append(Step(*RANGES, RANGES_SHARE))
    return steps
