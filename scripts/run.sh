#!/usr/bin/env bash
# Sets up .venv with the app and starts it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "${TRAMONTANE_TORCH:-torch}"
.venv/bin/python -m pip install -q -e .
exec .venv/bin/tramontane "$@"
