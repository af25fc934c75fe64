"""Shared-memory collectives for communicators whose members share one node.

MPI's all-reduce on one node moves each operand through the library's
shared-memory cells in several copies; for mid-sized operands that costs more
than the arithmetic.  When every member of a communicator is on the same node,
this module gives the communicator an MPI-3 shared window (``Win.Allocate_shared``)
with two slots per member, and a sum becomes:

1. copy the operand into this member's current slot;
2. ``Win.Sync``, ``Barrier``, ``Win.Sync`` (every member's copy is visible);
3. add the members' slots, in member order, into the receive buffer.

Every member adds in the same order, so the result has the same bits on every
member.  The slots alternate between calls: a member writes a slot again only
two calls later, after the next call's barrier, which every member enters only
once it has read the slot -- so one barrier per call is enough.

The same slots serve the other blocking collectives: an all-gather, a
reduce-scatter (sum) and an all-to-all each copy their operand in, pass the
barrier, and read what they need from every member's slot.

Measured against the mpich wheel's calls on 2 ranks, float32, hot loops, per
member operand (2026-12-02; 4 ranks oversubscribing 2 cores gave the same picture):

- all-reduce: 6.0 against 10.8 us at 16 KiB, 19 against 42 us at 256 KiB
  (``Allreduce`` or reduce-scatter + all-gather, the faster), 172 against 280 us
  at 2 MiB; slower at 4-8 KiB (6.1 against 4.2 us), where the barrier costs more
  than MPI's whole call;
- reduce-scatter: 6.9 against 8.5 us at 16 KiB, 65 against 127 us at 1 MiB,
  119 against 246 us at 2 MiB;
- all-gather: 6.7 against 7.8 us at 16 KiB, 22 against 35 us at 256 KiB, 108
  against 149 us at 1 MiB, but 247 against 182 us at 2 MiB;
- all-to-all: 6.5 against 9.8 us at 16 KiB, even from 256 KiB (19 against 20 us).

- all-reduce past a slot, in 2 MiB pieces (one barrier each), against the
  reduce-scatter + all-gather that MPI does fastest there: 0.46 against 0.72 ms at
  4 MiB, 4.6 against 8.0 ms at 32 MiB (2 ranks); 2.3 against 2.5 ms and 16.3
  against 17.7 ms on 4 ranks oversubscribing 2 cores.

With 3 or more members, a piece of 1 MiB or more is added in two phases: each
member adds its own 1/n of the elements and publishes it in its slot, and after
a second barrier copies the others' parts (every element is still added in
member order: the same bits).  On 4 ranks (oversubscribing 2 cores) that made
32 MiB 16.9 ms against 23.8 ms with every member adding everything, a little
slower than MPI's reduce-scatter + all-gather (14.6 ms); at 256 KiB the
one-barrier sum was faster (0.11 against 0.14 ms), at 2 MiB the two were even
(and 1.6x faster than MPI).  Where each rank has a core, MPI is far behind: on 12
ranks of a 13-core machine the transformer's 3.1 MiB gradient took 30 ms through
MPI's calls (``benchmarks/scaling_probe.py``) against 0.9 ms through these slots
on 2 ranks.  So past a slot a sum goes through here in pieces whatever the
member count (an oversubscribed machine pays the ~15% above at 32 MiB).  A
started sum adds the same way at its wait (two phases from 3 members and 1 MiB).

So blocking sums take this path from 16 KiB up (in pieces past a slot),
reduce-scatters from 16 KiB up (in pieces of every row's columns past a slot:
each member reads only its own row), started sums from 16 KiB to a slot (2 MiB),
moves (all-gather, all-to-all) from 16 KiB to half a slot.

A started sum (the overlap pass's ``collective_start``) copies its operand into
one of a ring of ``RING`` further slots and starts an ``Ibarrier``; its wait
completes the barrier, adds, and starts a second ``Ibarrier`` that releases the
slot: the slot is written again only after that release has completed, i.e.
after every member has read it.  The segment keeps each slot's last sum: when
the slot comes round again with that sum not waited for (more in flight than
slots, or a program that raised between a start and its wait), the start
finishes it first -- on every member at the same start, whatever references
the caller kept.

Which operands take this path is decided from what every member knows alike
(the size, the operation, the communicator), and the window is made at the same
point of the program on every member (the first call in range, after all members
agree that they share the node and have room in /dev/shm), so all members always
take the same path.  The node is MPI's (``Split_type(COMM_TYPE_SHARED)``), split
further by ``SPMD_SIMULATE_NODES`` (a test setting: :mod:`spmd.launch.nodes`), so
that a job on one machine takes the multi-node path for communicators across
simulated nodes.  Reductions here are sums only: MPI's ``MAX``/``MIN`` and
numpy's differ on NaN.  ``SPMD_MPI_SHM_MIN_BYTES`` sets the smallest
operand, ``SPMD_MPI_SHM_MAX_BYTES`` the slot (``0`` turns the path off).  The window holds
``2 + RING`` slots of the maximum per member (12 MiB by default), made once per
communicator that uses it.
"""

from __future__ import annotations

import atexit
import functools
import os

import numpy as np
from spmd.collectives.mpi.control import complete_within, control as control_comm
# (The settings are read in their own module; named here too, as the window's.)
from spmd.collectives.mpi.settings import SHM_MAX_BYTES, SHM_MIN_BYTES, size_range  # noqa: F401
from spmd.launch import nodes

RING = 4                         # slots for started sums (in flight at once, per member)
SPLIT_MEMBERS = 3                # from this many members and ...
SPLIT_BYTES = 1024 * 1024        # ... a piece this big, a sum splits the adding (two barriers)
_SHM_RESERVE = 0.5               # never take more than this share of /dev/shm's free space


@functools.lru_cache(maxsize=256)
def part_bounds(size: int, parts: int) -> tuple:
    """Where each of ``parts`` near-equal parts of ``size`` elements starts (and, last,
    the end): the parts of a two-phase sum, the same on every member and every node
    for the same ``size``.

    >>> part_bounds(10, 4)
    (0, 2, 5, 7, 10)
    """
    return tuple(size * i // parts for i in range(parts + 1))


class Segment:
    """One communicator's shared window: per member, two slots for blocking sums and
    a ring of ``RING`` slots for started ones, each of ``slot`` bytes."""

    def __init__(self, comm, slot: int):
        from mpi4py import MPI

        self.comm, self.slot, self.n, self.me = comm, slot, comm.Get_size(), comm.Get_rank()
        self.win = MPI.Win.Allocate_shared((2 + RING) * slot, 1, comm=comm)
        # A passive epoch on all members for the window's life: Win.Sync needs one.
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.bases = [np.frombuffer(self.win.Shared_query(r)[0], np.uint8)
                      for r in range(self.n)]
        self.bases[self.me][:] = 0  # fault the pages in now, not inside a timed call
        self.calls = 0                  # blocking sums so far (their slot alternates)
        self.starts = 0                 # started sums so far (their ring slot)
        self.release = [None] * RING    # per ring slot: the barrier after its last reads
        self.occupant = [None] * RING   # per ring slot: the started sum last put there
        self._views: dict = {}

    def _slot_views(self, which: int, shape: tuple, dtype) -> list:
        key = (which, shape, dtype)
        views = self._views.get(key)
        if views is None:
            if len(self._views) > 256:  # many shapes over time: keep it bounded
                self._views.clear()
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            lo = which * self.slot
            views = [b[lo:lo + nbytes].view(dtype).reshape(shape) for b in self.bases]
            self._views[key] = views
        return views

    def _reduce(self, views: list, out: np.ndarray) -> None:
        np.add(views[0], views[1], out=out)
        for v in views[2:]:
            np.add(out, v, out=out)

    def _exchange(self, buf: np.ndarray, skip_row: int | None = None,
                  skip: tuple | None = None) -> list:
        """Copy ``buf`` into this member's next blocking slot (but for its row
        ``skip_row``, or the elements ``skip[0]:skip[1]`` of a flat ``buf``, which no
        other member reads); once every member has, return every member's slot (as
        arrays like ``buf``) to read."""
        which = self.calls & 1
        self.calls += 1
        views = self._slot_views(which, buf.shape, buf.dtype)
        mine = views[self.me]
        if skip is not None:
            a, b = skip
            np.copyto(mine[:a], buf[:a])
            np.copyto(mine[b:], buf[b:])
        elif skip_row is None:
            np.copyto(mine, buf)
        else:
            if skip_row:
                np.copyto(mine[:skip_row], buf[:skip_row])
            np.copyto(mine[skip_row + 1:], buf[skip_row + 1:])
        win = self.win
        win.Sync()
        self.comm.Barrier()
        win.Sync()
        return views

    def allreduce_sum(self, buf: np.ndarray, out: np.ndarray, across=None) -> None:
        """``out`` = the sum over members of their ``buf`` (C-contiguous, same shape and
        dtype on every member), added in member order; an operand larger than a slot
        goes through in slot-sized pieces.

        ``across``: a function that turns a contiguous part of the node's sum, in
        place, into the sum over every node (:mod:`spmd.collectives.mpi.hier`'s step
        between nodes).  With it each member adds its own part of every piece, passes
        that part to ``across``, and then publishes it (the two-phase adding below):
        the node's reduce-scatter, the step across nodes and the node's all-gather in
        one exchange of the window."""
        flat, dst = buf.reshape(-1), out.reshape(-1)
        step = self.slot // buf.dtype.itemsize
        for lo in range(0, flat.size, step):
            self._sum_piece(flat[lo:lo + step], dst[lo:lo + step], across)

    def _sum_piece(self, buf: np.ndarray, out: np.ndarray, across) -> None:
        """One slot's worth of :meth:`allreduce_sum` (``buf`` and ``out`` flat)."""
        if across is None and (self.n < SPLIT_MEMBERS or out.nbytes < SPLIT_BYTES):
            self._reduce(self._exchange(buf), out)  # every member adds everything
            return
        # Two phases: this member's own part is added straight from ``buf`` (no other
        # member reads it from the slot before the second barrier, which publishes the
        # sum there).
        bounds = part_bounds(buf.size, self.n)
        a, b = bounds[self.me], bounds[self.me + 1]
        views = self._exchange(buf, skip=(a, b))
        parts = [v[a:b] for v in views]
        parts[self.me] = buf[a:b]
        self._reduce(parts, out[a:b])
        if across is not None:
            across(out[a:b])
        self._publish(views, out, bounds)

    def _add_slots(self, views: list, out: np.ndarray) -> None:
        """``out`` = the sum of every member's slot ``views`` (each member's copy is
        visible), added in member order: a started sum's adding."""
        if self.n < SPLIT_MEMBERS or out.nbytes < SPLIT_BYTES:
            self._reduce(views, out)  # every member adds everything: no second barrier
            return
        flat, dst = [v.reshape(-1) for v in views], out.reshape(-1)
        bounds = part_bounds(dst.size, self.n)
        a, b = bounds[self.me], bounds[self.me + 1]
        self._reduce([f[a:b] for f in flat], dst[a:b])
        self._publish(flat, dst, bounds)

    def _publish(self, flat: list, dst: np.ndarray, bounds: tuple) -> None:
        """The second phase of a two-phase sum: this member's part of ``dst`` (flat)
        into its own slot ``flat[me]`` -- which only it reads there -- and, after a
        barrier, every other member's part from theirs.

        Each member adds its own 1/n of the elements (reading n pieces of 1/n, not n
        whole slots); each element is still added in member order, so the bits are
        those of every member adding everything.  With n members that is n times less
        to read: on 12 ranks of a 13-core machine, every member adding every 2 MiB slot
        of a gradient bucket read 24 MiB per member per bucket, and the twelve together
        ran into the machine's memory bandwidth."""
        me = self.me
        a, b = bounds[me], bounds[me + 1]
        np.copyto(flat[me][a:b], dst[a:b])
        win = self.win
        win.Sync()
        self.comm.Barrier()
        win.Sync()
        for r in range(self.n):
            if r != me:
                np.copyto(dst[bounds[r]:bounds[r + 1]], flat[r][bounds[r]:bounds[r + 1]])

    def allgather(self, buf: np.ndarray, out: np.ndarray) -> None:
        """``out[r]`` = member r's ``buf``."""
        for r, v in enumerate(self._exchange(buf)):
            out[r] = v

    def reduce_scatter_sum(self, buf: np.ndarray, out: np.ndarray) -> None:
        """``out`` = the sum over members of row ``me`` of their ``buf`` (leading axis:
        the members), added in member order; an operand larger than a slot goes
        through in pieces of every row's columns (each member still reads only its
        own row of every slot, so pieces cost no more than one whole exchange)."""
        me = self.me
        if buf.nbytes <= self.slot:
            self._reduce([v[me] for v in self._exchange(buf)], out)
            return
        rows, dst = buf.reshape(self.n, -1), out.reshape(-1)
        step = max(1, self.slot // (self.n * buf.dtype.itemsize))
        for lo in range(0, rows.shape[1], step):
            views = self._exchange(rows[:, lo:lo + step])
            self._reduce([v[me] for v in views], dst[lo:lo + step])

    def alltoall(self, buf: np.ndarray, out: np.ndarray) -> None:
        """``out[r]`` = row ``me`` of member r's ``buf`` (leading axis: the members).
        This member's own row goes straight from ``buf`` to ``out``."""
        me = self.me
        views = self._exchange(buf, skip_row=me)
        for r, v in enumerate(views):
            out[r] = buf[me] if r == me else v[me]

    def pending(self) -> list:
        """This window's MPI requests not completed yet: the entry barriers of started
        sums never waited for, and the releases."""
        return ([s.req for s in self.occupant if s is not None and not s.done]
                + [r for r in self.release if r is not None])

    def settle(self) -> None:
        """Forget the releases that have completed (MPI also warns at exit about
        requests never completed)."""
        rel = self.release
        for j, r in enumerate(rel):
            if r is not None and r.Test():
                rel[j] = None

    def start_sum(self, buf: np.ndarray, out: np.ndarray) -> "Started":
        """Copy ``buf`` into the next ring slot and start the barrier after which every
        member's copy is readable; :meth:`Started.Wait` adds them into ``out``.

        A ring slot is written again only once the barrier its previous sum started
        after its reads has completed: every member has read it."""
        i = self.starts % RING
        self.starts += 1
        prev = self.occupant[i]
        if prev is not None and not prev.done:
            # More sums in flight than slots, or one never waited for (its program
            # raised between the start and the wait): finish it now.  The segment
            # holds it, whatever the caller's references, so every member finishes
            # it here, at the same start -- not when its garbage collector runs.
            prev.Wait()
        pending = self.release[i]
        if pending is not None:
            pending.Wait()
            self.release[i] = None
        views = self._slot_views(2 + i, buf.shape, buf.dtype)
        np.copyto(views[self.me], buf)
        self.win.Sync()
        started = self.occupant[i] = Started(self, i, self.comm.Ibarrier(), views, out)
        return started


class Started:
    """A started shared-memory sum, with an MPI request's ``Test``/``Wait``: ``Test()``
    moves its barrier on, ``Wait()`` finishes it (``out`` then holds the sum)."""

    __slots__ = ("seg", "i", "req", "views", "out", "done")

    def __init__(self, seg: Segment, i: int, req, views: list, out: np.ndarray):
        self.seg, self.i, self.req, self.views, self.out = seg, i, req, views, out
        self.done = False

    def Test(self) -> bool:  # noqa: N802  (an MPI request's name)
        return self.req.Test()

    def Wait(self) -> None:  # noqa: N802  (again: nothing; see Segment.start_sum)
        if self.done:
            return
        seg = self.seg
        if seg is None:
            raise RuntimeError("this started all-reduce's shared window was freed by "
                               "spmd.collectives.mpi.shm.reset() before its wait")
        self.req.Wait()
        seg.win.Sync()
        seg._add_slots(self.views, self.out)
        seg.release[self.i] = seg.comm.Ibarrier()
        self.done = True
        self.views = self.out = None  # the slot's occupant must not pin the result
        seg.settle()



_segments: dict = {}   # ranks -> Segment, or None where the members do not share a node


# The largest operand of each use, in slots (a slot holds SPMD_MPI_SHM_MAX_BYTES):
# a blocking all-reduce or reduce-scatter goes through in slot-sized pieces, so
# any size; a started all-reduce needs its whole operand in one slot; the moves
# are faster through MPI above half a slot (see the module docstring).
_MOST = {"allreduce": float("inf"), "started": 1.0, "reduce_scatter": float("inf"),
         "move": 0.5}


def segment_for(ranks: tuple, comm, nbytes: int, use: str):
    """The :class:`Segment` for an operand of ``nbytes`` per member over ``comm``, or
    None (MPI's own call).  ``use``: ``"allreduce"``, ``"started"`` (an all-reduce
    started without waiting), ``"reduce_scatter"`` (sums only, as the all-reduces:
    the caller checks the operation) or ``"move"`` (all-gather, all-to-all).  The
    first call for a communicator is collective over its members (it makes the
    window); every member calls it with the same arguments at the same point."""
    if len(ranks) < 2 or nbytes == 0:
        return None
    lo, hi = size_range()
    if hi == 0 or not lo <= nbytes <= hi * _MOST[use]:
        return None
    seg = _segments.get(ranks, False)
    if seg is False:
        # At least 64 bytes per member: a reduce-scatter's piece is at least one
        # column of every row (members x itemsize, up to 32 bytes), and a piece must
        # never spill into the next slot.
        slot = max(-(-hi // 64), len(ranks)) * 64
        seg = _segments[ranks] = _make(comm, control_comm(ranks), slot, ranks)
    return seg


def has_room(members: int, slot: int, slots: int = 2 + RING) -> bool:
    """Whether /dev/shm (where MPI puts shared windows) has room for a window of
    ``members`` members with ``slots`` slots of ``slot`` bytes each (this module's
    window by default), within a share of its free space (a container's default
    64 MiB /dev/shm may not: then MPI's calls run)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return False
    return st.f_bavail * st.f_frsize * _SHM_RESERVE >= slots * slot * members


def shared_by_all(comm, control, ranks: tuple, slot: int, slots: int) -> bool:
    """Whether every member of ``comm`` shares this node (real and, with
    ``SPMD_SIMULATE_NODES``, simulated: :mod:`spmd.launch.nodes`) and has room in
    /dev/shm for a window of ``slots`` slots of ``slot`` bytes per member.  Agreed by
    all members (a member alone deciding otherwise would leave the others waiting
    in another call); collective over them.  Also :mod:`spmd.collectives.mpi.p2p`'s."""
    from mpi4py import MPI

    # The members first agree on the simulated nodes (every one raises alike when
    # they differ): a member raising alone inside the split would strand the others.
    nodes.check_agreed(control.allgather(nodes.reading()), ranks)
    node = nodes.split_by_node(comm)
    same_node = node.Get_size() == comm.Get_size()
    node.Free()
    room = has_room(comm.Get_size(), slot, slots)
    return bool(control.allreduce(bool(same_node and room), op=MPI.LAND))


def _make(comm, control, slot: int, ranks: tuple):
    """A window of ``slot``-byte slots where the members share a node and have room
    (:func:`shared_by_all`); else None."""
    if not shared_by_all(comm, control, ranks, slot, 2 + RING):
        return None
    if not _segments_made:
        atexit.register(_settle_at_exit)
        _segments_made.append(True)
    return Segment(comm, slot)


_segments_made: list = []


def _settle_at_exit(limit_s: float = 5.0) -> None:
    """Complete the windows' last barriers before MPI finalises (it runs after this)."""
    complete_within([r for seg in _segments.values() if seg is not None
                     for r in seg.pending()], limit_s)


def reset() -> None:
    """Forget the windows and read the size range again (tests; every member calls it
    at the same point)."""
    from mpi4py import MPI

    for seg in _segments.values():
        if seg is not None:
            unfinished = [s for s in seg.occupant if s is not None and not s.done]
            MPI.Request.Waitall(seg.pending())
            for s in unfinished:  # their wait now raises instead of reading a freed window
                s.seg = s.views = s.out = None
            seg.win.Unlock_all()
            seg.win.Free()
    _segments.clear()
    size_range.cache_clear()
