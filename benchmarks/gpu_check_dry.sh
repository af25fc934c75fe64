#!/usr/bin/env bash
# A dry run of benchmarks/gpu_check.sh on a machine without a GPU: `import cupy`
# gives the CPU stand-in (tests/gpu/fake_cupy.py, with its NCCL) and a stub
# `nvidia-smi` answers, so every step of the script runs: the wheel checks, the
# NCCL check, the GPU tests, the benchmarks, the 2-rank and spmd-run steps and
# a suite, and the summary.  It checks the script's logic, not a GPU: timings
# mean nothing, and the benchmarks' 256 MiB psum is slow on a CPU (expect that
# step to run out of time on a small machine).
#
#   bash benchmarks/gpu_check_dry.sh        # about 7 minutes on 2 cores
#
# Environment: as gpu_check.sh (PY defaults to .venv/bin/python here; OUT
# defaults to /tmp/spmd-gpu-check-dry; GPU_CHECK_SUITES to one shard_map file).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SHIM=$(mktemp -d "${TMPDIR:-/tmp}/spmd-gpu-dry.XXXXXX")
trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/bin" "$SHIM/site/cupy"
cat > "$SHIM/bin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
  -L*) echo "GPU 0: stand-in (a dry run of gpu_check.sh, no GPU)" ;;
  *query*) echo "0.0, 0 MiB" ;;
  *) echo "| NVIDIA-SMI 0.0   Driver Version: 0.0   CUDA Version: 13.0 |" ;;
esac
EOF
chmod +x "$SHIM/bin/nvidia-smi"
cat > "$SHIM/site/cupy/__init__.py" <<'EOF'
# `import cupy` -> the CPU stand-in, installed as cupy (see tests/gpu/fake_cupy.py).
import sys

from tests.gpu import fake_cupy

fake_cupy.install()
fake_cupy.__version__ = "stand-in"
fake_cupy.cuda.runtime.runtimeGetVersion = lambda: 0
sys.modules[__name__] = fake_cupy
EOF
PATH="$SHIM/bin:$PATH" PYTHONPATH="$SHIM/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    FAKE_CUPY_NCCL=1 PY="${PY:-.venv/bin/python}" OUT="${OUT:-/tmp/spmd-gpu-check-dry}" \
    GPU_CHECK_SUITES="${GPU_CHECK_SUITES:-tests/shard/test_shard_map.py}" \
    bash benchmarks/gpu_check.sh
