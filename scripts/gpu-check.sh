#!/usr/bin/env bash
# make gpu-check: run the agent on this machine's NVIDIA GPUs under a PyTorch load (see scripts/gpu_check.py).
# Works without the project's virtualenv too (e.g. a GPU box with only python, nvidia-ml-py and torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
exec "$PY" scripts/gpu_check.py "$@"
