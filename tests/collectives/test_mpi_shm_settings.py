"""The shared-memory collectives' settings and choices that need no second process
(the collectives themselves: tests/mpi/test_mpi_shm.py)."""

from __future__ import annotations

import importlib.util

import pytest

from spmd.collectives.mpi import shm as mpi_shm
from spmd.errors import ArgumentError


@pytest.fixture(autouse=True)
def fresh_range():
    mpi_shm.size_range.cache_clear()
    yield
    mpi_shm.size_range.cache_clear()


def test_the_default_range():
    assert mpi_shm.size_range() == (mpi_shm.SHM_MIN_BYTES, mpi_shm.SHM_MAX_BYTES)


def test_the_range_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPMD_MPI_SHM_MIN_BYTES", "1024")
    monkeypatch.setenv("SPMD_MPI_SHM_MAX_BYTES", "0")
    assert mpi_shm.size_range() == (1024, 0)


@pytest.mark.parametrize("name", ["SPMD_MPI_SHM_MIN_BYTES", "SPMD_MPI_SHM_MAX_BYTES"])
@pytest.mark.parametrize("raw", ["lots", "-5", "1.5"])
def test_a_bad_setting_names_the_variable_and_the_value(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ArgumentError, match=f"{name}='{raw}' is not a number of bytes"):
        mpi_shm.size_range()


def test_what_never_takes_the_shared_path():
    """Decided without communicating: one member, a size out of its use's range, and
    an empty operand all stay with MPI (no window is made, nothing collective runs)."""
    lo, hi = mpi_shm.size_range()
    assert mpi_shm.segment_for((0,), None, lo, "allreduce") is None
    assert mpi_shm.segment_for((0, 1), None, lo - 1, "allreduce") is None
    assert mpi_shm.segment_for((0, 1), None, hi + 1, "started") is None
    assert mpi_shm.segment_for((0, 1), None, hi // 2 + 1, "move") is None
    assert mpi_shm.segment_for((0, 1), None, 0, "allreduce") is None
    assert (0, 1) not in mpi_shm._segments


def test_disabled_takes_nothing(monkeypatch):
    monkeypatch.setenv("SPMD_MPI_SHM_MAX_BYTES", "0")
    for use in ("allreduce", "started", "reduce_scatter", "move"):
        assert mpi_shm.segment_for((0, 1), None, mpi_shm.SHM_MIN_BYTES, use) is None


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
def test_a_one_rank_world_sums_through_mpi():
    import numpy as np

    from spmd.collectives import mpi

    x = np.arange(20000, dtype=np.float32)
    np.testing.assert_array_equal(mpi.allreduce(x, (0,), "sum"), x)
    assert (0,) not in mpi_shm._segments


def test_a_bad_split_setting_names_the_variable_and_the_value(monkeypatch):
    from spmd.collectives import mpi

    monkeypatch.setenv("SPMD_MPI_ALLREDUCE_SPLIT_BYTES", "big")
    mpi.communicators.split_bytes.cache_clear()
    try:
        with pytest.raises(ArgumentError, match="SPMD_MPI_ALLREDUCE_SPLIT_BYTES='big' is not"):
            mpi.communicators.split_bytes()
    finally:
        mpi.communicators.split_bytes.cache_clear()


@pytest.mark.parametrize("raw", ["lots", "-5", "1.5"])
def test_a_bad_hierarchy_threshold_names_the_variable_and_the_fix(monkeypatch, raw):
    from spmd.collectives.mpi import hier as mpi_hier

    monkeypatch.setenv("SPMD_MPI_HIER_MIN_BYTES", raw)
    mpi_hier.min_bytes.cache_clear()
    try:
        with pytest.raises(ArgumentError, match=(
                f"SPMD_MPI_HIER_MIN_BYTES='{raw}' is not a number of bytes >= 0; unset it "
                rf"for the default \({mpi_hier.HIER_MIN_BYTES}\), or 0 to keep collectives "
                "across nodes flat")):
            mpi_hier.min_bytes()
    finally:
        monkeypatch.delenv("SPMD_MPI_HIER_MIN_BYTES")
        mpi_hier.min_bytes.cache_clear()


def test_the_hierarchy_threshold_from_the_environment(monkeypatch):
    from spmd.collectives.mpi import hier as mpi_hier

    try:
        monkeypatch.setenv("SPMD_MPI_HIER_MIN_BYTES", "4096")
        mpi_hier.min_bytes.cache_clear()
        assert mpi_hier.min_bytes() == 4096
        monkeypatch.setenv("SPMD_MPI_HIER_MIN_BYTES", "0")  # never: every call flat
        mpi_hier.min_bytes.cache_clear()
        assert mpi_hier.min_bytes() > 2 ** 60
    finally:
        monkeypatch.delenv("SPMD_MPI_HIER_MIN_BYTES")
        mpi_hier.min_bytes.cache_clear()
