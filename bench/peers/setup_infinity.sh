#!/usr/bin/env bash
# infinity-emb on its ONNX (optimum) engine, in its own venv with CPU torch.
#
# Pinned so that its graph optimisation step runs (infinity_emb/transformer/
# utils_optimum.py: ORTOptimizer with OptimizationConfig(optimization_level=99,
# optimize_with_onnxruntime_only=False)); unpinned, pip takes optimum 2.x +
# optimum-onnx, whose OptimizationConfig has no optimize_with_onnxruntime_only, the
# step fails and infinity serves the unoptimised export. optimum 1.27 imports
# torch.onnx.symbolic_opset14._attention_scale, which torch 2.13 no longer has, so
# 1.26.1 is the newest that imports here; with optimum 1.x infinity also imports
# optimum.bettertransformer, which raises at import from transformers 4.49 on.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
py=$(make_venv infinity)
install_cpu_torch "$py"
"$py" -m pip uninstall -q -y optimum-onnx >&2 2>/dev/null || true  # left by an unpinned venv
"$py" -m pip install -q "torch==2.13.0" "infinity-emb[server,optimum]==0.0.78" \
    "optimum[onnxruntime]==1.26.1" "transformers==4.48.3" "numpy<2"
"$py" - <<'PY'
import infinity_emb
from optimum.onnxruntime import ORTOptimizer  # noqa: F401  (what infinity imports)
from optimum.onnxruntime.configuration import OptimizationConfig

# The exact call infinity-emb 0.0.78 makes on CPU: it must not raise.
OptimizationConfig(optimization_level=99, optimize_with_onnxruntime_only=False,
                   optimize_for_gpu=False, fp16=False)
print("infinity ok", infinity_emb.__version__, "(its optimisation step can run)")
PY
