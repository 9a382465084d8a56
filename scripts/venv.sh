#!/usr/bin/env bash
# make venv: the virtualenv `make test` runs in, step by step, saying what it downloads.
#
# PyTorch comes first and from its CPU index (the CPU build, a 190 MB wheel), so that nothing pulls
# the CUDA build and its NVIDIA libraries (2.9 GB of wheels on Linux x86_64) just to run tests. Where that
# index cannot be reached (a machine that reaches only its own PyPI mirror), torch comes from the
# configured index instead, and the script says what that means there.
#   VENV=path          the virtualenv (default .venv)
#   GPULSE_TORCH_INDEX the CPU index (default https://download.pytorch.org/whl/cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
TORCH="torch==2.13.0"
CPU_INDEX=${GPULSE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
step() { printf '== make venv: %s\n' "$*"; }

if [ ! -x "$PY" ]; then
  step "creating the virtualenv $VENV (python3 -m venv)"
  python3 -m venv "$VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() { "$PY" -m pip install --progress-bar on "$@"; }

if "$PY" -c 'import sys, importlib.metadata as m; sys.exit(0 if m.version("torch").startswith("2.13.0") else 1)' 2>/dev/null; then
  step "PyTorch 2.13.0 is installed already"
elif "$PY" -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).read(1)' \
  "$CPU_INDEX" 2>/dev/null; then
  step "PyTorch 2.13.0, CPU build, from $CPU_INDEX (a 190 MB wheel; no CUDA libraries)"
  pip_install --index-url "$CPU_INDEX" "$TORCH"
else
  step "$CPU_INDEX cannot be reached: PyTorch 2.13.0 from the configured package index instead"
  if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
    step "(unless a CPU wheel is at hand, as on a mirror that has one, PyPI's Linux build brings the CUDA libraries: 2.9 GB)"
  fi
  pip_install "$TORCH"
fi
step "gpulse (editable) with the agent, test and training extras: nvidia-ml-py, docker, pytest, ruff, transformers, lightning, ... (about 80 MB)"
pip_install -e 'agent[agent,kubernetes,test,train]'
step "done: $("$PY" -c 'import torch; print("torch", torch.__version__)')"
