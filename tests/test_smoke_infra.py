"""The multi-process suite's canary: MPI works and the launch has the expected
size. Runs under `mpiexec -n N python -m pytest --with-mpi`; without
--with-mpi, pytest-mpi skips it."""

import os

import numpy as np
import pytest


def _launched_size() -> int:
    """The number of ranks the launcher started, from the environment it set."""
    for var in ("SPMD_TEST_MPI_NP", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1  # a singleton run: `python -m pytest --with-mpi` without mpiexec


@pytest.mark.mpi
def test_comm_world_size_and_allreduce():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    assert size == _launched_size()

    send = np.array([rank, 1], dtype=np.int64)
    recv = np.empty_like(send)
    comm.Allreduce(send, recv, op=MPI.SUM)
    np.testing.assert_array_equal(recv, [size * (size - 1) // 2, size])

    ranks = np.empty(size, dtype=np.float32)
    comm.Allgather(np.array([rank], dtype=np.float32), ranks)
    np.testing.assert_array_equal(ranks, np.arange(size, dtype=np.float32))
