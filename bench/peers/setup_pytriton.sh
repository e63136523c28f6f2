#!/usr/bin/env bash
# PyTriton (Triton core + dynamic batcher) in its own venv: it pins numpy < 2,
# which our own venv cannot share. No torch: the infer function runs onnxruntime.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
py=$(make_venv pytriton)
"$py" -m pip install -q "nvidia-pytriton==0.7.0" "numpy<2" onnxruntime "tritonclient[http]"
"$py" -c "import pytriton, onnxruntime, numpy; print('pytriton ok, numpy', numpy.__version__)"
