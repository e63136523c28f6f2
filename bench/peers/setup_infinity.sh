#!/usr/bin/env bash
# infinity-emb on its ONNX (optimum) engine, in its own venv with CPU torch.
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
py=$(make_venv infinity)
install_cpu_torch "$py"
"$py" -m pip install -q "torch==2.13.0" "infinity-emb[server,optimum]==0.0.78"
"$py" -c "import infinity_emb; print('infinity ok', infinity_emb.__version__)"
