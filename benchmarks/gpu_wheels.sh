#!/usr/bin/env bash
# Download the wheels that benchmarks/gpu_check.sh needs on a GPU machine that has
# no network (run this where pip reaches PyPI; the GPU machine gets them in .whl/).
#
#   bash benchmarks/gpu_wheels.sh          # -> .whl/ (git-ignored), about 18 MB
#
# What they add to an image that already has CuPy, numpy, pytest and mpi4py:
# optree (spmd's pytrees), mpich (mpiexec and libmpi for the 2-rank run),
# mpi4py (a build known to load that libmpi), pytest-mpi (--with-mpi) and
# pytest-timeout (per-test limits), at the versions the CPU venv uses.
# NCCL is not carried (its wheel is larger than the device tool carries): the
# project's GPU image has nvidia-nccl-cu13; gpu_check.sh fails if CuPy cannot
# load it.
#
# PYVER must be the GPU machine's Python (the project's H200 image: 3.12.3, so
# the default 3.12); gpu_check.sh refuses a wheel built for another one and
# says so.  Environment: PYVER (default 3.12), DEST (default .whl).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYVER=${PYVER:-3.12}
DEST=${DEST:-.whl}
mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # one version of each: wheels of another Python would be refused
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp "${platforms[@]}" -d "$DEST" \
    "optree==0.20.0" "mpi4py==4.1.2" "mpich==5.0.2" "pytest-mpi==0.6" "pytest-timeout==2.4.0"
ls -l "$DEST"
echo "wheels for Python $PYVER in $DEST/; on the GPU machine run: bash benchmarks/gpu_check.sh" \
     "(with .whl carried along)"
