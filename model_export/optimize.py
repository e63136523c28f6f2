"""onnxruntime's transformer optimizer, applied once at export time.

The exported graphs spell LayerNorm after a residual add and the Erf-based GELU
after a bias add as chains of small ops; onnxruntime's own session-time
optimisation leaves them so. Its transformer optimizer (BERT model type) fuses
them into its CPU contrib kernels ``SkipLayerNormalization`` and ``BiasGelu``,
and the result is saved, so no server re-derives it at start. The export then
validates the fused graphs against PyTorch exactly as it did the plain ones:
a fusion that changed a number beyond ``atol`` fails the export.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from model_export.config import EncoderConfig

log = logging.getLogger(__name__)

# The fusions attempted; each graph records those that applied, with their count.
FUSIONS = ("SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu", "Attention")


def optimize_graph(path: Path, config: EncoderConfig) -> dict[str, int]:
    """Fuse ``path`` in place; the fused operators that now stand in it, by count."""
    from onnxruntime.transformers.optimizer import optimize_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the optimizer warns about its own internals
        model = optimize_model(
            str(path),
            model_type="bert",
            num_heads=config.n_heads,
            hidden_size=config.d_model,
            opt_level=0,  # fusions only: onnxruntime still optimises at session start
        )
    fused = {
        op: count
        for op, count in model.get_fused_operator_statistics().items()
        if op in FUSIONS and count
    }
    model.save_model_to_file(str(path))
    log.info("%s: fused %s", path.name, fused or "nothing")
    return fused
