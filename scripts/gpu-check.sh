#!/usr/bin/env bash
# make gpu-check: run the agent on this machine's NVIDIA GPUs under a PyTorch load (see scripts/gpu_check.py).
# Needs no network: it uses the project's virtualenv when there is one, else this machine's python3
# (where torch and nvidia-ml-py may already be installed) with the package from agent/src, and the
# remaining dependencies from wheels/ (made beforehand by `make gpu-wheels` on a machine with network).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
export PYTHONPATH="$PWD/agent/src${PYTHONPATH:+:$PYTHONPATH}"
deps="import pynvml, tenacity, docker"
if ! "$PY" -c "$deps" 2>/dev/null; then
  if [ ! -d wheels ]; then
    echo "gpu-check: this Python lacks gpulse's dependencies and there is no wheels/ folder; run 'make gpu-wheels' where there is network and bring wheels/ along" >&2
    exit 1
  fi
  venv="${TMPDIR:-/tmp}/gpulse-gpu-check-venv"
  # system site packages: a torch already on this machine stays visible
  [ -x "$venv/bin/python" ] || "$PY" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-index --find-links wheels nvidia-ml-py tenacity docker
  PY="$venv/bin/python"
fi
exec "$PY" scripts/gpu_check.py "$@"
