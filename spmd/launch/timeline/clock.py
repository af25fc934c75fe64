"""The ranks' clocks on one scale: an offset per rank, measured by ping-pong with rank 0.

Each process records ``time.monotonic()`` (plus a test skew), a clock whose zero
differs from process to process and from host to host.  At start-up the ranks
measure, for each rank, its clock minus rank 0's (the *offset*), and the merge
subtracts it (:mod:`spmd.launch.timeline.merge`).

For each other rank in turn, rank 0 sends its clock's reading ``t_send``, the peer
answers with its own reading ``t_peer`` at once, and rank 0 notes when the answer
came, ``t_recv``.  The peer read its clock somewhere between ``t_send`` and
``t_recv``, so ``offset = t_peer - (t_send + t_recv) / 2`` is off by at most half
the round trip, the *error* bound.  Of several rounds the one with the shortest
round trip is kept (a round delayed by the scheduler only widens its own bound).
Rank 0 then tells every peer its result, which each stores in its recording
(:meth:`spmd.launch.timeline.recorder.Recorder.aligned`): the trace says how well
its ranks were aligned.

Ranks wait for their turn without spinning (MPICH busy-polls in a blocking
receive; on a machine with fewer cores than ranks, waiting ranks would take the
core the exchanging pair needs and lengthen its round trips).
"""

from __future__ import annotations

import time
from array import array

from spmd.launch.timeline import recorder

ROUNDS = 30   # ping-pong rounds per rank
_TAG = 23     # (a Dup of the world communicator: no user message shares it)
_IDLE_S = 0.0005


def align(comm, rounds: int = ROUNDS, now=None) -> tuple[float, float]:
    """Measure this rank's clock minus rank 0's over ``comm`` (collective over it):
    ``(offset_s, error_s)``, rank 0's being ``(0.0, 0.0)``.  ``now``: the clock to
    align (default: the active recording's :meth:`~recorder.Recorder.now`, which
    includes its test skew); the result is stored in the active recording.

    >>> from spmd.launch.mpi_init import world
    >>> offset, error = align(world().Dup())                    # doctest: +SKIP
    """
    if rounds < 1:
        raise ValueError(f"align: rounds={rounds!r} must be at least 1 (e.g. {ROUNDS})")
    rec = recorder.ACTIVE
    if now is None:
        if rec is None:
            raise RuntimeError("align: no trace is being recorded in this process, and no "
                               "clock was given (start one with recorder.start, or pass now=)")
        now = rec.now
    me, n = comm.Get_rank(), comm.Get_size()
    if me == 0:
        results = [array("d", _measure(comm, peer, rounds, now)) for peer in range(1, n)]
        for peer in range(1, n):
            comm.Send(results[peer - 1], dest=peer, tag=_TAG)
        offset, error = 0.0, 0.0
    else:
        _answer(comm, rounds, now)
        mine = array("d", (0.0, 0.0))
        _wait(comm.Irecv(mine, source=0, tag=_TAG))
        offset, error = float(mine[0]), float(mine[1])
    if rec is not None:
        rec.aligned(offset, error)
    return offset, error


def _measure(comm, peer: int, rounds: int, now) -> tuple[float, float]:
    """Rank 0's side with ``peer``: (offset, error) of the round with the shortest trip."""
    ping, pong = array("d", (0.0,)), array("d", (0.0,))
    best = (0.0, float("inf"))
    for _ in range(rounds):
        ping[0] = t_send = now()
        comm.Send(ping, dest=peer, tag=_TAG)
        comm.Recv(pong, source=peer, tag=_TAG)
        t_recv = now()
        half_trip = (t_recv - t_send) / 2
        if half_trip < best[1]:
            best = (float(pong[0]) - (t_send + t_recv) / 2, half_trip)
    return best


def _answer(comm, rounds: int, now) -> None:
    """A peer's side: answer each of rank 0's pings with this clock's reading."""
    ping, pong = array("d", (0.0,)), array("d", (0.0,))
    _wait(comm.Irecv(ping, source=0, tag=_TAG))  # (its turn may come late)
    for k in range(rounds):
        if k:
            comm.Recv(ping, source=0, tag=_TAG)
        pong[0] = now()
        comm.Send(pong, dest=0, tag=_TAG)


def _wait(request) -> None:
    """Complete ``request`` without holding a core."""
    while not request.Test():
        time.sleep(_IDLE_S)
