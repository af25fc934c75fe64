"""Lazy MPI initialisation through mpi4py."""

from __future__ import annotations

import functools

from spmd.errors import SpmdError


class MPIUnavailableError(SpmdError, RuntimeError):
    """MPI was requested or detected but mpi4py cannot be imported."""


@functools.lru_cache(maxsize=None)
def world():
    """``MPI.COMM_WORLD``, importing (and so initialising) mpi4py on first use."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise MPIUnavailableError(
            f"this process was launched as an MPI rank but mpi4py cannot be imported ({e}); "
            "install it with `pip install mpi4py mpich` (or `make venv`)") from None
    from spmd.launch import _rank

    _rank.note_segments()  # MPI's node segment: spmd-run removes it after a bad end
    return MPI.COMM_WORLD


def threads_may_call_mpi() -> bool:
    """Whether several threads of this process may make MPI calls at once
    (``MPI_THREAD_MULTIPLE``, which mpi4py asks for by default)."""
    world()
    from mpi4py import MPI

    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE
