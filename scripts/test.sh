#!/usr/bin/env bash
# Sets up .venv (CPU torch unless one is already there) with the test extras and runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU wheel keeps a test machine from pulling a multi-GB CUDA build; a torch already in the venv is kept.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "${TRAMONTANE_TORCH:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[test]"
export QT_QPA_PLATFORM=${QT_QPA_PLATFORM:-offscreen}
exec .venv/bin/python -m pytest -q "$@"
