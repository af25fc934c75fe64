"""Simulated nodes (``SPMD_SIMULATE_NODES``) across real processes: the node checks of
the MPI backend take the multi-node branches on one machine.

Runs on 4 ranks (``make test``; ``make test-mpi`` runs it in place under ``mpiexec``,
also with ``SPMD_SIMULATE_NODES=2`` set for the job): each test sets the value it
needs on every rank at the same point.  With 2 simulated nodes on 4 ranks (ranks 0-1 on node 0, 2-3 on node 1):

- MPI's node split, split again per simulated node, has the members of one node;
- a communicator spanning both nodes gets no shared-memory window (MPI's calls),
  one within a node gets one, and every collective's result equals the one-node
  run's (values are small integers: the sums are exact in any order);
- a bad value, or ranks that read different values, raise an ArgumentError on
  every rank alike instead of a hang.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
from spmd import P, lax  # noqa: E402
from spmd.errors import ArgumentError  # noqa: E402
from spmd.launch import nodes  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def simulate(monkeypatch):
    """``simulate(value)``: every rank reads ``SPMD_SIMULATE_NODES=value`` (None:
    unset) from a fresh start (no shared window yet); restored at the end."""
    from spmd.collectives.mpi import shm as mpi_shm

    def configure(value):
        _world().Barrier()
        mpi_shm.reset()
        if value is None:
            monkeypatch.delenv(nodes.ENV, raising=False)
        else:
            monkeypatch.setenv(nodes.ENV, str(value))

    yield configure
    _world().Barrier()
    mpi_shm.reset()
    monkeypatch.undo()


def _need_room():
    from spmd.collectives.mpi import shm as mpi_shm

    n = _world().Get_size()
    if not all(_world().allgather(mpi_shm.has_room(n, mpi_shm.size_range()[1]))):
        pytest.skip("/dev/shm has no room for a shared window: spmd uses MPI's calls "
                    "on one node too, which the rest of the suite tests")


def _collectives(groups):
    """Every collective of the MPI backend over each group of ``groups`` (this rank is
    in each), in the shared-memory range: the results, in order."""
    from spmd.collectives import mpi

    me = _world().Get_rank()
    out = []
    for g in groups:
        m = len(g)
        x = (np.arange(m * 9000) % 31).astype(np.float32) * (me + 1)  # 36 KiB per member
        out.append(mpi.allreduce(x, g, "sum"))
        out.append(mpi.allgather(x, g))
        out.append(mpi.reduce_scatter(x.reshape(m, -1), g, "sum"))
        out.append(mpi.alltoall(x.reshape(m, -1), g))
        out.append(mpi.iallreduce(x + 1, g, "sum").wait())
    return out


def test_the_node_split_follows_the_simulated_nodes(simulate):
    n, me = _world().Get_size(), _world().Get_rank()
    simulate(2)
    node = nodes.split_by_node(_world())
    try:
        members = node.allgather(me)
    finally:
        node.Free()
    want = [list(b) for b in nodes.blocks(n, 2)][nodes.node_of(me, n, 2)]
    assert members == want == list(nodes.node_ranks())
    assert nodes.node_index() == (0 if me in nodes.blocks(n, 2)[0] else 1)
    simulate(None)  # one real node: every rank
    node = nodes.split_by_node(_world())
    try:
        assert node.Get_size() == n
    finally:
        node.Free()


def test_a_window_only_within_a_simulated_node_and_the_same_results(simulate):
    """All ranks (both nodes), the ranks of this rank's node, and a pair across the
    nodes: a window for the node's group only; results equal to the one-node run."""
    from spmd.collectives.mpi import shm as mpi_shm

    n, me = _world().Get_size(), _world().Get_rank()
    if n < 4:
        pytest.skip("needs 4 ranks: 2 simulated nodes of 2")
    _need_room()
    half = n // 2
    everyone = tuple(range(n))
    own = tuple(nodes.blocks(n, 2)[nodes.node_of(me, n, 2)])
    across = tuple(sorted((me % half, me % half + half)))  # one rank of each node
    groups = [everyone, own, across]

    simulate(None)
    one_node = _collectives(groups)
    assert all(mpi_shm._segments.get(g) is not None for g in groups)  # one machine: all

    simulate(2)
    two_nodes = _collectives(groups)
    assert mpi_shm._segments.get(everyone) is None   # spans the nodes: MPI's calls
    assert mpi_shm._segments.get(across) is None
    assert mpi_shm._segments.get(own) is not None    # within one node: the window
    for a, b in zip(one_node, two_nodes):
        np.testing.assert_array_equal(a, b)


def test_a_jitted_program_gives_the_same_results_on_two_nodes(simulate):
    """psum, all_gather and psum_scatter over each axis of a 2-D mesh whose rows are
    the simulated nodes: along ``b`` within a node, along ``a`` across."""
    if spmd.device_count() % 2 or spmd.device_count() < 4:
        pytest.skip("needs 4 devices or more, an even number")
    mesh = spmd.make_mesh((2, spmd.device_count() // 2), ("a", "b"))
    rng = np.random.default_rng(3)
    x = rng.integers(-4, 5, (spmd.device_count() * 8, 2048)).astype(np.float32)

    def body(b):
        return (lax.psum(b, "a"), lax.psum(b, "b"), lax.psum(b, ("a", "b")),
                lax.all_gather(b, "b", tiled=True), lax.psum_scatter(b, "a", tiled=True))

    runs = []
    for value in (None, 2):
        simulate(value)
        f = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P(("a", "b")),
                                    out_specs=(P(("a", "b")),) * 5, check_vma=False))
        runs.append([np.asarray(spmd.process_allgather(v)) for v in f(x)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("raw", ["0", "two", "too many"])
def test_a_bad_value_raises_on_every_rank_alike(simulate, raw):
    from spmd.collectives import mpi
    from spmd.collectives.mpi import shm as mpi_shm

    n = _world().Get_size()
    raw = str(n + 1) if raw == "too many" else raw
    simulate(raw)
    ranks = tuple(range(n))
    with pytest.raises(ArgumentError, match=f"SPMD_SIMULATE_NODES='{raw}'") as e:
        nodes.simulated()  # what each rank meets first (spmd.launch.process.describe)
    assert f"from 1 to the job's {n} ranks" in str(e.value)
    with pytest.raises(ArgumentError,
                       match=re.escape(f"ranks {list(ranks)}: SPMD_SIMULATE_NODES='{raw}'")):
        mpi_shm.segment_for(ranks, mpi.communicator(ranks), 40000, "allreduce")
    assert ranks not in mpi_shm._segments


def test_ranks_that_read_different_values_all_raise(simulate, monkeypatch):
    """Rank 0 alone simulates 2 nodes: every rank raises, naming who read what, when
    the first window would be made -- none is left waiting in the node split."""
    from spmd.collectives import mpi
    from spmd.collectives.mpi import shm as mpi_shm

    n, me = _world().Get_size(), _world().Get_rank()
    simulate(2 if me == 0 else None)
    ranks = tuple(range(n))
    with pytest.raises(ArgumentError) as e:
        mpi_shm.segment_for(ranks, mpi.communicator(ranks), 40000, "allreduce")
    msg = str(e.value)
    assert "ranks [0]: SPMD_SIMULATE_NODES=2" in msg
    assert f"ranks {list(range(1, n))}: SPMD_SIMULATE_NODES unset" in msg
    assert sorted(_world().allgather(msg)) == [msg] * n  # the same error everywhere
    simulate(None)
    x = np.ones(10000, np.float32)  # and the communicator still works
    np.testing.assert_array_equal(mpi.allreduce(x, ranks, "sum"), x * n)
