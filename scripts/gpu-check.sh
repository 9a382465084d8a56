#!/usr/bin/env bash
# make gpu-check: prove gpulse on this machine's NVIDIA GPUs under a CUDA torch load (scripts/gpu_check.py).
# Needs no network. The Python is the first of $PY, python3, /usr/bin/python3, .venv/bin/python that
# has a CUDA build of torch (the project's .venv usually has the CPU build); gpulse comes from
# agent/src, and its dependencies from that Python or, when missing, from wheels/ (made beforehand by
# `make gpu-wheels` where there is network) in a throw-away venv that still sees the system's torch.
# How to run it offline: scripts/GPU-CHECK.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/agent/src${PYTHONPATH:+:$PYTHONPATH}"
cuda_torch='import torch, sys; sys.exit(0 if torch.version.cuda else 1)'
PICK=""
for cand in "${PY:-}" "$(command -v python3 || true)" /usr/bin/python3 .venv/bin/python; do
  if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c "$cuda_torch" 2>/dev/null; then PICK="$cand"; break; fi
done
# No CUDA torch anywhere: still run the check (with a Python that has the dependencies) so that it
# says in one sentence what is missing: the driver, or a CUDA torch.
if [ -z "$PICK" ]; then
  for cand in "${PY:-}" .venv/bin/python "$(command -v python3 || true)"; do
    if [ -n "$cand" ] && [ -x "$cand" ]; then PICK="$cand"; break; fi
  done
fi
deps="import pynvml, tenacity, docker"
if ! "$PICK" -c "$deps" 2>/dev/null; then
  if [ ! -d wheels ]; then
    echo "gpu-check: $PICK lacks gpulse's dependencies and there is no wheels/ folder; run 'make gpu-wheels' where there is network and bring wheels/ along (scripts/GPU-CHECK.md)" >&2
    exit 1
  fi
  venv="${TMPDIR:-/tmp}/gpulse-gpu-check-venv"
  # system site packages: the machine's CUDA torch stays visible
  [ -x "$venv/bin/python" ] || "$PICK" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-index --find-links wheels nvidia-ml-py tenacity docker tomli
  PICK="$venv/bin/python"
fi
exec "$PICK" scripts/gpu_check.py "$@"
