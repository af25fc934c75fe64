#!/usr/bin/env bash
# The multi-process test suite: the tests marked @pytest.mark.mpi, run by pytest
# on NP ranks under the venv's mpiexec (from PyPI's `mpich` wheel):
#
#   timeout 1200 .venv/bin/mpiexec -n 4 .venv/bin/python .ci/mpi_rank.py \
#       -q -p no:cacheprovider --with-mpi -m mpi --timeout=300 --timeout-method=thread tests
#
# Usage: bash .ci/pytest_mpi.sh [pytest args...]   (default: tests)
#
# Environment:
#   NP                       ranks (default 4)
#   PYTEST_TIMEOUT           per-test limit in seconds (default 300)
#   SPMD_MPI_RUN_TIMEOUT     whole-run limit in seconds (default 1200)
#   SPMD_CHECK_COLLECTIVES   the checking mode (default 1 here: on)
#   SPMD_REQUIRE_MPI_TESTS=1 make "no multi-process test collected" an error;
#                            otherwise it is reported loudly and the run passes
#   VENV                     the virtual environment (default .venv)
#
# Time limits: pytest-timeout's `thread` method is used because a rank blocked
# inside an MPI call never returns to Python, so the default `signal` method
# cannot interrupt it; `thread` dumps the stacks and kills that rank, and then
# mpiexec tears the whole job down. The outer `timeout` catches anything else
# (a hang in collection, in MPI_Init or MPI_Finalize).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${VENV:-.venv}
NP=${NP:-4}
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-300}
RUN_TIMEOUT=${SPMD_MPI_RUN_TIMEOUT:-1200}
if [ $# -eq 0 ]; then set -- tests; fi

MPIEXEC="$VENV/bin/mpiexec"
if [ ! -x "$MPIEXEC" ]; then
    echo "ERROR: $MPIEXEC not found; run 'make venv' (it installs the mpich wheel)" >&2
    exit 1
fi

# Ranks share the machine's cores: one BLAS thread per rank, or the ranks'
# thread pools and MPI's busy polling oversubscribe the CPU (10x slower seen
# with 4 ranks on 2 cores).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
# The launched size, for tests that check it.
export SPMD_TEST_MPI_NP="$NP"
# The project's own multi-process tests compare every collective across the ranks
# before its data moves (docs/launching.md, "The checking mode"): a test whose ranks
# fall out of step fails at once, naming them, instead of pairing wrong data.
export SPMD_CHECK_COLLECTIVES=${SPMD_CHECK_COLLECTIVES:-1}

logdir=$(mktemp -d "${TMPDIR:-/tmp}/spmd-mpi-tests.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
export SPMD_MPI_LOGDIR="$logdir"

echo "=== multi-process suite: $MPIEXEC -n $NP pytest --with-mpi -m mpi $* (per-test ${PYTEST_TIMEOUT}s, whole run ${RUN_TIMEOUT}s)"
start=$SECONDS
timeout -k 30 "$RUN_TIMEOUT" "$MPIEXEC" -n "$NP" "$VENV/bin/python" .ci/mpi_rank.py \
    -q -p no:cacheprovider --with-mpi -m mpi \
    --timeout="$PYTEST_TIMEOUT" --timeout-method=thread "$@"
rc=$?
elapsed=$((SECONDS - start))

# Each rank's pytest exit status ("missing": the rank died before pytest returned).
codes=()
for ((r = 0; r < NP; r++)); do
    if [ -s "$logdir/rank$r.rc" ]; then
        codes+=("$(tr -d '[:space:]' < "$logdir/rank$r.rc")")
    else
        codes+=("missing")
    fi
done

show_rank_logs() {  # ranks 1..NP-1 ($1 = all | failed)
    # When rank 0 failed too, its output is above: show only the others' tails.
    local lines=200
    if [ "${codes[0]}" != 0 ]; then lines=5; fi
    for ((r = 1; r < NP; r++)); do
        if [ "$1" = all ] || [ "${codes[$r]}" != 0 ]; then
            echo "----- rank $r (exit ${codes[$r]}; last $lines lines of its log) -----"
            if [ -s "$logdir/rank$r.log" ]; then
                tail -n "$lines" "$logdir/rank$r.log"
            else
                echo "(no output)"
            fi
        fi
    done
}

all_equal() {  # all_equal VALUE: every rank's code is VALUE
    for c in "${codes[@]}"; do [ "$c" = "$1" ] || return 1; done
}

if { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && [ $elapsed -ge $((RUN_TIMEOUT - 1)) ]; then
    show_rank_logs all
    echo "ERROR: multi-process suite killed after ${elapsed}s (whole-run limit ${RUN_TIMEOUT}s); rank exit codes: ${codes[*]}" >&2
    exit 1
fi

if all_equal 0 && [ $rc -eq 0 ]; then
    for ((r = 1; r < NP; r++)); do
        echo "rank $r: $(grep -v '^[[:space:]]*$' "$logdir/rank$r.log" | tail -n 1)"
    done
    echo "=== multi-process suite passed on $NP ranks (${elapsed}s)"
    exit 0
fi

if all_equal 5; then
    if [ "${SPMD_REQUIRE_MPI_TESTS:-0}" = 1 ]; then
        echo "ERROR: no multi-process tests collected (pytest exit 5 on all $NP ranks) and SPMD_REQUIRE_MPI_TESTS=1" >&2
        exit 1
    fi
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!! no multi-process tests collected (no @pytest.mark.mpi test selected);"
    echo "!!! continuing. Set SPMD_REQUIRE_MPI_TESTS=1 to make this an error."
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    exit 0
fi

show_rank_logs failed
echo "ERROR: multi-process suite failed: mpiexec exit $rc; rank exit codes: ${codes[*]}" >&2
exit 1
