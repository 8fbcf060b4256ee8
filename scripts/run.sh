#!/usr/bin/env bash
# Sets up .venv with the app once, then starts it. Later runs start at once, without the
# network: the install is redone only when what it is made from changed (pyproject.toml,
# setup.py, the CPU kernels' sources), as recorded in .venv/.tramontane-install.
#   TRAMONTANE_TORCH        the torch requirement to install (default: torch)
#   TRAMONTANE_TORCH_INDEX  the index torch comes from, e.g. PyTorch's CPU wheel index (see README)
#   TRAMONTANE_REINSTALL=1  install again even when nothing changed
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.tramontane-install

install_key() {
    # What an install is made from; another key means the installed copy is stale.
    cat pyproject.toml setup.py $(find kernels/cpu kernels/image -type f | LC_ALL=C sort) 2>/dev/null | "$PY" -c \
        "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
}

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv || {
        echo "run.sh: cannot create .venv: install Python's venv module (Debian/Ubuntu: sudo apt install python3-venv)" >&2
        exit 1
    }
fi
key=$(install_key)
if [ "${TRAMONTANE_REINSTALL:-0}" = 1 ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$key" ]; then
    echo "run.sh: installing Tramontane into .venv (once; needs the network)…" >&2
    .venv/bin/python -m pip install -q --upgrade pip
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
        .venv/bin/python -m pip install -q ${TRAMONTANE_TORCH_INDEX:+--index-url "$TRAMONTANE_TORCH_INDEX"} \
            "${TRAMONTANE_TORCH:-torch}"
    fi
    .venv/bin/python -m pip install -q -e .
    echo "$key" > "$STAMP"
fi
exec .venv/bin/tramontane "$@"
