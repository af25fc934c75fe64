"""Point-to-point moves through shared memory: a ``ppermute`` between ranks of one node.

With the mpich wheel, a mid-sized message between two processes of one node goes
through the library's shared cells in pieces, and moves only while both processes
are inside MPI calls (the wheel has no progress thread): a pipeline stage waiting
for its neighbour's activation waits for the neighbour's next MPI call, and each
side pays MPI's copies and matching.  Here a move is one copy in by the sender and
one copy out by the receiver, and neither waits for the other to be anywhere.
Measured (2 ranks, 256 KiB, float32, a hot loop): a move by hand 16 us against 58
us through ``Isend``/``Recv``; a jitted ``ppermute`` 31 us against 62-73 us through
MPI (both receiving into pooled buffers; ``bench_mpi``'s ``ppermute`` rows).  In a
pipeline the difference stayed within this machine's noise (``docs/parallelism.md``).
Where a group's members outnumber the cores they may run on, its moves stay with MPI:
a waiting member's polls then take the core from the member it waits for (4 ranks
on 2 cores, ``bench_mpi``'s ring shift, alternating runs: 237-247 us through the
outboxes against 83-97 us through MPI at 32 KiB, 271-432 against 159-319 us at 256
KiB).

Each member of a communicator that uses it has an *outbox* in one MPI-3 shared
window: :data:`SLOTS` slots of the largest message (``SPMD_MPI_SHM_MAX_BYTES``, as
:mod:`spmd.collectives.mpi.shm`), and per slot a *key* and a length (written by the
owner) and a *read mark* (written by the message's reader).  A key is one 8-byte
word, ``number * members + destination``, ``number`` counting the owner's messages
to that destination from 1: every key is new, so a reader never takes an old
message for the one it waits for, and a key is written and read whole.

- A send takes a slot of the sender's outbox whose last message has been read;
  copies the message in; ``Win.Sync``; publishes the key; and returns: the receiver
  copies the message out when it gets to it.  A send never waits for a reader: with
  every slot still unread, the message goes by MPI instead (``Isend`` of a copy,
  tagged with its number).  A sender waiting for a slot could wait for a member
  that itself waits inside an MPI call for the sender (a blocking collective, the
  checking mode's comparison): MPI's progress runs inside such calls, ours not.
- A receive posts an MPI receive for its message's number (in case it comes that
  way) and waits in a queue per source (matched in order, as MPI's).  It completes
  when the source's outbox holds its key -- the MPI receive cancelled (nothing can
  have matched it), ``Win.Sync``, the length checked against the receive's (ranks
  that disagree on a shape get an error, not some of the bytes), the bytes copied
  out, ``Win.Sync``, the slot marked read -- or when its MPI receive completes.

A waiting member polls (yielding its core after a few polls: ranks may outnumber
cores) and meanwhile completes every posted receive whose message has come.  A
receive posted and never waited for (its program raised between the start and the
wait) stays in its queue and takes its message when it comes, as an MPI receive
would.  The waits run inside the caller's
:class:`spmd.collectives.mpi.control.Collective`: past the deadline, the
watchdog's report.

Which moves take this path is decided from what every member knows alike (the
message's size, the communicator, the settings), so both ends of a message take
the same path and the messages between two members keep their order on each.
The window is made at the first move in range over a communicator, on every
member at the same call, where the members have a core each (the union of their
affinity masks: :func:`_cores`), share the node and have room in /dev/shm
(:func:`spmd.collectives.mpi.shm.shared_by_all`).
"""

from __future__ import annotations

import collections
import os
import threading
import time

import numpy as np

from spmd.collectives.mpi import shm as mpi_shm
from spmd.collectives.mpi.control import control
from spmd.errors import ProgramMismatchError

SLOTS = 4        # an outbox's slots: messages in it not read yet, per member
# The header, in 8-byte words: keys and lengths on the owner's 64-byte lines, read
# marks (written by readers) from the next line on.
_MARKS = -(-2 * SLOTS // 8) * 8
_HEADER = 8 * (_MARKS + -(-SLOTS // 8) * 8)
_SPINS = 64      # polls before a waiting member yields its core
_TAGS = 1 << 15  # MPI's tags (at least 32767): a message's number within its pair


class Channel:
    """One communicator's outboxes (see the module docstring)."""

    def __init__(self, comm, slot: int):
        from mpi4py import MPI

        self.comm, self.n, self.me, self.slot = comm, comm.Get_size(), comm.Get_rank(), slot
        self.win = MPI.Win.Allocate_shared(_HEADER + SLOTS * slot, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch: Win.Sync needs one
        boxes = [np.frombuffer(self.win.Shared_query(r)[0], np.uint8) for r in range(self.n)]
        boxes[self.me][:] = 0  # no key is 0; the pages are faulted in now
        words = [b[:_HEADER].view(np.int64) for b in boxes]
        self.keys = [w[:SLOTS] for w in words]
        self.lens = [w[SLOTS:2 * SLOTS] for w in words]
        self.marks = [w[_MARKS:_MARKS + SLOTS] for w in words]
        self.data = [b[_HEADER:_HEADER + SLOTS * slot].reshape(SLOTS, slot) for b in boxes]
        self.next = 0                       # the outbox slot a send tries first
        self.held = [0] * SLOTS             # the key last put in each of its slots
        self.sent = [0] * self.n            # messages sent to each member
        self.expected = [0] * self.n        # receives posted from each member
        self.posted = {}                    # source -> deque of receives not complete
        self.moved = [0, 0]                 # sends through the outbox, by MPI
        self.status = MPI.Status()
        # A started move's test() runs outside any collective (between a program's
        # equations), so another thread's move over this group may run meanwhile.
        self.lock = threading.Lock()
        self.win.Sync()
        comm.Barrier()  # every outbox zeroed before any member reads one
        self.win.Sync()

    def send(self, data: np.ndarray, dst: int):
        """Send ``data`` (contiguous bytes, at most a slot) to member ``dst`` without
        waiting for it: into a free slot of this member's outbox (returns None), or, if
        every slot holds a message not read yet, by MPI from a copy (returns the
        request and the copy: the caller keeps both until the request completes).
        A send never waits for a reader, so no member waits for another that waits
        in an MPI call."""
        with self.lock:
            return self._send(data, dst)

    def _send(self, data: np.ndarray, dst: int):
        me = self.me
        self.sent[dst] += 1
        number = self.sent[dst]
        marks, held = self.marks[me], self.held
        for k in range(SLOTS):
            q = (self.next + k) % SLOTS
            if not held[q] or marks[q] == held[q]:
                break
        else:
            copy = data.copy()
            self.moved[1] += 1
            return self.comm.Isend(copy, dest=dst, tag=number % _TAGS), copy
        self.next = (q + 1) % SLOTS
        self.win.Sync()  # (the slot's reader is done with it before it is written)
        self.data[me][q, :data.size] = data
        self.lens[me][q] = data.size
        self.win.Sync()  # the bytes before the key
        self.keys[me][q] = held[q] = number * self.n + dst
        self.moved[0] += 1
        return None

    def receive(self, src: int, out: np.ndarray) -> "Receive":
        """Post a receive of member ``src``'s next message to this member into ``out``
        (C-contiguous); complete it with its ``Test``/``Wait``.  An MPI receive is
        posted with it, for the case its sender found its outbox full (cancelled when
        the message comes through the outbox)."""
        with self.lock:
            self.expected[src] += 1
            number = self.expected[src]
            flat = out.reshape(-1).view(np.uint8)
            r = Receive(self, src, number, out,
                        self.comm.Irecv(flat, source=src, tag=number % _TAGS))
            self.posted.setdefault(src, collections.deque()).append(r)
            return r

    def progress(self) -> None:
        """Complete every posted receive whose message has come, in each source's order."""
        with self.lock:
            self._progress()

    def _progress(self) -> None:
        for src, queue in self.posted.items():
            while queue:
                r = queue[0]
                key = r.number * self.n + self.me
                keys = self.keys[src]
                for q in range(SLOTS):
                    if keys[q] == key:
                        self._take(r, src, q, key)
                        break
                else:
                    if not r.req.Test(self.status):
                        break
                    size = self.status.Get_count()  # (bytes: the receive's type)
                    if size != r.out.nbytes:
                        r.error = _mismatch(r.out.nbytes, src, size)
                queue.popleft()
                r.done, r.req = True, None

    def _take(self, r: "Receive", src: int, q: int, key: int) -> None:
        r.req.Cancel()  # (nothing is sent for it by MPI: it cannot have matched)
        r.req.Wait()
        self.win.Sync()  # the key before the bytes
        size = int(self.lens[src][q])
        out = r.out.reshape(-1).view(np.uint8)
        if size == out.size:
            out[:] = self.data[src][q, :size]
        else:
            r.error = _mismatch(out.size, src, size)
        self.win.Sync()  # the bytes read before the slot is given back
        self.marks[src][q] = key

    def wait(self, r: "Receive") -> None:
        polls = 0
        while True:
            self.progress()
            if r.done:
                return
            polls += 1
            if polls > _SPINS:
                # Ranks may outnumber cores: give the core to the member being waited for.
                if polls < 100 * _SPINS:
                    os.sched_yield()
                else:
                    time.sleep(50e-6)
            self.win.Sync()

    def free(self) -> None:
        for queue in self.posted.values():
            for r in queue:  # (receives never completed: tests that raised)
                r.req.Cancel()
                r.req.Wait()
        self.win.Unlock_all()
        self.win.Free()


def _mismatch(expected: int, src: int, got: int) -> str:
    return (f"ppermute: this member expected {expected} bytes from member {src} of its "
            f"group and got {got}: the ranks run different programs (run with "
            "SPMD_CHECK_COLLECTIVES=1 to find the first collective they disagree on)")


class Receive:
    """A posted receive, with an MPI request's ``Test``/``Wait``."""

    __slots__ = ("chan", "src", "number", "out", "req", "done", "error")

    def __init__(self, chan: Channel, src: int, number: int, out: np.ndarray, req):
        self.chan, self.src, self.number, self.out, self.req = chan, src, number, out, req
        self.done, self.error = False, None

    def Test(self) -> bool:  # noqa: N802  (an MPI request's name)
        if not self.done:
            self.chan.progress()
        return self.done

    def Wait(self) -> None:  # noqa: N802
        if not self.done:
            self.chan.wait(self)
        if self.error is not None:
            raise ProgramMismatchError(self.error)


_channels: dict = {}  # ranks -> Channel, or None where the members do not share a node


def channel_for(ranks: tuple, comm, nbytes: int):
    """The :class:`Channel` for a message of ``nbytes`` between members of ``comm``, or
    None (MPI's own calls).  The first call for a communicator is collective over its
    members (it makes the window); every member calls it with the same arguments at
    the same point (a ``ppermute``'s, whose operand has one shape on every member)."""
    if len(ranks) < 2 or nbytes == 0:
        return None
    lo, hi = mpi_shm.size_range()
    if hi == 0 or not lo <= nbytes <= hi:
        return None
    chan = _channels.get(ranks, False)
    if chan is False:
        slot = -(-hi // 64) * 64
        ctl = control(ranks)
        # (The same union on every member: all of them make the window, or none.)
        cores = frozenset().union(*ctl.allgather(_cores()))
        shared = len(ranks) <= len(cores) and mpi_shm.shared_by_all(comm, ctl, ranks,
                                                                     slot, SLOTS)
        chan = _channels[ranks] = Channel(comm, slot) if shared else None
    # (A channel made before the slot setting was read again -- tests -- keeps its
    # slot: larger messages go by MPI, on every member alike.)
    return chan if chan is None or nbytes <= chan.slot else None


def _cores() -> frozenset:
    """The cores this process may run on (its affinity mask; every core where there is
    none)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity masks: macOS)
        return frozenset(range(os.cpu_count() or 1))


def reset() -> None:
    """Forget the channels (tests; every member calls it at the same point, with no
    message in flight)."""
    for chan in _channels.values():
        if chan is not None:
            chan.free()
    _channels.clear()
