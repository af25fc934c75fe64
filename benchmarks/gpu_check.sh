#!/usr/bin/env bash
# spmd on one NVIDIA GPU, in one short run (about 5 minutes, 7.5 at most):
#
#   1. tests/gpu: CuPy arrays, eager ops, jit, grads, shard_map on a simulated
#      8-device mesh on the GPU, the partitioner, a 1-rank NCCL communicator;
#   2. benchmarks/bench_gpu.py: psum through NCCL vs raw NCCL (4 and 256 MiB), a
#      jitted MLP training step vs the same step hand-written in CuPy (batch 4096);
#   3. the shard_map, collectives and partitioner suites with GPU devices
#      (SPMD_PLATFORM=gpu: every simulated device's blocks in GPU memory);
#   4. the multi-process suite on 2 MPI ranks sharing the GPU, collectives staged
#      through host memory (SPMD_GPU_BACKEND=mpi: NCCL cannot put 2 ranks on 1 GPU);
#   5. the documented launch: spmd-run -n 2 --platform gpu examples/train_mlp.py.
#
# It prints a summary table; with $OUT set, the logs, the benchmark results
# (gpu.json) and the summary are written there (else to /tmp/spmd-gpu-check).
#
# Usage (repository root, on the GPU machine):
#   bash benchmarks/gpu_check.sh
# The GPU machine of this project has no network: first run, where pip works,
#   bash benchmarks/gpu_wheels.sh     # -> .whl/ (optree, mpi4py, mpich, pytest-mpi)
# and carry .whl along.  CuPy is installed when missing (cupy-cuda12x or
# cupy-cuda13x, by the CUDA version nvidia-smi shows), from .whl/ or PyPI.
#
# Environment: PY (the Python to use; default .venv/bin/python, else python3),
# GPU_CHECK_SECONDS (the whole run's budget, default 450), GPU_CHECK_SUITES (the
# test paths of step 3, default "tests/shard tests/collectives tests/partition").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
OUTDIR=${OUT:-/tmp/spmd-gpu-check}
mkdir -p "$OUTDIR"
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-450}))
SUMMARY=()
FAILED=0
export PYTHONUNBUFFERED=1

say() { echo "=== $*"; }
record() {  # record STEP RESULT SECONDS [NOTE]
    SUMMARY+=("$(printf '| %-44s | %-7s | %5ss | %s' "$1" "$2" "$3" "${4:-}")")
    if [ "$2" = FAIL ]; then FAILED=1; fi
}
limit() {  # limit WANTED: seconds a step may take, within the run's budget (15 at least)
    local left=$((DEADLINE - SECONDS - 10))
    if [ "$left" -lt 15 ]; then left=15; fi
    if [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}

# ------------------------------------------------------------------ Python
PY=${PY:-}
if [ -z "$PY" ]; then
    for c in .venv/bin/python python3 python; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c "import numpy, pytest" 2>/dev/null; then
            PY=$c
            break
        fi
    done
fi
if [ -z "$PY" ]; then
    echo "ERROR: no Python with numpy and pytest found (set PY=...)" >&2
    exit 2
fi
PY=$(command -v "$PY")
case "$PY" in /*) ;; *) PY="$REPO/$PY" ;; esac
say "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# Carried wheels (benchmarks/gpu_wheels.sh): Python packages into a target dir
# first on the path; the mpich wheel unpacked for mpiexec and libmpi.
MPIEXEC=""
if ls .whl/*.whl >/dev/null 2>&1; then
    SITE=/tmp/spmd-gpu-site
    pywheels=$(ls .whl/*.whl | grep -v -e '/mpich-' -e '/cupy' || true)
    if [ -n "$pywheels" ]; then
        # shellcheck disable=SC2086
        "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
            --upgrade --target "$SITE" $pywheels && export PYTHONPATH="$SITE:$PYTHONPATH"
    fi
    mpich=$(ls .whl/mpich-*.whl 2>/dev/null | head -1)
    if [ -n "$mpich" ]; then
        "$PY" -m zipfile -e "$mpich" /tmp/spmd-mpich
        MPICH=$(ls -d /tmp/spmd-mpich/mpich-*.data/data | head -1)
        chmod +x "$MPICH"/bin/*
        export PATH="$MPICH/bin:$PATH"
        export LD_LIBRARY_PATH="$MPICH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export MPI4PY_LIBMPI="$MPICH/lib/libmpi.so.12"
    fi
fi
for c in .venv/bin/mpiexec mpiexec; do
    if command -v "$c" >/dev/null 2>&1; then MPIEXEC=$(command -v "$c"); break; fi
done
case "$MPIEXEC" in /*|"") ;; *) MPIEXEC="$REPO/$MPIEXEC" ;; esac

# ------------------------------------------------------------------- CuPy
has_gpu() { "$PY" -c "import cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)" \
    >/dev/null 2>&1; }
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "ERROR: nvidia-smi not found: this is not a machine with an NVIDIA GPU and driver" >&2
    exit 2
fi
if ! "$PY" -c "import cupy" >/dev/null 2>&1; then
    major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\).*/\1/p' | head -1)
    pkg="cupy-cuda${major:-12}x"
    say "CuPy missing: installing $pkg (CUDA ${major:-unknown} per nvidia-smi)"
    if ls .whl/cupy*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --find-links .whl --target /tmp/spmd-gpu-site "$pkg" \
            && export PYTHONPATH="/tmp/spmd-gpu-site:$PYTHONPATH"
    else
        "$PY" -m pip install -q "$pkg" || true
    fi
fi
if ! has_gpu; then
    "$PY" -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())" 2>&1 | tail -3
    echo "ERROR: CuPy is not importable or sees no GPU; nothing to check" >&2
    exit 2
fi
if ! "$PY" -c "import optree" >/dev/null 2>&1; then
    echo "ERROR: optree is missing (spmd needs it); run benchmarks/gpu_wheels.sh where pip" \
         "works and carry .whl along" >&2
    exit 2
fi

{
    nvidia-smi -L 2>/dev/null
    nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>/dev/null
    "$PY" - <<'EOF'
import sys, numpy, cupy
print("python", sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "cuda runtime", cupy.cuda.runtime.runtimeGetVersion())
try:
    from cupy.cuda import nccl
    print("nccl available", nccl.available, "version", nccl.get_version() if nccl.available else "-")
except Exception as e:
    print("nccl not importable:", type(e).__name__, e)
try:
    import ml_dtypes
    print("ml_dtypes", ml_dtypes.__version__)
except ImportError:
    print("ml_dtypes missing (no bfloat16)")
EOF
    echo "mpiexec: ${MPIEXEC:-none}"
} 2>&1 | tee "$OUTDIR/env.txt"

export SPMD_PLATFORM=gpu
unset SPMD_GPU_BACKEND
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -p no:randomly)

# ------------------------------------------------------- 1. tests/gpu
t0=$SECONDS
say "1. tests/gpu (SPMD_PLATFORM=gpu)"
timeout -k 10 "$(limit 150)" "${PYTEST[@]}" -rs tests/gpu 2>&1 | tee "$OUTDIR/gpu_tests.log"
rc=${PIPESTATUS[0]}
skips=$(grep -c "^SKIPPED .*test_gpu.py" "$OUTDIR/gpu_tests.log" || true)
if [ "$rc" -eq 0 ]; then
    record "tests/gpu" pass $((SECONDS - t0)) "$(tail -1 "$OUTDIR/gpu_tests.log") ($skips GPU test(s) skipped)"
else
    record "tests/gpu" FAIL $((SECONDS - t0)) "exit $rc: $(tail -1 "$OUTDIR/gpu_tests.log")"
fi

# ------------------------------------------------------ 2. benchmarks
t0=$SECONDS
say "2. benchmarks/bench_gpu.py"
timeout -k 10 "$(limit 150)" "$PY" benchmarks/run.py gpu --out "$OUTDIR" 2>&1 \
    | tee "$OUTDIR/bench.log"
rc=${PIPESTATUS[0]}
missed=$(grep -c "FAIL" "$OUTDIR/bench.log" || true)
if [ "$rc" -ne 0 ]; then
    record "benchmarks (bench_gpu)" FAIL $((SECONDS - t0)) "exit $rc"
elif [ "$missed" -gt 0 ]; then
    record "benchmarks (bench_gpu)" goals $((SECONDS - t0)) "$missed goal(s) missed: see the table"
else
    record "benchmarks (bench_gpu)" pass $((SECONDS - t0)) "goals met"
fi

# ------------------------------------- 3. suites on a simulated mesh on the GPU
t0=$SECONDS
SUITES=${GPU_CHECK_SUITES:-tests/shard tests/collectives tests/partition}
say "3. $SUITES with GPU devices"
# Deselected: tests of the printed device names ("CPU 0"), which read "GPU 0" here.
timeout -k 10 "$(limit 200)" "${PYTEST[@]}" --timeout=120 --maxfail=20 \
    -k "not visualize and not single_device_sharding and not eight_simulated_cpus" \
    $SUITES 2>&1 | tee "$OUTDIR/suites.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
    record "suites: $SUITES" pass $((SECONDS - t0)) "$(tail -1 "$OUTDIR/suites.log")"
else
    record "suites: $SUITES" FAIL $((SECONDS - t0)) \
        "exit $rc (124: out of time): $(tail -1 "$OUTDIR/suites.log")"
fi

# ------------------------------ 4. two MPI ranks sharing the GPU (host-staged)
t0=$SECONDS
say "4. 2 MPI ranks on one GPU, SPMD_GPU_BACKEND=mpi"
if [ -z "$MPIEXEC" ] || ! "$PY" -c "import mpi4py.MPI, pytest_mpi" >/dev/null 2>&1; then
    record "2 ranks, host-staged (tests/mpi)" skipped 0 \
        "no mpiexec / mpi4py / pytest-mpi (benchmarks/gpu_wheels.sh brings them)"
    echo "mpi4py: $("$PY" -c 'import mpi4py.MPI' 2>&1 | tail -1)"
else
    # .ci/pytest_mpi.sh runs $VENV/bin/{mpiexec,python}: give it those (and what
    # mpiexec finds beside itself: hydra_pmi_proxy).
    rm -rf /tmp/spmd-mpi-venv && mkdir -p /tmp/spmd-mpi-venv/bin
    for f in "$(dirname "$MPIEXEC")"/hydra* "$(dirname "$MPIEXEC")"/mpi*; do
        [ -e "$f" ] && ln -sf "$f" /tmp/spmd-mpi-venv/bin/
    done
    ln -sf "$MPIEXEC" /tmp/spmd-mpi-venv/bin/mpiexec
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" > /tmp/spmd-mpi-venv/bin/python
    chmod +x /tmp/spmd-mpi-venv/bin/python
    lim=$(limit 120)
    SPMD_GPU_BACKEND=mpi VENV=/tmp/spmd-mpi-venv NP=2 SPMD_MPI_RUN_TIMEOUT="$lim" \
        PYTEST_TIMEOUT=100 SPMD_REQUIRE_MPI_TESTS=1 bash .ci/pytest_mpi.sh \
        -k "(f32 or gradients or axis_index or scalar or chain or jit_output or arrays or training) and not visualize" \
        tests/mpi/test_mpi_collectives.py tests/mpi/test_mpi_arrays.py \
        tests/mpi/test_mpi_training.py 2>&1 | tee "$OUTDIR/mpi.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        record "2 ranks, host-staged (tests/mpi)" pass $((SECONDS - t0)) "$(grep -m1 ' passed' "$OUTDIR/mpi.log")"
    else
        record "2 ranks, host-staged (tests/mpi)" FAIL $((SECONDS - t0)) "exit $rc"
    fi

    # ------------------------------------------- 5. the documented launch
    t0=$SECONDS
    say "5. spmd-run -n 2 --platform gpu examples/train_mlp.py (SPMD_GPU_BACKEND=mpi)"
    if [ "$(limit 90)" -lt 30 ]; then
        record "spmd-run -n 2 --platform gpu train_mlp" skipped 0 "no time left"
    else
        SPMD_GPU_BACKEND=mpi SPMD_MPIEXEC="$MPIEXEC" timeout -k 10 "$(limit 90)" \
            "$PY" -m spmd.launch -n 2 --platform gpu examples/train_mlp.py --epochs 3 2>&1 \
            | tail -15 | tee -a "$OUTDIR/mpi.log"
        rc=${PIPESTATUS[0]}
        result=pass; [ "$rc" -eq 0 ] || result=FAIL
        record "spmd-run -n 2 --platform gpu train_mlp" $result $((SECONDS - t0)) "exit $rc"
    fi
fi

# ------------------------------------------------------------------ summary
{
    echo
    echo "# spmd GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nvidia-smi -L 2>/dev/null | head -1)"
    printf '| %-44s | %-7s | %6s | %s\n' step result time note
    for line in "${SUMMARY[@]}"; do echo "$line"; done
    echo
    grep -E "^\| (psum|train_step)" "$OUTDIR/bench.log" 2>/dev/null || true
    echo "total ${SECONDS}s; logs and results in $OUTDIR"
} | tee "$OUTDIR/summary.txt"
exit $FAILED
