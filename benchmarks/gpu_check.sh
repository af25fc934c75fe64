#!/usr/bin/env bash
# spmd on one NVIDIA GPU, in one short run (about 6 minutes, 8 at most):
#
#   0. NCCL: CuPy can load it (CuPy wheels do not bundle NCCL: it comes from the
#      nvidia-nccl-cu12 / -cu13 wheel); its absence is a failure, not a skip;
#   1. tests/gpu: CuPy arrays, eager ops, jit, grads, shard_map on a simulated
#      8-device mesh on the GPU, the partitioner, a 1-rank NCCL communicator
#      (SPMD_REQUIRE_GPU_TESTS=1: a test that would skip fails instead);
#   2. benchmarks/bench_gpu.py: psum through NCCL vs raw NCCL (4 and 256 MiB), a
#      jitted MLP training step vs the same step hand-written in CuPy and vs
#      jax.jit (batch 4096), 8 simulated devices on the GPU vs 1;
#   3. the multi-process suite on 2 MPI ranks sharing the GPU, collectives staged
#      through host memory (SPMD_GPU_BACKEND=mpi: NCCL cannot put 2 ranks on 1 GPU);
#   4. the documented launch: spmd-run -n 2 --platform gpu examples/train_mlp.py;
#   5. the shard_map, collectives and partitioner suites with GPU devices
#      (SPMD_PLATFORM=gpu: every simulated device's blocks in GPU memory), in the
#      time left.
#
# A step that did not run what it should (a skip, a missing tool, out of time)
# is recorded as FAIL.  It prints a summary table; with $OUT set, the logs, the
# benchmark results (gpu.json) and the summary are written there (else to
# /tmp/spmd-gpu-check).  Exit status: 0 when every step passed, 1 when one
# failed, 2 when there is nothing to check (no GPU, no CuPy, no optree).
#
# Usage (repository root, on the GPU machine):
#   bash benchmarks/gpu_check.sh
# The GPU machine of this project has no network: first run, where pip works,
#   bash benchmarks/gpu_wheels.sh     # -> .whl/: optree, mpi4py, mpich, pytest-mpi,
#                                     #    pytest-timeout, for Python 3.12 by default
# and carry .whl along (the device tool: carry=[".whl"]).  Each carried wheel is
# checked against this Python (its cpXY tag) and installed on its own, so that a
# wrong one is named and does not sink the others.  CuPy is installed when
# missing (cupy-cuda12x or cupy-cuda13x, by the CUDA version nvidia-smi shows),
# from .whl/ or PyPI.
#
# Environment: PY (the Python to use; default .venv/bin/python, else python3),
# GPU_CHECK_COMMIT (the commit to print, where the copy on the GPU machine has no .git),
# GPU_CHECK_SECONDS (the whole run's budget, default 480), GPU_CHECK_SUITES (the
# test paths of step 5, default "tests/shard tests/collectives tests/partition").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
OUTDIR=${OUT:-/tmp/spmd-gpu-check}
mkdir -p "$OUTDIR"
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
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
# first on the path, one by one; the mpich wheel unpacked for mpiexec and libmpi.
MPIEXEC=""
WHEEL_NOTES=""
if ls .whl/*.whl >/dev/null 2>&1; then
    SITE=/tmp/spmd-gpu-site
    mkdir -p "$SITE"
    export PYTHONPATH="$SITE:$PYTHONPATH"
    pytag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    for whl in .whl/*.whl; do
        name=$(basename "$whl")
        case "$name" in mpich-*|cupy*) continue ;; esac  # unpacked / installed below
        # A wheel built for another Python (cp311 on 3.12, say) cannot load here.
        tag=$(echo "$name" | sed -n 's/.*-\(cp[0-9][0-9]*\)-\(cp[0-9][0-9]*\|abi3\)-.*/\1/p')
        if [ -n "$tag" ] && [ "$tag" != "$pytag" ] && ! echo "$name" | grep -q -- '-abi3-'; then
            WHEEL_NOTES="$WHEEL_NOTES $name (built for $tag; this Python is $pytag)"
            continue
        fi
        if ! "$PY" -m pip install -q --no-index --no-deps --no-compile \
                --disable-pip-version-check --upgrade --target "$SITE" "$whl"; then
            WHEEL_NOTES="$WHEEL_NOTES $name (pip refused it)"
        fi
    done
    if [ -n "$WHEEL_NOTES" ]; then
        echo "WARNING: carried wheels not installed:$WHEEL_NOTES. Rerun, where pip works:" \
             "PYVER=<this Python's X.Y> bash benchmarks/gpu_wheels.sh" >&2
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
if [ -n "$WHEEL_NOTES" ]; then
    record "carried wheels (.whl)" FAIL 0 "not installed:$WHEEL_NOTES"
elif ls .whl/*.whl >/dev/null 2>&1; then
    record "carried wheels (.whl)" pass 0 "$(ls .whl/*.whl | wc -l) wheel(s), all installed"
fi

{
    nvidia-smi -L 2>/dev/null
    nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>/dev/null
    "$PY" - <<'EOF'
import sys, numpy, cupy
print("python", sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "cuda runtime", cupy.cuda.runtime.runtimeGetVersion())
for name in ("ml_dtypes", "jax", "mpi4py", "pytest_timeout"):
    try:
        mod = __import__(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(name, "missing:", type(e).__name__, e)
EOF
    echo "mpiexec: ${MPIEXEC:-none}"
} 2>&1 | tee "$OUTDIR/env.txt"

export SPMD_PLATFORM=gpu SPMD_REQUIRE_GPU_TESTS=1 SPMD_REQUIRE_NCCL=1
unset SPMD_GPU_BACKEND CUDA_VISIBLE_DEVICES
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -p no:randomly)
# Per-test limits need pytest-timeout (gpu_wheels.sh carries it).
if "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then
    HAVE_TIMEOUT=1
    TEST_LIMIT=(--timeout=120)
else
    HAVE_TIMEOUT=0
    TEST_LIMIT=()
    echo "WARNING: pytest-timeout is missing: no per-test limits (each step's limit holds)" >&2
fi

# ------------------------------------------------------------- 0. NCCL
t0=$SECONDS
say "0. NCCL through CuPy"
nccl_line=$("$PY" - 2>&1 <<'EOF'
import warnings
warnings.simplefilter("ignore")  # CuPy warns when libnccl is missing: we say it
try:
    from cupy.cuda import nccl
except Exception as e:
    print(f"cannot import cupy.cuda.nccl: {type(e).__name__}: {e}")
    raise SystemExit(1)
if not getattr(nccl, "available", False):
    print("cupy.cuda.nccl.available is False: libnccl not found (install nvidia-nccl-cu12 "
          "or nvidia-nccl-cu13, matching the CuPy package)")
    raise SystemExit(1)
print(f"NCCL {nccl.get_version()}")
EOF
)
rc=$?
echo "$nccl_line"
if [ "$rc" -eq 0 ]; then
    record "NCCL available" pass $((SECONDS - t0)) "$nccl_line"
else
    record "NCCL available" FAIL $((SECONDS - t0)) "$(echo "$nccl_line" | tail -1)"
fi

# ------------------------------------------------------- 1. tests/gpu
t0=$SECONDS
say "1. tests/gpu/test_gpu.py (SPMD_PLATFORM=gpu, SPMD_REQUIRE_GPU_TESTS=1)"
# (The other tests/gpu modules run on the CPU stand-in, in the normal suite.)
timeout -k 10 "$(limit 150)" "${PYTEST[@]}" "${TEST_LIMIT[@]}" -rs tests/gpu/test_gpu.py 2>&1 \
    | tee "$OUTDIR/gpu_tests.log"
rc=${PIPESTATUS[0]}
skips=$(grep -c "^SKIPPED .*test_gpu.py" "$OUTDIR/gpu_tests.log" || true)
if [ "$rc" -eq 0 ] && [ "$skips" -gt 0 ]; then
    record "tests/gpu/test_gpu.py" FAIL $((SECONDS - t0)) "$skips GPU test(s) skipped"
elif [ "$rc" -eq 0 ]; then
    record "tests/gpu/test_gpu.py" pass $((SECONDS - t0)) "$(tail -1 "$OUTDIR/gpu_tests.log")"
else
    record "tests/gpu/test_gpu.py" FAIL $((SECONDS - t0)) "exit $rc: $(tail -1 "$OUTDIR/gpu_tests.log")"
fi

# ------------------------------------------------------ 2. benchmarks
t0=$SECONDS
say "2. benchmarks/bench_gpu.py"
timeout -k 10 "$(limit 200)" "$PY" benchmarks/run.py gpu --out "$OUTDIR" 2>&1 \
    | tee "$OUTDIR/bench.log"
rc=${PIPESTATUS[0]}
missed=$(grep -c "FAIL" "$OUTDIR/bench.log" || true)
if [ "$rc" -ne 0 ]; then
    record "benchmarks (bench_gpu)" FAIL $((SECONDS - t0)) "exit $rc (124: out of time)"
elif grep -q -e "skipped" "$OUTDIR/bench.log"; then
    record "benchmarks (bench_gpu)" FAIL $((SECONDS - t0)) \
        "$(grep -m1 -e "skipped" "$OUTDIR/bench.log")"
elif [ "$missed" -gt 0 ]; then
    record "benchmarks (bench_gpu)" goals $((SECONDS - t0)) "$missed goal(s) missed: see the table"
else
    record "benchmarks (bench_gpu)" pass $((SECONDS - t0)) "goals met"
fi
grep -m1 "no jax.jit row" "$OUTDIR/bench.log" || true

# ------------------------------ 3. two MPI ranks sharing the GPU (host-staged)
t0=$SECONDS
say "3. 2 MPI ranks on one GPU, SPMD_GPU_BACKEND=mpi"
if [ -z "$MPIEXEC" ] || ! "$PY" -c "import mpi4py.MPI, pytest_mpi" >/dev/null 2>&1; then
    record "2 ranks, host-staged (tests/mpi)" FAIL 0 \
        "no mpiexec / mpi4py / pytest-mpi (benchmarks/gpu_wheels.sh brings them)"
    echo "mpi4py: $("$PY" -c 'import mpi4py.MPI' 2>&1 | tail -1)"
    record "spmd-run -n 2 --platform gpu train_mlp" FAIL 0 "no MPI (see above)"
elif [ "$HAVE_TIMEOUT" -ne 1 ]; then
    record "2 ranks, host-staged (tests/mpi)" FAIL 0 \
        "pytest-timeout missing (.ci/pytest_mpi.sh needs it; gpu_wheels.sh brings it)"
    record "spmd-run -n 2 --platform gpu train_mlp" FAIL 0 "not run (see above)"
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

    # ------------------------------------------- 4. the documented launch
    t0=$SECONDS
    say "4. spmd-run -n 2 --platform gpu examples/train_mlp.py (SPMD_GPU_BACKEND=mpi)"
    if [ "$(limit 90)" -lt 30 ]; then
        record "spmd-run -n 2 --platform gpu train_mlp" FAIL 0 "no time left"
    else
        SPMD_GPU_BACKEND=mpi SPMD_MPIEXEC="$MPIEXEC" timeout -k 10 "$(limit 90)" \
            "$PY" -m spmd.launch -n 2 --platform gpu examples/train_mlp.py --epochs 3 2>&1 \
            | tail -15 | tee -a "$OUTDIR/mpi.log"
        rc=${PIPESTATUS[0]}
        result=pass; [ "$rc" -eq 0 ] || result=FAIL
        record "spmd-run -n 2 --platform gpu train_mlp" $result $((SECONDS - t0)) "exit $rc"
    fi
fi

# ------------------------------------- 5. suites on a simulated mesh on the GPU
t0=$SECONDS
SUITES=${GPU_CHECK_SUITES:-tests/shard tests/collectives tests/partition}
say "5. $SUITES with GPU devices ($(limit 300)s left)"
# Deselected: tests of the printed device names ("CPU 0"), which read "GPU 0" here.
# shellcheck disable=SC2086
timeout -k 10 "$(limit 300)" "${PYTEST[@]}" "${TEST_LIMIT[@]}" --maxfail=20 \
    -k "not visualize and not single_device_sharding and not eight_simulated_cpus" \
    $SUITES 2>&1 | tee "$OUTDIR/suites.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
    record "suites: $SUITES" pass $((SECONDS - t0)) "$(tail -1 "$OUTDIR/suites.log")"
else
    record "suites: $SUITES" FAIL $((SECONDS - t0)) \
        "exit $rc (124: out of time): $(tail -1 "$OUTDIR/suites.log")"
fi

# ------------------------------------------------------------------ summary
{
    echo
    echo "# spmd GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit" \
         "${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}," \
         "$(nvidia-smi -L 2>/dev/null | head -1)"
    printf '| %-44s | %-7s | %6s | %s\n' step result time note
    for line in "${SUMMARY[@]}"; do echo "$line"; done
    echo
    grep -E "^\| (psum|train_step|dp_train_step)" "$OUTDIR/bench.log" 2>/dev/null || true
    echo "total ${SECONDS}s; logs and results in $OUTDIR"
} | tee "$OUTDIR/summary.txt"
exit $FAILED
