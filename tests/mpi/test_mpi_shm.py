"""The shared-memory collectives (spmd.collectives.mpi.shm) across real processes.

Runs on 4 ranks (``make test``), once more on 4 ranks with
``SPMD_SIMULATE_NODES=2`` (its ``[2nodes]`` runs: ranks 0-1 and 2-3 on two simulated
nodes, so a communicator of all ranks gets no window and its collectives go
through MPI's calls, with the same results; groups within a node still get one),
and on 2 ranks x 2 devices (``test_hybrid_subprocess.py``).  Oracles are numpy on the global values, with
values chosen so that float sums are exact (small integers): a slot read
before its writer finished, or written again before every member read it,
shows as a wrong number, not as a tolerance question.  Ranks sleep at random
between calls, so members reach each barrier at different moments.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
from spmd import P, lax  # noqa: E402
from tests.mpi import all_ranks, on_one_node, world  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


@pytest.fixture
def fresh_shm(monkeypatch):
    """Every rank starts and ends the test with no window and the default range."""
    from spmd.collectives.mpi import shm as mpi_shm

    world().Barrier()
    mpi_shm.reset()
    slot = mpi_shm.size_range()[1]
    if not all(world().allgather(mpi_shm.has_room(world().Get_size(), slot))):
        pytest.skip(f"/dev/shm has no room for a shared window of {world().Get_size()} "
                    f"members x {2 + mpi_shm.RING} slots of {slot} bytes: spmd uses "
                    "MPI's calls here, which the rest of the suite tests")
    yield mpi_shm
    monkeypatch.undo()
    world().Barrier()
    mpi_shm.reset()


def _skew(rng):
    if rng.random() < 0.3:
        time.sleep(rng.random() * 1e-3)


def test_mixed_blocking_and_started_calls_are_exact_under_skew(fresh_shm):
    """Blocking all-reduces, all-gathers, reduce-scatters, all-to-alls and started
    all-reduces (up to six in flight, more than the ring's slots), interleaved,
    with sizes across the shared-memory range and past it (blocking sums in
    slot-sized pieces, the rest through MPI), every call's values different."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks = all_ranks()
    local = np.random.default_rng(100 + rank)      # the skew differs per rank
    shared = np.random.default_rng(7)              # the program is the same on all
    tri = n * (n + 1) // 2
    for it in range(120):
        m = int(shared.integers(1024, 60000)) * n
        if shared.random() < 0.15:  # past one slot (2 MiB): blocking sums go in pieces
            m = int(shared.integers(530_000, 900_000)) * n
        base = (np.arange(m) % 97).astype(np.float32)
        x = base * (rank + 1) + it
        _skew(local)
        kind = int(shared.integers(5))
        if kind == 0:
            got = [mpi.allreduce(x, ranks, "sum")]
            want = [base * tri + it * n]
        elif kind == 1:
            got = [mpi.allgather(x, ranks)]
            want = [np.stack([base * (r + 1) + it for r in range(n)])]
        elif kind == 2:
            got = [mpi.reduce_scatter(x.reshape(n, -1), ranks, "sum")]
            want = [(base * tri + it * n).reshape(n, -1)[rank]]
        elif kind == 3:
            got = [mpi.alltoall(x.reshape(n, -1), ranks)]
            want = [np.stack([(base * (r + 1) + it).reshape(n, -1)[rank] for r in range(n)])]
        else:
            k = int(shared.integers(1, 7))
            reqs = [mpi.iallreduce(x + j, ranks, "sum") for j in range(k)]
            got = []
            for r in reqs:
                _skew(local)
                r.test()
                got.append(r.wait())
            want = [base * tri + (it + j) * n for j in range(k)]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    seg = fresh_shm._segments.get(ranks)
    if not on_one_node(ranks):  # on two simulated nodes: all through MPI
        assert seg is None
        return
    assert seg is not None and seg.calls > 0 and seg.starts > fresh_shm.RING


def test_started_and_blocking_sums_of_mebibytes_split_the_adding(fresh_shm):
    """From 3 members and 1 MiB a sum's adding is split between the members (each
    adds 1/n, then copies the others' parts): started sums at their wait, blocking
    ones per slot-sized piece, past a slot too.  Exact values, every rank alike,
    with the ranks arriving at different times."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks = all_ranks()
    local = np.random.default_rng(300 + rank)
    tri = n * (n + 1) // 2
    for count in (262_144 + 3, 524_288, 1_000_000):  # 1 MiB (+ an uneven tail) to 3.8 MiB
        base = (np.arange(count) % 89).astype(np.float32)
        reqs = []
        for j in range(3):
            if count * 4 <= fresh_shm.size_range()[1]:  # a started sum: up to one slot
                reqs.append((j, mpi.iallreduce(base * (rank + 1) + j, ranks, "sum")))
            _skew(local)
        for j, r in reqs:
            np.testing.assert_array_equal(r.wait(), base * tri + j * n)
        _skew(local)
        np.testing.assert_array_equal(mpi.allreduce(base * (rank + 1), ranks, "sum"), base * tri)
    seg = fresh_shm._segments.get(ranks)
    if on_one_node(ranks):
        assert seg is not None and seg.starts >= 6 and seg.calls >= 4


@pytest.mark.parametrize("dtype", [np.float16, np.bool_, np.int32, np.complex64, np.float64])
def test_dtypes_sum_like_numpy_with_the_same_bits_on_every_rank(fresh_shm, dtype):
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(5)
    parts = rng.integers(0, 3, (n, 40000)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        parts = parts + 1j * rng.integers(0, 3, (n, 40000)).astype(np.float32)
        parts = parts.astype(dtype)
    got = mpi.allreduce(parts[rank], all_ranks(), "sum")
    assert got.dtype == np.dtype(dtype)
    want = parts.astype(np.float64 if np.dtype(dtype).kind == "f" else parts.dtype).sum(0)
    if np.dtype(dtype) == np.bool_:
        want = parts.astype(np.uint8).sum(0).astype(np.bool_)
    np.testing.assert_array_equal(got, np.asarray(want).astype(dtype))
    digest = hashlib.blake2b(np.ascontiguousarray(got).tobytes()).hexdigest()
    assert len(set(comm.allgather(digest))) == 1
    # (it took the shared path, unless the ranks are on several simulated nodes)
    assert (fresh_shm._segments.get(all_ranks()) is not None) == on_one_node(all_ranks())


def test_psum_of_a_jitted_shard_map_over_mesh_axes_matches_numpy(fresh_shm):
    """User programs: psum, all_gather, psum_scatter and all_to_all over each axis of
    a 2-D mesh (communicators of some of the ranks) and over both axes."""
    if spmd.device_count() % 2:
        pytest.skip("needs an even number of devices")
    from tests.mpi import make_mesh

    mesh = make_mesh("2d")
    na, nb = mesh.shape["a"], mesh.shape["b"]
    rng = np.random.default_rng(11)
    x = rng.integers(-4, 5, (na * nb * 8, 4096)).astype(np.float32)  # 128 KiB blocks

    def body(b):
        return (lax.psum(b, "a"), lax.psum(b, ("a", "b")),
                lax.all_gather(b, "b", tiled=True),
                lax.psum_scatter(b, "a", scatter_dimension=1, tiled=True),
                lax.all_to_all(b, "b", 1, 1, tiled=True))

    f = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P(("a", "b")),
                                out_specs=(P(("a", "b")),) * 5, check_vma=False))
    got = [np.asarray(spmd.process_allgather(v)) for v in f(x)]
    blocks = x.reshape(na, nb, 8, 4096)
    per_a = blocks.sum(0)                                           # (nb, 8, 4096)
    np.testing.assert_array_equal(got[0], np.broadcast_to(per_a, blocks.shape).reshape(x.shape))
    total = blocks.sum((0, 1))
    np.testing.assert_array_equal(got[1], np.tile(total, (na * nb, 1)))
    gathered = np.concatenate([np.concatenate(list(blocks[i]), 0) for i in range(na)
                               for _ in range(nb)], 0)
    np.testing.assert_array_equal(got[2], gathered)
    w = 4096 // na
    scat = np.concatenate([per_a[j][:, i * w:(i + 1) * w] for i in range(na)
                           for j in range(nb)], 0)
    np.testing.assert_array_equal(got[3], scat)
    v = 4096 // nb
    a2a = np.concatenate([np.concatenate([blocks[i, k][:, j * v:(j + 1) * v] for k in range(nb)], 1)
                          for i in range(na) for j in range(nb)], 0)
    np.testing.assert_array_equal(got[4], a2a)


def test_disabled_path_gives_the_same_results(fresh_shm, monkeypatch):
    from spmd.collectives import mpi

    rank = world().Get_rank()
    x = (np.arange(70000) % 13).astype(np.float32) * (rank + 1)
    on = mpi.allreduce(x, all_ranks(), "sum")
    assert (fresh_shm._segments.get(all_ranks()) is not None) == on_one_node(all_ranks())
    world().Barrier()
    fresh_shm.reset()
    monkeypatch.setenv("SPMD_MPI_SHM_MAX_BYTES", "0")
    off = mpi.allreduce(x, all_ranks(), "sum")
    assert all_ranks() not in fresh_shm._segments
    np.testing.assert_array_equal(on, off)


def test_threads_on_different_communicators_run_at_once(fresh_shm):
    """Two threads per rank, each summing over its own group of ranks (the two halves
    of the world), many times: each group's window and slots are its own."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    if n < 4:
        pytest.skip("needs 4 ranks for two groups of 2")
    evens, odds = tuple(range(0, n, 2)), tuple(range(1, n, 2))
    lows, highs = tuple(range(n // 2)), tuple(range(n // 2, n))
    mine_a = evens if rank in evens else odds
    mine_b = lows if rank in lows else highs
    mpi.communicator(mine_a), mpi.communicator(mine_b)  # made in one thread, in order
    errors = []

    def run(group, seed):
        try:
            for it in range(60):
                x = np.full(20000, it + seed, np.float32) * (rank + 1)
                got = mpi.allreduce(x, group, "sum")
                want = (it + seed) * sum(r + 1 for r in group)
                if not (got == want).all():
                    errors.append((group, it))
        except BaseException as e:  # report in the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(mine_a, 1), name="a"),
               threading.Thread(target=run, args=(mine_b, 1000), name="b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert (fresh_shm._segments.get(mine_a) is not None) == on_one_node(mine_a)
    assert (fresh_shm._segments.get(mine_b) is not None) == on_one_node(mine_b)


def _start_and_raise(x, ranks):
    from spmd.collectives import mpi

    r = mpi.iallreduce(x, ranks, "sum")  # lives in this frame, so in its traceback
    raise ValueError(f"the program raised between the start and the wait of {r!r}")


@pytest.mark.parametrize("kept_by", ["nobody", "rank 0"])
def test_started_sums_go_on_after_a_start_never_waited_for(fresh_shm, kept_by):
    """Every rank's program raised between a start and its wait and was caught; the
    request is freed at once (nobody keeps it), or kept alive on rank 0 only (its
    exception's traceback holds the frame) while the other ranks free it.  Later
    started sums wrap the ring past the dropped slot on every rank alike (from a
    review: the garbage collector once decided, rank by rank, what came next)."""
    import gc

    from spmd.collectives import mpi

    ranks, n, me = all_ranks(), world().Get_size(), world().Get_rank()
    x = np.ones(20000, np.float32)
    kept = []
    try:
        _start_and_raise(x, ranks)
    except ValueError as e:
        if kept_by == "rank 0" and me == 0:
            kept.append(e)
    gc.collect()
    for k in range(2 * fresh_shm.RING + 1):
        np.testing.assert_array_equal(mpi.iallreduce(x * (k + 1), ranks, "sum").wait(),
                                      np.full(20000, n * (k + 1), np.float32))
    kept.clear()


@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.uint16])
def test_alltoall_of_a_1d_operand_through_the_window(fresh_shm, monkeypatch, dtype):
    """x of shape (n,): element j goes to member j (from a review: the window was
    handed the operand's byte view, whose rows were single bytes)."""
    from spmd.collectives import mpi

    monkeypatch.setenv("SPMD_MPI_SHM_MIN_BYTES", "1")
    fresh_shm.size_range.cache_clear()
    n, me = world().Get_size(), world().Get_rank()
    x = (np.arange(n) + 100 * me).astype(dtype)
    got = mpi.alltoall(x, all_ranks())
    # (it took the window, unless the ranks are on several simulated nodes)
    assert (fresh_shm._segments.get(all_ranks()) is not None) == on_one_node(all_ranks())
    np.testing.assert_array_equal(got, np.array([100 * r + me for r in range(n)], dtype))


def test_a_rank_without_room_makes_every_rank_use_mpi(fresh_shm, monkeypatch):
    """The members agree before making a window: one rank short of /dev/shm space
    sends every rank through MPI's calls (no rank waits in a window call alone)."""
    from spmd.collectives import mpi

    rank = world().Get_rank()
    monkeypatch.setattr(fresh_shm, "has_room", lambda members, slot, slots=0: rank != 0)
    x = (np.arange(70000) % 13).astype(np.float32) * (rank + 1)
    got = mpi.allreduce(x, all_ranks(), "sum")
    n = world().Get_size()
    np.testing.assert_array_equal(got, (np.arange(70000) % 13) * (n * (n + 1) // 2))
    # Decided once, the same everywhere (on several nodes the sum goes through each
    # node's ranks instead and the whole group never asks for a window: None either way).
    assert fresh_shm._segments.get(all_ranks()) is None
    np.testing.assert_array_equal(mpi.allgather(x[:8192], all_ranks())[0], x[:8192] / (rank + 1))


def test_reduce_scatter_past_a_slot_narrower_than_one_column(fresh_shm, monkeypatch):
    """A slot smaller than one column of every row (members x itemsize): each piece
    of the reduce-scatter past a slot is still one column of n elements, which must
    not spill past the slot into the next one (the other blocking slot, which other
    members may still be reading, or the ring).  From review-shm2: with a 64-byte
    slot, 3 members and clongdouble (96-byte columns) row 2 was written into the
    next slot and member 2 read the next piece's row 0 instead (every call wrong)."""
    from spmd.collectives import mpi

    n, me = world().Get_size(), world().Get_rank()
    dtype = np.dtype(np.clongdouble)
    if n * dtype.itemsize <= 64:
        pytest.skip(f"a column of {n} x {dtype.itemsize} B fits the smallest slot (64 B)")
    monkeypatch.setenv("SPMD_MPI_SHM_MAX_BYTES", "1")   # slot: 64 bytes
    monkeypatch.setenv("SPMD_MPI_SHM_MIN_BYTES", "1")
    fresh_shm.size_range.cache_clear()
    rng = np.random.default_rng(me)
    ranks = all_ranks()

    def x(r, it):
        return (np.arange(n * 7).reshape(n, 7) + 100 * r + it).astype(dtype)

    wrong = 0
    for it in range(30):
        _skew(rng)
        got = mpi.reduce_scatter(x(me, it), ranks, "sum")
        wrong += not np.array_equal(got, sum(x(r, it) for r in range(n))[me])
    # (checked together: a rank failing alone would leave the others in the teardown)
    assert world().allgather(wrong) == [0] * n


@pytest.mark.parametrize("rank0_reads", ["32768", "lots"])
def test_ranks_that_read_different_settings_all_raise(fresh_shm, monkeypatch, rank0_reads):
    """Members that would choose differently between the window and MPI's calls (one
    rank's environment differs, or is invalid) are stopped, on every rank alike, when
    their communicator is made -- not left pairing a barrier with an all-reduce."""
    from spmd.collectives import mpi
    from spmd.collectives.mpi.control import control
    from spmd.errors import ArgumentError

    if world().Get_rank() == 0:
        monkeypatch.setenv("SPMD_MPI_SHM_MIN_BYTES", rank0_reads)
    fresh_shm.size_range.cache_clear()
    want = (r"rank 0: \(min, slot\) = \(32768" if rank0_reads == "32768"
            else "rank 0: SPMD_MPI_SHM_MIN_BYTES='lots' is not a number of bytes")
    with pytest.raises(ArgumentError, match=want):
        mpi.communicators._agree_settings(all_ranks(), control(all_ranks()))
