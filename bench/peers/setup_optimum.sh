#!/usr/bin/env bash
# optimum (ONNX exporter) and sentence-transformers in one venv with CPU torch:
# the standard export of the same weights, the text path's in-process reference,
# and sentence-transformers on its ONNX backend (backend="onnx": onnxruntime on the
# graph optimum exports, which is why it lives here and not in our venv, whose
# transformers 5 optimum-onnx 0.1.0 does not take: it needs < 4.58). Versions as
# measured.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
py=$(make_venv optimum)
install_cpu_torch "$py"
"$py" -m pip install -q "torch==2.13.0" "optimum[onnxruntime]==2.1.0" "optimum-onnx[onnxruntime]==0.1.0" \
    "sentence-transformers[onnx]==5.7.0" "transformers==4.57.6" onnx
"$py" -c "import optimum.onnxruntime, sentence_transformers, onnxruntime; print('optimum ok')"
