#!/usr/bin/env bash
# Every GPU check in one run (< 5 minutes), for a machine with an NVIDIA GPU:
#   tools/gpu_check.sh [WHEEL]
# Installs the kt-kernel wheel (default: dist/kt_kernel-*.whl) into a venv that
# sees the machine's CUDA torch, then runs tests/gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="${1:-$(ls dist/kt_kernel-*.whl | head -1)}"
python3 -m venv --system-site-packages /tmp/kt-gpu-venv
/tmp/kt-gpu-venv/bin/python -m pip install -q --no-deps --force-reinstall "$wheel"
/tmp/kt-gpu-venv/bin/python -m pip install -q pytest numpy 2>/dev/null || true
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv || true
cd /tmp && timeout 280 /tmp/kt-gpu-venv/bin/python -m pytest -p no:cacheprovider -m gpu -v "$OLDPWD/tests/gpu"
