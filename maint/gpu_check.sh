#!/usr/bin/env bash
# Every GPU check in one run (< 5 minutes), for a machine with an NVIDIA GPU and no network:
#   maint/gpu_check.sh [DIST]
# Installs kt-kernel (DIST's release wheel, else build/kt-kernel/out's) and, when DIST holds a
# release, the five payload carriers and sglang-kernel-kt, offline with --no-deps, into a venv that
# sees the machine's CUDA torch; runs tests/gpu; then materializes the release's CUDA payload from
# the installed carriers and imports sgl_kernel on the GPU. Exits non-zero when there is no GPU,
# when any GPU test is skipped, or when any check fails - never 0 on a run that checked nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
dist="${1:-dist}"
command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: not a GPU machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
venv=/tmp/kt-gpu-venv
python3 -m venv --system-site-packages "$venv"
# A python3 that is itself a venv (torch installed into it, not into the base interpreter) lends the
# new venv nothing through --system-site-packages: its site-packages then join by a .pth file.
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  site() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
  python3 -c "import torch" 2>/dev/null || { echo "gpu_check: python3 cannot import torch" >&2; exit 2; }
  site python3 >"$(site "$venv/bin/python")/_gpu_check_host.pth"
fi
kernel=
for w in "$dist"/kt_kernel-*.whl build/kt-kernel/out/kt_kernel-*.whl; do  # (ls would fail the script on a missing dist/)
  [ -e "$w" ] && { kernel=$w; break; }
done
[ -n "$kernel" ] || { echo "gpu_check: no kt_kernel wheel in $dist or build/kt-kernel/out" >&2; exit 2; }
carriers=()
for name in ktransformers sglang_kt transformers_kt accelerate_kt sglang_kernel_kt; do
  for w in "$dist"/"$name"-*.whl; do [ -e "$w" ] && carriers+=("$w"); done
done
"$venv/bin/python" -m pip install -q --no-deps --no-index --force-reinstall "$kernel" "${carriers[@]}"
"$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA device')"
log=$(mktemp)
(cd /tmp && KT_REQUIRE_GPU=1 timeout 240 "$venv/bin/python" -m pytest -p no:cacheprovider -m gpu -rs -v "$OLDPWD/tests/gpu") | tee "$log"
if grep -qE "[0-9]+ skipped" "$log"; then
  echo "gpu_check: GPU tests were skipped on a machine with a GPU; that is a failure" >&2
  exit 1
fi
if [ ${#carriers[@]} -eq 5 ]; then
  export KT_KERNEL_CACHE_DIR=/tmp/kt-gpu-payload
  "$venv/bin/python" -m kt_kernel.payload materialize
  "$venv/bin/python" -m kt_kernel.payload verify
  "$venv/bin/python" -c "import torch, sgl_kernel; print('sgl_kernel loaded', sgl_kernel.common_ops.__file__)"
  "$venv/bin/python" -c "import kt_kernel.cuda as c; lib = c.load(); print('kt-kernel CUDA from the payload:', lib.arch)"
fi
echo "gpu_check: all GPU checks ran and passed"
