"""Per-rank entry point of the multi-process test run (used by .ci/pytest_mpi.sh).

    mpiexec -n 4 python .ci/mpi_rank.py [pytest args...]

is `python -m pytest [pytest args...]` on every rank, except that

- rank 0 keeps the terminal; every other rank writes its output to
  $SPMD_MPI_LOGDIR/rank<N>.log (shown by the wrapper when that rank fails), so
  the log is one pytest run, not four interleaved ones;
- each rank records its pytest exit status in $SPMD_MPI_LOGDIR/rank<N>.rc.
  mpiexec (MPICH's hydra) returns the bitwise OR of the ranks' exit codes, which
  cannot tell "no test collected" (5) from "failed" (1) once they mix. A rank
  that dies without writing the file (killed, os._exit from pytest-timeout)
  counts as failed.

It runs in the rank's own process (no shell in between), so mpiexec's signals
reach pytest directly.
"""

import os
import sys


def _rank() -> str:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(var)
        if value:
            return value
    return "0"


def main() -> int:
    logdir = os.environ.get("SPMD_MPI_LOGDIR")
    rank = _rank()
    if logdir and rank != "0":
        fd = os.open(os.path.join(logdir, f"rank{rank}.log"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    # What `python -m pytest` does: the current directory goes first on sys.path
    # (instead of this script's directory).
    sys.path[0] = os.getcwd()
    import pytest

    code = int(pytest.main(sys.argv[1:]))
    if logdir:
        with open(os.path.join(logdir, f"rank{rank}.rc"), "w") as f:
            f.write(f"{code}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
