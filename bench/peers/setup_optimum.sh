#!/usr/bin/env bash
# optimum (ONNX exporter) and sentence-transformers in one venv with CPU torch:
# the standard export of the same weights, and the text path's in-process reference.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
py=$(make_venv optimum)
install_cpu_torch "$py"
"$py" -m pip install -q "torch==2.13.0" "optimum[onnxruntime]" sentence-transformers onnx
"$py" -c "import optimum, sentence_transformers, onnxruntime; print('optimum ok')"
