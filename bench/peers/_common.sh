# Shared by the setup_*.sh scripts: a fresh venv under bench/peers/.venvs/<name>.
# Sourced, not run. Every venv that needs torch installs torch==2.13.0 first: pip
# then takes the CPU wheel on disk instead of an unpinned CUDA build of several GB.
set -euo pipefail
PEERS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

make_venv() {  # make_venv NAME -> prints the venv's python
    local venv="$PEERS_DIR/.venvs/$1"
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    echo "$venv/bin/python"
}

install_cpu_torch() {  # install_cpu_torch PYTHON: before anything that depends on torch
    "$1" -m pip install -q "torch==2.13.0" --find-links /opt/wheels
}
