"""Point-to-point moves through shared outboxes (spmd.collectives.mpi.p2p) across real
processes: a ``ppermute`` between ranks of one node.

Runs on 4 ranks (``make test``), again with ``SPMD_SIMULATE_NODES=2`` (no channel for
a group across the simulated nodes: MPI's calls, the same values) and on 2 ranks.
Every message's values differ (its round, its sender), so a message read from a slot
before its writer finished, read twice, or taken for another shows as a wrong
number.  Ranks sleep at random between calls, so a sender runs ahead of its reader
or behind it.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
from spmd import P  # noqa: E402
from tests.mpi import all_ranks, on_one_node, world  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


@pytest.fixture
def fresh_p2p(monkeypatch):
    """Every rank starts and ends the test with no channel and the default range."""
    from spmd.collectives import mpi
    from spmd.collectives.mpi import p2p as mpi_p2p, shm as mpi_shm

    world().Barrier()
    mpi_p2p.reset()
    # The outboxes are tested whatever the cores (CI's 4 ranks share 2, where they
    # would otherwise keep to MPI: test_members_that_outnumber_their_cores_...).
    monkeypatch.setattr(mpi_p2p, "_cores", lambda: frozenset(range(4096)))
    slot = mpi_shm.size_range()[1]
    if not all(world().allgather(mpi_shm.has_room(world().Get_size(), slot,
                                                   mpi_p2p.SLOTS))):
        pytest.skip("/dev/shm has no room for the outboxes: MPI's calls run, which the "
                    "rest of the suite tests")
    yield mpi_p2p
    monkeypatch.undo()
    mpi.settle_sends(wait=True)
    world().Barrier()
    mpi_p2p.reset()
    mpi_shm.size_range.cache_clear()


def _message(rank, it, m):
    # Distinct for every (sender, round) the tests use, exact in float32.
    return (np.arange(m) % 251).astype(np.float32) + 100_000 * rank + it


def test_ring_moves_of_every_size_are_exact_under_skew(fresh_p2p):
    """Around the ring, forward and back, blocking and started (up to ten in flight,
    more than an outbox's slots, waited for in order or reversed), sizes below the
    shared range (MPI), in it (the outboxes) and past a slot (MPI again)."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks = all_ranks()
    local = np.random.default_rng(10 + rank)
    shared = np.random.default_rng(3)
    for it in range(150):
        m = [1000, int(shared.integers(4100, 500_000)), 600_000][int(shared.choice(3, p=[.15, .7, .15]))]
        step = 1 if shared.random() < 0.5 else -1
        dst, src = (rank + step) % n, (rank - step) % n
        if local.random() < 0.3:
            time.sleep(local.random() * 2e-3)
        if shared.random() < 0.5:
            got = [mpi.sendrecv(_message(rank, it, m), ranks, dst, src)]
            want = [_message(src, it, m)]
        else:
            k = int(shared.integers(1, 11))
            started = [mpi.isendrecv(_message(rank, it + 1000 * j, m), ranks, dst, src)
                       for j in range(k)]
            order = range(k) if shared.random() < 0.5 else range(k - 1, -1, -1)
            got, want = [None] * k, [None] * k
            for j in order:
                if local.random() < 0.3:
                    time.sleep(local.random() * 1e-3)
                started[j].test()
                got[j] = started[j].wait()
                want[j] = _message(src, it + 1000 * j, m)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    chan = fresh_p2p._channels.get(ranks)
    assert (chan is not None) == on_one_node(ranks)
    if chan is not None:  # (each call sends one message and receives one)
        assert sum(chan.expected) == sum(chan.sent) and not any(chan.posted.values())
        # Both ways were taken: the outbox, and MPI when it was full (ten in flight).
        assert all(comm.allgather(chan.moved[0] > 0)) and any(comm.allgather(chan.moved[1] > 0))


def test_one_way_moves_and_members_that_only_send_or_only_receive(fresh_p2p):
    """A pipeline's pattern: member r sends to r + 1 only, the last receives only, the
    first sends only (receiving zeros); the first runs far ahead of its reader (its
    outbox fills, and the rest go by MPI)."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    dst = rank + 1 if rank + 1 < n else None
    src = rank - 1 if rank > 0 else None
    for it in range(40):
        if rank == n - 1:
            time.sleep(1e-3)  # a slow reader
        got = mpi.sendrecv(_message(rank, it, 50_000), all_ranks(), dst, src)
        want = np.zeros(50_000, np.float32) if src is None else _message(src, it, 50_000)
        np.testing.assert_array_equal(got, want)


def test_ranks_that_disagree_on_a_shape_get_an_error_not_some_bytes(fresh_p2p):
    """Each member sends its own size (all in the shared range): each receiver finds
    a message of another length than it expects, and raises, naming both lengths;
    the channel then carries the next move right."""
    from spmd.collectives import mpi
    from spmd.errors import ProgramMismatchError

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks = all_ranks()
    if fresh_p2p.channel_for(ranks, mpi.communicator(ranks), 40_000 * 4) is None:
        pytest.skip("the ranks share no node here: MPI's calls (their own errors)")
    m = 40_000 + 1000 * rank
    with pytest.raises(ProgramMismatchError, match=r"expected \d+ bytes from member \d+ "
                                                   r"of its group and got \d+"):
        mpi.sendrecv(_message(rank, 0, m), ranks, (rank + 1) % n, (rank - 1) % n)
    got = mpi.sendrecv(_message(rank, 1, 40_000), ranks, (rank + 1) % n, (rank - 1) % n)
    np.testing.assert_array_equal(got, _message((rank - 1) % n, 1, 40_000))


def test_a_receive_never_waited_for_takes_its_own_message(fresh_p2p):
    """A started move dropped without its wait (its program raised in between) still
    takes the message sent for it, as an MPI receive would: the next move gets the
    next message, not the dropped one's."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks, dst, src = all_ranks(), (rank + 1) % n, (rank - 1) % n
    dropped = mpi.isendrecv(_message(rank, 1, 30_000), ranks, dst, src)
    del dropped
    got = mpi.sendrecv(_message(rank, 2, 30_000), ranks, dst, src)
    np.testing.assert_array_equal(got, _message(src, 2, 30_000))


def test_the_channel_is_off_with_the_shared_path_and_the_values_stay(fresh_p2p, monkeypatch):
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks = all_ranks()
    monkeypatch.setenv("SPMD_MPI_SHM_MAX_BYTES", "0")
    from spmd.collectives.mpi import shm as mpi_shm

    mpi_shm.size_range.cache_clear()
    got = mpi.sendrecv(_message(rank, 5, 30_000), ranks, (rank + 1) % n, (rank - 1) % n)
    np.testing.assert_array_equal(got, _message((rank - 1) % n, 5, 30_000))
    assert ranks not in fresh_p2p._channels


def test_members_that_outnumber_their_cores_keep_to_mpi(fresh_p2p, monkeypatch):
    """Members whose affinity masks together hold fewer cores than there are members
    make no window (every member alike: one more than the cores here) and move their
    messages by MPI, the same values."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks = all_ranks()
    monkeypatch.setattr(fresh_p2p, "_cores", lambda: frozenset(range(n - 1)))
    for it in range(3):
        got = mpi.sendrecv(_message(rank, it, 30_000), ranks, (rank + 1) % n,
                           (rank - 1) % n)
        np.testing.assert_array_equal(got, _message((rank - 1) % n, it, 30_000))
    assert fresh_p2p._channels[ranks] is None
    assert all(comm.allgather(fresh_p2p._channels[ranks] is None))


def test_members_whose_masks_differ_agree_on_their_union(fresh_p2p, monkeypatch):
    """Each member may run on another core (one each, as a launcher that pins them
    gives): together they have a core each, so every member makes the window and the
    moves go through the outboxes, the same values."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks = all_ranks()
    monkeypatch.setattr(fresh_p2p, "_cores", lambda: frozenset({rank}))
    got = mpi.sendrecv(_message(rank, 0, 30_000), ranks, (rank + 1) % n, (rank - 1) % n)
    np.testing.assert_array_equal(got, _message((rank - 1) % n, 0, 30_000))
    made = fresh_p2p._channels[ranks] is not None
    assert made == on_one_node(ranks)
    assert len(set(comm.allgather(made))) == 1


def test_a_jitted_ring_shift_in_a_shard_map_matches_numpy(fresh_p2p):
    """The way programs use it: a ``ppermute`` in a jitted ``shard_map`` (started early
    and waited for late by the overlap pass), many steps, each block different."""
    comm = world()
    n = comm.Get_size()
    mesh = spmd.make_mesh((n,), ("i",))
    perm = [(i, (i + 1) % n) for i in range(n)]

    @spmd.jit
    def shift(x):
        return spmd.shard_map(lambda b: spmd.lax.ppermute(b * 2.0, "i", perm) + 1.0,
                              mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)

    for it in range(8):
        full = (np.arange(n * 64 * 300, dtype=np.float32).reshape(n * 64, 300) % 113) + it
        x = spmd.device_put(full, spmd.NamedSharding(mesh, P("i")))
        got = np.asarray(spmd.process_allgather(shift(x)))
        want = np.roll(full.reshape(n, 64, 300) * 2.0, 1, axis=0).reshape(n * 64, 300) + 1.0
        np.testing.assert_array_equal(got, want)


def test_a_sender_returns_before_its_receiver_posts(fresh_p2p, monkeypatch):
    """Rank 0 sends six messages of 1 MiB to rank 1 (four fill its outbox, two go by MPI
    from copies) and reaches a barrier that rank 1 passes before it receives any: a
    sender that waited for its reader would never get there.  Rank 0 overwrites each
    buffer right after its send; rank 1 gets what was sent, in order."""
    from mpi4py import MPI

    from spmd.collectives import mpi
    from spmd.collectives.mpi import control as mpi_control

    comm = MPI.COMM_WORLD
    rank, pair = comm.Get_rank(), (0, 1)
    # Point-to-point between two ranks: the checking mode (lockstep by design) off.
    monkeypatch.setattr(mpi_control, "_check", [False])
    chan = None
    if rank in pair:  # the pair's channel, made by both (collectively), first
        chan = fresh_p2p.channel_for(pair, mpi.communicator(pair), 1 << 20)
    sent = [_message(0, k, 1 << 18) for k in range(6)]
    if rank == 0:
        for x in sent:
            mpi.sendrecv(x, pair, 1, None)
            x[:] = -1.0
        comm.Barrier()
    elif rank == 1:
        comm.Barrier()
        for k in range(6):
            got = mpi.sendrecv(np.zeros(1 << 18, np.float32), pair, None, 0)
            np.testing.assert_array_equal(got, _message(0, k, 1 << 18))
    else:
        comm.Barrier()
    if rank == 0 and chan is not None:
        assert chan.moved == [fresh_p2p.SLOTS, 6 - fresh_p2p.SLOTS]
    mpi.settle_sends(wait=True)
    comm.Barrier()


def test_a_received_buffer_is_reused_only_once_nothing_refers_to_it(fresh_p2p):
    """Messages are received into pooled buffers (fresh pages cost their faults on every
    move): a result still held, or a view of one, keeps its buffer; a dropped one's
    buffer takes the next message."""
    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks, dst, src = all_ranks(), (rank + 1) % n, (rank - 1) % n
    m = 70_003  # in the outboxes' range and the pool's (a size no other test receives)
    a = mpi.sendrecv(_message(rank, 1, m), ranks, dst, src)
    b = mpi.sendrecv(_message(rank, 2, m), ranks, dst, src)
    view = b[10:20]
    del b
    c = mpi.sendrecv(_message(rank, 3, m), ranks, dst, src)
    assert not np.shares_memory(a, c) and not np.shares_memory(view, c)
    np.testing.assert_array_equal(a, _message(src, 1, m))
    np.testing.assert_array_equal(view, _message(src, 2, m)[10:20])
    np.testing.assert_array_equal(c, _message(src, 3, m))
    where = a.__array_interface__["data"][0]
    del a
    d = mpi.sendrecv(_message(rank, 4, m), ranks, dst, src)
    assert d.__array_interface__["data"][0] == where  # a's buffer, now free
    np.testing.assert_array_equal(d, _message(src, 4, m))
    np.testing.assert_array_equal(view, _message(src, 2, m)[10:20])


def test_a_started_move_tested_from_another_thread_meanwhile(fresh_p2p):
    """A started move's ``test()`` runs outside any collective (between a program's
    equations): here a second thread tests it without pause while the main thread
    makes fifty blocking moves over the same group.  Every value is right."""
    import threading

    from spmd.collectives import mpi

    comm = world()
    n, rank = comm.Get_size(), comm.Get_rank()
    ranks, dst, src = all_ranks(), (rank + 1) % n, (rank - 1) % n
    started = mpi.isendrecv(_message(rank, 0, 30_000), ranks, dst, src)
    stop = threading.Event()
    errors = []

    def poke():
        try:
            while not stop.is_set():
                started.test()
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    t = threading.Thread(target=poke, name="poke")
    t.start()
    try:
        for it in range(1, 51):
            got = mpi.sendrecv(_message(rank, it, 30_000), ranks, dst, src)
            np.testing.assert_array_equal(got, _message(src, it, 30_000))
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    np.testing.assert_array_equal(started.wait(), _message(src, 0, 30_000))
