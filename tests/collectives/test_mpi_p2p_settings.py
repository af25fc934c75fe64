"""The choices of spmd.collectives.mpi.p2p that need no second process (the moves
themselves: tests/mpi/test_mpi_p2p.py)."""

from __future__ import annotations

import pytest

from spmd.collectives.mpi import p2p as mpi_p2p, shm as mpi_shm


@pytest.fixture(autouse=True)
def fresh_range():
    mpi_shm.size_range.cache_clear()
    yield
    mpi_shm.size_range.cache_clear()


def test_what_never_takes_the_outboxes(monkeypatch):
    """Decided without communicating: one member, an empty message, and a size out of
    the shared range (below it, past a slot) all stay with MPI; no channel is made."""
    lo, hi = mpi_shm.size_range()
    assert mpi_p2p.channel_for((0,), None, lo) is None
    assert mpi_p2p.channel_for((0, 1), None, 0) is None
    assert mpi_p2p.channel_for((0, 1), None, lo - 1) is None
    assert mpi_p2p.channel_for((0, 1), None, hi + 1) is None
    monkeypatch.setenv("SPMD_MPI_SHM_MAX_BYTES", "0")  # the shared path off
    mpi_shm.size_range.cache_clear()
    assert mpi_p2p.channel_for((0, 1), None, lo) is None
    assert (0, 1) not in mpi_p2p._channels

